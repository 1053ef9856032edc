"""Seeded random probe vectors that are identical on every device."""

from __future__ import annotations

import torch
from torch import Tensor


# Which way rademacher_signs turns a seed into signs, stored beside the per-probe values a
# gate pairs: two reports pair only when their probes are the same vectors, and a report of a
# flatcheck that drew one int8 per sign (no such field: stream 1) holds other vectors for the
# same seed than this one (stream 2, packed bits).
SIGN_STREAM = 2


def rademacher_signs(k: int, dim: int, generator: torch.Generator, *, device) -> Tensor:
    """k Rademacher vectors of length dim as int8 ±1, shape (k, dim).

    The generator runs on the CPU, so the same seed gives the same probes on CPU and GPU; it
    draws packed bits, 32 signs a draw, which are unpacked where the probes are used. One
    draw per sign made the CPU the bottleneck of a GPU run: 100 probes of an 86M-parameter
    model are 8.6G draws, most of a minute, against seconds of products.
    """
    words = torch.randint(-(2**31), 2**31, (k, -(-dim // 32)), generator=generator, dtype=torch.int32)
    packed = words.view(torch.uint8).to(device)  # the host's byte order, fixed before any move
    bits = (packed.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8, device=packed.device)) & 1
    signs = bits.view(torch.int8).reshape(k, -1)
    signs.mul_(2).sub_(1)
    return signs if signs.shape[1] == dim else signs[:, :dim].contiguous()


def rademacher(k: int, dim: int, generator: torch.Generator, *, dtype: torch.dtype, device) -> Tensor:
    """The vectors of `rademacher_signs` for the same generator state, in `dtype`."""
    return rademacher_signs(k, dim, generator, device="cpu").to(dtype=dtype, device=device)


def gaussian(k: int, dim: int, generator: torch.Generator, *, dtype: torch.dtype, device) -> Tensor:
    """k standard normal vectors of length dim, shape (k, dim), in `dtype` on `device`.

    Drawn in float32 on the CPU whatever `dtype` is: the same seed then gives the same starts
    on every device and in either precision, and a start direction needs no more digits than
    float32 has (a Krylov method orthonormalises it in the operator's precision). A float64
    draw and its cast take about four times as long, for digits no estimator uses.
    """
    return torch.randn(k, dim, generator=generator, dtype=torch.float32).to(dtype=dtype, device=device)
