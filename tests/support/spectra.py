"""Small foreign models in float64 whose Hessians are taken densely: the ground truth the
certified eigenvalue bounds (linalg/certify.py, linalg/warm_block.py) are measured against."""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from tests.support.dense import DenseOperator as Dense  # noqa: F401  the operator these tests take


class Attention(nn.Module):
    """One head of self-attention over a short sequence, mean-pooled into a linear head."""

    def __init__(self, d_in: int = 3, d: int = 4, classes: int = 3):
        super().__init__()
        self.embed, self.q, self.k, self.v = nn.Linear(d_in, d), nn.Linear(d, d, bias=False), \
            nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        h = self.embed(x)
        a = torch.softmax(self.q(h) @ self.k(h).transpose(1, 2) / math.sqrt(h.shape[-1]), dim=-1)
        return self.head((h + a @ self.v(h)).mean(1))


class Twin(nn.Module):
    """Two tanh MLPs on the same input, outputs summed; built as near-copies, their Hessian
    blocks nearly share a top eigenvalue."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
        self.b = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))

    def forward(self, x):
        x1, x2 = x[:, :3], x[:, 3:]
        return torch.cat([self.a(x1), self.b(x2)], 1)


def small_problem(arch: str, seed: int) -> tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]:
    """(loss of the flat float64 parameters, the initial flat parameters) of a small `arch`
    (mlp, cnn, transformer, twin) on random data drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if arch == "mlp":
        model, x = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)), torch.randn(24, 4, generator=g)
        y = torch.randint(0, 3, (24,), generator=g)
    elif arch == "cnn":
        model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(12, 3))
        x, y = torch.randn(16, 1, 6, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    elif arch == "transformer":
        model, x = Attention(), torch.randn(16, 3, 3, generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
    else:  # twin: the second copy's weights and data are the first's, changed by 1e-3 relative
        model = Twin()
        with torch.no_grad():
            for pa, pb in zip(model.a.parameters(), model.b.parameters()):
                pb.copy_(pa * (1 + 1e-3 * torch.randn(pa.shape, generator=g)))
        x1 = torch.randn(24, 3, generator=g)
        x = torch.cat([x1, x1 * (1 + 1e-3 * torch.randn(x1.shape, generator=g))], 1)
        y = torch.randint(0, 2, (24,), generator=g)
    model = model.double()
    x = x.double()
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss(w):
        params, at = {}, 0
        for n, s in zip(names, shapes):
            params[n] = w[at:at + s.numel()].reshape(s)
            at += s.numel()
        out = torch.func.functional_call(model, params, (x,))
        if arch == "twin":  # one loss per copy, so the copies' curvature blocks are separate
            return nn.functional.cross_entropy(out[:, :2], y) + nn.functional.cross_entropy(out[:, 2:], y)
        return nn.functional.cross_entropy(out, y)

    return loss, flat


def hessian(loss: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """The dense Hessian of `loss` at `w`, symmetrised."""
    H = torch.autograd.functional.hessian(loss, w)
    return (H + H.T) / 2
