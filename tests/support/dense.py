"""Dense float64 ground truth: tiny models, their data, and their dense Hessian and GGN matrices."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.utils.data import TensorDataset

from flatcheck.backends import ParamLayout, create_backend
from flatcheck.data.batches import SampleSet
from flatcheck.losses import apply_output_hessian, per_sample_loss
from flatcheck.models.spec import LossSpec
from flatcheck.problem import Problem, model_mode


def tiny_mlp(num_classes: int = 4) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 10), nn.Tanh(), nn.Linear(10, 8), nn.ReLU(),
                         nn.Linear(8, num_classes)).double()


def tiny_cnn(num_classes: int = 4) -> nn.Module:
    torch.manual_seed(2)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 6, 3), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, num_classes),
    ).double()


MODELS = {"mlp": tiny_mlp, "cnn": tiny_cnn}


@dataclass
class Case:
    model: nn.Module
    problem: Problem
    X: torch.Tensor
    Y: torch.Tensor

    def backend(self, name: str = "autograd"):
        return create_backend(name, self.problem)


def make_case(kind: str, *, loss: str = "cross_entropy", n: int = 23, batch_size: int = 10,
              bn_mode: str = "eval", seed: int = 0) -> Case:
    model = MODELS[kind]()
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 1, 3, 4, generator=g, dtype=torch.float64) if kind == "mlp" else \
        torch.randn(n, 1, 6, 6, generator=g, dtype=torch.float64)
    Y = torch.randint(0, 4, (n,), generator=g)
    if kind == "cnn":
        # put the BN running statistics somewhere other than (0, 1) so eval ≠ train mode
        bn = model[1]
        bn.running_mean.copy_(torch.linspace(-0.5, 0.5, 4))
        bn.running_var.copy_(torch.linspace(0.5, 2.0, 4))
    samples = SampleSet(TensorDataset(X, Y), samples=n, batch_size=batch_size, dtype=torch.float64)
    spec = LossSpec(loss)
    problem = Problem(model=model, loss=spec, samples=samples, layout=ParamLayout.from_model(model), bn_mode=bn_mode)
    return Case(model, problem, X, Y)


def _fingerprint(case: Case, reverse: bool) -> str:
    """Everything the dense matrices depend on: the module classes and their printed form, every
    parameter's and buffer's bytes, the differentiated parameters, the loss, the batch-norm mode
    and every batch's inputs, targets and weight."""
    model, problem = case.model, case.problem
    h = hashlib.sha256()
    for text in (repr(model), [f"{type(m).__module__}.{type(m).__qualname__}" for m in model.modules()],
                 problem.layout.names, problem.layout.sizes, repr(problem.loss), problem.bn_mode, reverse):
        h.update(repr(text).encode())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(name.encode() + repr((t.dtype, tuple(t.shape))).encode() + t.detach().cpu().contiguous().numpy().tobytes())
    for b in problem.samples:
        for t in (b.x, b.y):
            h.update(repr((t.dtype, tuple(t.shape))).encode() + t.detach().cpu().contiguous().numpy().tobytes())
        h.update(repr(b.weight).encode())
    return h.hexdigest()


_DENSE: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


def dense(case: Case, reverse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense float64 Hessian and GGN of L(θ) = (1/N) Σ ℓ_n, computed on the whole set at once.

    reverse: the Hessian by reverse-over-reverse autograd even in eval mode (see below).
    Many tests ask for the truth of the same case: it is kept per process under a fingerprint of
    all it depends on (so a test that changes a weight gets its own), and handed out as copies."""
    key = _fingerprint(case, reverse)
    if key not in _DENSE:
        _DENSE[key] = _dense(case, reverse)
    H, G = _DENSE[key]
    return H.clone(), G.clone()


def _symmetric(H: torch.Tensor) -> bool:
    """H equals its transpose to round-off of its largest entry, in its own dtype (the layer-norm
    error is percents of it)."""
    return bool((H - H.T).abs().max() <= 100 * torch.finfo(H.dtype).eps * H.abs().max().clamp_min(1e-300))


def _dense(case: Case, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    model, layout, problem = case.model, case.problem.layout, case.problem
    buffers = dict(model.named_buffers())
    theta0 = torch.cat([p.detach().reshape(-1) for p in layout.params(model)])

    def unflat(theta):
        return dict(zip(layout.names, (t.view(s) for t, s in zip(theta.split(layout.sizes), layout.shapes))))

    def logits_of(theta, x):
        return functional_call(model, (unflat(theta), buffers), (x,))

    # batch statistics (train mode) are per batch, so ground truth follows the batching
    with model_mode(model, problem.bn_mode):
        def total_loss(theta):
            out = 0
            for b in problem.samples:
                out = out + per_sample_loss(logits_of(theta, b.x), b.y, problem.loss).mean() * b.weight
            return out

        # torch.func's second derivative through batch norm with batch statistics is off
        # by ~1.6% (torch 2.14.1, checked against finite differences on a tanh CNN), so
        # train mode uses plain autograd; eval mode the vectorised (fast) transform.
        # torch.func.hessian through an affine layer norm is asymmetric and wrong in its ∂²/∂w∂x
        # block (docs/internals.md): a Hessian that comes out asymmetric is taken again by
        # reverse-over-reverse, so no caller has to know which models need it
        H = None if problem.bn_mode == "train" or reverse else torch.func.hessian(total_loss)(theta0)
        if H is None or not _symmetric(H):
            H = torch.autograd.functional.hessian(total_loss, theta0, vectorize=True)
        G = torch.zeros_like(H)
        for b in problem.samples:
            J = torch.func.jacrev(lambda t: logits_of(t, b.x))(theta0)  # (B, C, P)
            out = logits_of(theta0, b.x)
            AJ = apply_output_hessian(out, b.y, problem.loss, J.permute(2, 0, 1)).permute(1, 2, 0)
            G += torch.einsum("bcp,bcq->pq", J, AJ) * (b.weight / b.x.shape[0])
    return H, G


def block_traces(M: torch.Tensor, layout) -> dict[str, float]:
    """The traces of M's diagonal blocks, one per layout group (a layer's parameters)."""
    out: dict[str, float] = {}
    start = 0
    for size, group in zip(layout.sizes, layout.groups):
        out[group] = out.get(group, 0.0) + M.diagonal()[start : start + size].sum().item()
        start += size
    return out


class DenseOperator:
    """A dense symmetric matrix as an operator, for testing estimators on their own."""

    def __init__(self, A: torch.Tensor):
        self.A, self.dim, self.dtype, self.device, self.matvecs = A, A.shape[0], A.dtype, A.device, 0

    def matmat(self, V):
        self.matvecs += V.shape[0]
        return V @ self.A


class Mixer(nn.Module):
    """The ops transformers and convnets bring, each moving with θ: max pooling, leaky ReLU,
    constant padding, layer norm, softmax attention (matrix products of two moving tensors),
    GELU, hardtanh with its own bounds, concatenation, a division by a moving tensor and a
    gather at an index the moving values choose."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.ln = nn.LayerNorm(4)
        self.qkv = nn.Linear(4, 12)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        h = F.max_pool2d(F.leaky_relu(self.conv(x), 0.1), 2)  # (B, 4, 3, 3)
        h = F.pad(h, (0, 1), value=0.3)  # padding with a constant is affine: (B, 4, 3, 4)
        t = self.ln(h.flatten(2).transpose(1, 2))  # (B, 12, 4)
        q, k, v = self.qkv(t).chunk(3, -1)
        o = torch.softmax(q @ k.transpose(1, 2) / 2.0, -1) @ v
        # the token picked by an index that the moving values choose: the index stays still
        top = o.gather(1, o.sum(-1).argmax(1)[:, None, None].expand(-1, 1, o.shape[-1])).squeeze(1)
        z = torch.cat([o.mean(1) + top, F.hardtanh(t, -0.5, 0.7).mean(1)], -1)
        z = F.gelu(z) / (1 + z.pow(2).sum(-1, keepdim=True)).sqrt()
        return self.fc(z)


def mixer_case(n: int = 11, batch_size: int = 4):
    model = Mixer().double()
    g = torch.Generator().manual_seed(5)
    X = torch.randn(n, 1, 6, 6, generator=g, dtype=torch.float64)
    Y = torch.randint(0, 4, (n,), generator=g)
    samples = SampleSet(TensorDataset(X, Y), samples=n, batch_size=batch_size, dtype=torch.float64)
    problem = Problem(model, LossSpec("cross_entropy"), samples, ParamLayout.from_model(model))
    return Case(model, problem, X, Y)
