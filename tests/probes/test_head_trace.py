"""Closed-form head trace against the dense float64 autograd Hessian of the head.

Ground truth is torch.func.hessian of the whole-sample-set loss as a function of the head's
parameters alone (the rest of the model frozen), so the tolerance is float64 rounding:
a relative 1e-10 leaves five orders of magnitude above eps for sums of a few thousand terms.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.support.dense import make_case
from flatcheck.backends import ParamLayout, create_backend
from flatcheck.problem import Problem
from flatcheck.data.batches import SampleSet
from flatcheck.probes._head import HeadError, head_statistics, logit_curvature, resolve_head
from flatcheck.losses import output_hessian_factors
from flatcheck.models.spec import LossSpec
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options
from tests.support.head import C, HEADS, MODELS, RTOL, build, close, dense_head, make_problem, mlp


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


@pytest.mark.parametrize("options, said, flags", [
    ({"verify_max": 0}, "verify_max must be a positive integer", "--verify-max must be a positive integer"),
    ({"head": "nothing"}, "head names no module of", "--head names no module of"),
])
def test_an_option_refusal_names_the_option_as_the_caller_wrote_it(options, said, flags):
    """From Python the option's keyword, on the command line its flag (stranger18)."""
    import flatcheck
    from flatcheck.errors import ConfigError
    from flatcheck.settings import flag_of

    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    with pytest.raises(ConfigError) as caught:
        flatcheck.measure(model, (torch.randn(8, 3), torch.randint(0, 2, (8,))), probes={"head-trace": options})
    assert str(caught.value).startswith(said) and "--" not in str(caught.value)
    assert caught.value.worded(flag_of).startswith(flags)
