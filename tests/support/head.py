"""Models with a classifier head, and the dense float64 Hessian of the loss in the head's
parameters alone (the rest of the model frozen): ground truth for the head probes.

RTOL is float64 rounding: a relative 1e-10 leaves five orders of magnitude above eps for sums
of a few thousand terms."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.utils.data import TensorDataset

from flatcheck.backends import ParamLayout
from flatcheck.data.batches import SampleSet
from flatcheck.losses import per_sample_loss
from flatcheck.models.spec import LossSpec
from flatcheck.problem import Problem, model_mode


RTOL = 1e-10
C = 5


def gap_cnn(bias: bool) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 6, 3),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, C, bias=bias))


def conv_head(bias: bool) -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3), nn.Tanh(),
                         nn.Conv2d(6, C, 1, bias=bias), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def mlp(bias: bool) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 10), nn.Tanh(), nn.Linear(10, 8), nn.ReLU(),
                         nn.Linear(8, C, bias=bias))


def vit(bias: bool) -> nn.Module:
    timm = pytest.importorskip("timm")
    from timm.layers import set_fused_attn

    set_fused_attn(False)  # the fused CPU kernel has no double backward
    model = timm.create_model("test_vit", pretrained=False, num_classes=C, img_size=6, patch_size=3, in_chans=1,
                              embed_dim=8, depth=1, num_heads=2)
    if not bias:
        model.head = nn.Linear(model.head.in_features, C, bias=False)
    return model


MODELS = {"gap_cnn": gap_cnn, "conv_head": conv_head, "mlp": mlp, "vit": vit}
HEADS = {"gap_cnn": "7", "conv_head": "4", "mlp": "5", "vit": "head"}


def make_problem(model: nn.Module, loss: str = "cross_entropy", n: int = 19, batch_size: int = 8, seed: int = 0,
                 x_shape=(1, 6, 6), params: tuple[str, ...] = ()) -> Problem:
    model = model.double().eval()
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, *x_shape, generator=g, dtype=torch.float64)
    Y = torch.randint(0, C, (n,), generator=g)
    samples = SampleSet(TensorDataset(X, Y), samples=n, batch_size=batch_size, dtype=torch.float64)
    return Problem(model=model, loss=LossSpec(loss), samples=samples, layout=ParamLayout.from_model(model, params))


def build(kind: str, bias: bool, loss: str = "cross_entropy", **kw) -> Problem:
    torch.manual_seed(3)
    return make_problem(MODELS[kind](bias), loss, **kw)


def dense_head(problem: Problem, head: str) -> dict:
    """Dense Hessian of L w.r.t. the head's (weight, bias), split into the quantities under test."""
    model = problem.model
    module = dict(model.named_modules())[head]
    names = [f"{head}.weight"] + ([f"{head}.bias"] if module.bias is not None else [])
    params = dict(model.named_parameters())
    frozen = {n: p.detach() for n, p in params.items() if n not in names}
    frozen.update(dict(model.named_buffers()))
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]
    theta0 = torch.cat([params[n].detach().reshape(-1) for n in names])

    def total(theta):
        chosen = dict(zip(names, (t.view(s) for t, s in zip(theta.split(sizes), shapes))))
        out = 0
        for b in problem.samples:
            z = functional_call(model, (chosen, frozen), (b.x,))
            out = out + per_sample_loss(z, b.y, problem.loss).mean() * b.weight
        return out

    with model_mode(model, problem.bn_mode):
        # as in support.dense: torch.func is off through train-mode BatchNorm, plain autograd is not
        H = (torch.autograd.functional.hessian(total, theta0, vectorize=True) if problem.bn_mode == "train"
             else torch.func.hessian(total)(theta0))
    W = params[names[0]].detach().reshape(shapes[0][0], -1)
    c, d = W.shape
    HW = H[: c * d, : c * d].reshape(c, d, c, d)
    block_traces = torch.einsum("sdtd->st", HW)  # Tr(H_{s,s'})
    per_class = ((W @ W.T) * block_traces).sum(1)
    return {
        "weight_trace": HW.diagonal(dim1=0, dim2=2).diagonal().sum().item(),
        "bias_trace": H[c * d :, c * d :].trace().item() if len(names) == 2 else None,
        "kappa": per_class.sum().item(),
        "per_class": per_class,
        "class_trace": block_traces.diagonal(),
        "diagonal": H.diagonal(),
    }


def close(a: float, b: float, rtol: float = RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(b), 1e-300)
