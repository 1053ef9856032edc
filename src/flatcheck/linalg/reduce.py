"""Float64 row sums of large float32 blocks without a float64 copy of the block."""

from __future__ import annotations

import torch
from torch import Tensor

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
