"""Closed-form head trace against the dense float64 autograd Hessian of the head.

Ground truth is torch.func.hessian of the whole-sample-set loss as a function of the head's
parameters alone (the rest of the model frozen), so the tolerance is float64 rounding:
a relative 1e-10 leaves five orders of magnitude above eps for sums of a few thousand terms.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.utils.data import TensorDataset

from conftest import make_case
from flatcheck.backends import ParamLayout, Problem, create_backend
from flatcheck.backends.base import model_mode
from flatcheck.data.batches import SampleSet
from flatcheck.probes._head import HeadError, head_statistics, logit_curvature, resolve_head
from flatcheck.losses import output_hessian_factors, per_sample_loss
from flatcheck.models.spec import LossSpec
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options

RTOL = 1e-10
C = 5


class Scaled(nn.Module):
    """A model whose logits are a transformed head output: closed forms must refuse it."""

    def __init__(self, inner: nn.Module, factor: float = 2.0):
        super().__init__()
        self.inner, self.factor = inner, factor

    def forward(self, x):
        return self.inner(x) * self.factor


class TokenHead(nn.Module):
    """A Linear applied to every token; logits either averaged over tokens or read off token 0."""

    def __init__(self, bias: bool, reduce: str):
        super().__init__()
        self.embed = nn.Linear(8, 7)
        self.head = nn.Linear(7, C, bias=bias)
        self.reduce = reduce

    def forward(self, x):  # x (B, 1, 3, 4) → 3 tokens of width 8
        tokens = torch.relu(self.embed(torch.cat([x[:, 0], x[:, 0].flip(-1) * 0.5], -1)))
        z = self.head(tokens)
        return z.mean(1) if self.reduce == "mean" else z[:, 0]


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
        # conftest.dense: torch.func is off through train-mode BatchNorm, plain autograd is not
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


@pytest.mark.parametrize("loss", ["cross_entropy", "mse", "sigmoid_mse"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", list(MODELS))
def test_closed_forms_equal_dense_head_hessian(kind, bias, loss):
    problem = build(kind, bias, loss, x_shape=(1, 6, 6))
    backend = create_backend("autograd", problem)
    head = resolve_head(problem.model, None)  # auto-detected: the last Linear / 1x1 conv
    assert head.name == HEADS[kind]
    stats = head_statistics(backend, head, diagonal=True)
    truth = dense_head(problem, head.name)
    assert close(stats.weight_trace, truth["weight_trace"])
    if bias:
        assert close(stats.bias_trace, truth["bias_trace"])
    else:
        assert stats.bias_trace is None
    assert close(stats.kappa, truth["kappa"])
    scale = truth["per_class"].abs().max().item()
    assert (stats.class_kappa - truth["per_class"]).abs().max().item() <= RTOL * scale
    assert (stats.class_trace - truth["class_trace"]).abs().max().item() <= RTOL * truth["class_trace"].abs().max()
    closed_diag = torch.cat([stats.weight_diagonal.reshape(-1)]
                            + ([stats.bias_diagonal] if bias else []))
    assert (closed_diag - truth["diagonal"]).abs().max().item() <= RTOL * truth["diagonal"].abs().max().item()


def test_label_smoothing_uses_the_cross_entropy_curvature():
    problem = build("gap_cnn", True, "label_smoothing")
    stats = head_statistics(create_backend("autograd", problem), resolve_head(problem.model, None))
    truth = dense_head(problem, "7")
    assert close(stats.weight_trace, truth["weight_trace"]) and close(stats.kappa, truth["kappa"])


@pytest.mark.parametrize("loss", ["cross_entropy", "label_smoothing", "mse", "sigmoid_mse"])
def test_logit_curvature_matches_the_output_hessian_factors(loss):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, C, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, C, (7,), generator=g)
    spec = LossSpec(loss)
    U, lam = output_hessian_factors(z, y, spec)
    A = torch.einsum("bck,bk,bdk->bcd", U, lam, U)
    a, q = logit_curvature(z, y, spec)
    rebuilt = torch.diag_embed(a) - (0 if q is None else q[:, :, None] * q[:, None, :])
    eps = torch.finfo(torch.float64).eps
    assert (rebuilt - A).abs().max().item() <= 8 * eps * A.abs().max().item()


def test_probe_reports_weight_and_bias_and_kappa():
    problem = build("mlp", True, x_shape=(1, 6, 6))
    ctx = ProbeContext(backend=create_backend("autograd", problem), seed=0)
    result = create_probe("head-trace").run(ctx, parse_options("head-trace", {}))
    truth = dense_head(problem, "5")
    d = result.details
    assert result.stderr is None and result.matvecs == 0 and result.seed is None
    assert close(result.value, truth["weight_trace"] + truth["bias_trace"])
    assert close(d["weight_trace"], truth["weight_trace"]) and close(d["bias_trace"], truth["bias_trace"])
    assert close(d["relative_flatness"], truth["kappa"])
    assert set(d["layers"]) == {"5.weight", "5.bias"}
    assert d["parameters"] == C * 8 + C


def test_verify_matches_closed_form_in_float64():
    problem = build("gap_cnn", True)
    ctx = ProbeContext(backend=create_backend("autograd", problem), seed=0)
    result = create_probe("head-trace").run(ctx, parse_options("head-trace", {"verify": True}))
    check = result.details["verify"]
    assert check["coordinates"] == check["total_coordinates"] == C * 6 + C == result.matvecs
    assert not check["subset"] and result.seed is None
    assert check["relative_difference"] <= RTOL
    assert close(check["closed_form"], result.value)


def test_verify_subset_checks_the_same_coordinates():
    problem = build("conv_head", False)
    ctx = ProbeContext(backend=create_backend("autograd", problem), seed=4)
    opts = parse_options("head-trace", {"verify": True, "verify_max": 7, "verify_block": 3})
    check = create_probe("head-trace").run(ctx, opts).details["verify"]
    assert check["subset"] and check["coordinates"] == 7 and check["total_coordinates"] == C * 6
    assert check["relative_difference"] <= RTOL


def test_per_token_head_averaged_after_is_accepted():
    problem = make_problem(TokenHead(bias=True, reduce="mean"), x_shape=(1, 3, 4))
    stats = head_statistics(create_backend("autograd", problem), resolve_head(problem.model, None, "head"))
    truth = dense_head(problem, "head")
    assert close(stats.weight_trace, truth["weight_trace"]) and close(stats.kappa, truth["kappa"])


@pytest.mark.parametrize("model", [
    lambda: TokenHead(bias=True, reduce="first"),  # logits from one token: not affine in the mean
    lambda: Scaled(mlp(True)),  # post-processed logits
    lambda: nn.Sequential(nn.Conv2d(1, 6, 3), nn.ReLU(), nn.Conv2d(6, C, 1), nn.ReLU(),  # SqueezeNet-like
                          nn.AdaptiveAvgPool2d(1), nn.Flatten()),
])
def test_logits_not_affine_in_head_features_are_refused(model):
    torch.manual_seed(0)
    m = model()
    shape = (1, 3, 4) if isinstance(m, TokenHead) else (1, 6, 6)
    problem = make_problem(m, x_shape=shape)
    head = resolve_head(problem.model, None)
    with pytest.raises(HeadError, match=r"needs logits = W·φ \+ b for head"):
        head_statistics(create_backend("autograd", problem), head)


def test_float32_reconstruction_passes_on_a_bigger_head():
    """The rounding bound must not reject an honest float32 model with wide features."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 512), nn.ReLU(), nn.Linear(512, 100)).eval()
    X, Y = torch.randn(64, 1, 6, 6) * 10, torch.randint(0, 100, (64,))
    samples = SampleSet(TensorDataset(X, Y), samples=64, batch_size=32)
    problem = Problem(model, LossSpec(), samples, ParamLayout.from_model(model))
    stats = head_statistics(create_backend("autograd", problem), resolve_head(model, None))
    assert stats.samples == 64 and stats.weight_trace > 0


def test_head_follows_the_bn_mode():
    """Train-mode BatchNorm changes φ; the closed form must see the same forwards as autograd."""
    case = make_case("cnn", bn_mode="train")
    stats = head_statistics(create_backend("autograd", case.problem), resolve_head(case.model, None))
    truth = dense_head(case.problem, "7")
    assert close(stats.weight_trace, truth["weight_trace"]) and close(stats.bias_trace, truth["bias_trace"])
