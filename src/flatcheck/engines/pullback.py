"""VJPs of one output for a block of cotangents, by plain reverse mode."""

from __future__ import annotations

import torch
from torch import Tensor


def pullback(output: Tensor, inputs, cotangents: Tensor) -> list[Tensor]:
    """VJPs of `output` for a block of cotangents (k, *output.shape), one backward each.

    A plain loop rather than is_grads_batched (vmap over the backward): for small CNNs
    on CPU the batched backward runs at about half the loop's speed, and a loop is the
    obvious computation an oracle should make.
    """
    k = cotangents.shape[0]
    if not output.requires_grad:
        return [torch.zeros(k, *x.shape, dtype=x.dtype, device=x.device) for x in inputs]
    rows = []
    for i in range(k):
        grads = torch.autograd.grad(output, inputs, cotangents[i], retain_graph=True, allow_unused=True)
        rows.append([or_zeros(g, x) for g, x in zip(grads, inputs)])
    return [torch.stack(col) for col in zip(*rows)]


def or_zeros(g: Tensor | None, like: Tensor) -> Tensor:
    """An unused input's gradient (None from autograd) as the zeros it is."""
    return g if g is not None else torch.zeros_like(like)
