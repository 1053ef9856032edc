"""Seeded random probe vectors that are identical on every device."""

from __future__ import annotations

import torch
from torch import Tensor


def rademacher_signs(k: int, dim: int, generator: torch.Generator, *, device) -> Tensor:
    """k Rademacher vectors of length dim as int8 ±1, shape (k, dim).

    Drawn on the CPU from `generator` and then moved, so the same seed gives the same
    probes on CPU and GPU.
    """
    bits = torch.randint(0, 2, (k, dim), generator=generator, dtype=torch.int8)
    return bits.mul_(2).sub_(1).to(device)


def rademacher(k: int, dim: int, generator: torch.Generator, *, dtype: torch.dtype, device) -> Tensor:
    """The vectors of `rademacher_signs` for the same generator state, in `dtype`."""
    return rademacher_signs(k, dim, generator, device="cpu").to(dtype=dtype, device=device)


def gaussian(k: int, dim: int, generator: torch.Generator, *, dtype: torch.dtype, device) -> Tensor:
    return torch.randn(k, dim, generator=generator, dtype=torch.float64).to(dtype=dtype, device=device)
