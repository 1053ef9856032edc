"""Seeded random probe vectors that are identical on every device."""

from __future__ import annotations

import torch
from torch import Tensor


def rademacher(k: int, dim: int, generator: torch.Generator, *, dtype: torch.dtype, device) -> Tensor:
    """k Rademacher vectors of length dim, shape (k, dim).

    Drawn on the CPU from `generator` and then moved, so the same seed gives the same
    probes on CPU and GPU.
    """
    bits = torch.randint(0, 2, (k, dim), generator=generator, dtype=torch.int8)
    return bits.to(dtype).mul_(2).sub_(1).to(device)  # in place: one (k, dim) float block, not three


def rademacher_signs(k: int, dim: int, generator: torch.Generator, *, device) -> Tensor:
    """The same k vectors as `rademacher` with the same generator state, as int8 (4x smaller)."""
    bits = torch.randint(0, 2, (k, dim), generator=generator, dtype=torch.int8)
    return bits.mul_(2).sub_(1).to(device)


def gaussian(k: int, dim: int, generator: torch.Generator, *, dtype: torch.dtype, device) -> Tensor:
    return torch.randn(k, dim, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)
