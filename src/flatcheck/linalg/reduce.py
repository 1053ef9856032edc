"""Float64 row sums of large float32 blocks without a float64 copy of the block, and the error
for products found not finite."""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import InputError

_COLUMNS = 2**18  # per chunk: k·2¹⁸ float64 numbers (2 MiB per row) instead of k·P


def rowsum64(block: Tensor) -> Tensor:
    """block (k, n) → (k,) sums accumulated in float64.

    torch's sum(dtype=float64) first converts the whole input to a float64 copy (254 MiB
    for a 3 × 11M float32 block), which would double an estimator's peak memory.
    """
    if block.dtype == torch.float64:
        return block.sum(1)
    out = torch.zeros(block.shape[0], dtype=torch.float64, device=block.device)
    for i in range(0, block.shape[1], _COLUMNS):
        out += block[:, i : i + _COLUMNS].sum(1, dtype=torch.float64)
    return out


def all_finite(block: Tensor) -> bool:
    """Whether every entry of `block` is finite, without a bool copy of it in the common case:
    a NaN or an infinity anywhere makes the sum non-finite, and a finite sum leaves none; only
    a non-finite sum (one, or an overflow of finite entries) is checked entry by entry. The sum
    in the block's own dtype: its value is not used, and a float64 one (rowsum64) takes a
    conversion pass as long again over every product of an 11M-parameter model."""
    return bool(torch.isfinite(block.sum())) or bool(torch.isfinite(block).all())


def not_finite(dtype: torch.dtype) -> InputError:
    """The error for curvature products that are not finite: a finer dtype is advised only where
    the run did not already use the finest (in float64 the model's loss or its derivatives are
    NaN or overflow at these weights, which no dtype flag mends)."""
    if dtype == torch.float64:
        return InputError("curvature products are not finite even in float64: the loss or its derivatives "
                          "are NaN or overflow at these weights")
    return InputError("curvature products are not finite (overflow?); try --dtype float64")
