"""Relative flatness κ: the dense Hessian value, its cross-entropy closed form, and the property it exists for — invariance under a function-preserving layer rescaling
that moves the plain head trace by exactly α²."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flatcheck.backends import create_backend
from flatcheck.problem import model_mode
from flatcheck.probes._head import head_statistics, resolve_head
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options
from tests.support.head import RTOL, build, close, dense_head, make_problem

EPS64 = torch.finfo(torch.float64).eps


@pytest.mark.parametrize("kind", ["gap_cnn", "conv_head", "mlp", "vit"])
def test_probe_equals_dense_kappa_with_per_class_parts(kind):
    problem = build(kind, True)
    ctx = ProbeContext(backend=create_backend("autograd", problem), seed=0)
    result = create_probe("relative-flatness").run(ctx, parse_options("relative-flatness", {}))
    truth = dense_head(problem, result.details["head"])
    assert result.stderr is None and result.matvecs == 0
    assert close(result.value, truth["kappa"])
    parts = torch.tensor([result.details["per_class"][str(c)] for c in range(len(truth["per_class"]))],
                         dtype=torch.float64)
    assert (parts - truth["per_class"]).abs().max().item() <= RTOL * truth["per_class"].abs().max().item()
    assert close(parts.sum().item(), result.value)


def test_cross_entropy_closed_form_of_the_spec():
    """κ = (1/N) Σ_n ‖φ_n‖² (Σ_s p_ns ‖w_s‖² − ‖Σ_s p_ns w_s‖²), with φ taken by hand."""
    problem = build("mlp", True)
    model = problem.model
    stats = head_statistics(create_backend("autograd", problem), resolve_head(model, None))
    W = model[5].weight.detach()
    total = 0.0
    with model_mode(model, problem.bn_mode), torch.no_grad():
        for b in problem.samples:
            phi = model[:5](b.x)
            p = model(b.x).softmax(-1)
            per = phi.pow(2).sum(1) * ((p * W.pow(2).sum(1)).sum(1) - (p @ W).pow(2).sum(1))
            total += per.sum().item() / problem.samples.n
    assert close(stats.kappa, total)


def relu_mlp(bias: bool = True) -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Flatten(), nn.Linear(36, 10), nn.ReLU(), nn.Linear(10, 8), nn.ReLU(),
                         nn.Linear(8, 5, bias=bias))


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_kappa_is_invariant_under_rescaling_while_head_trace_moves_by_alpha_squared(loss):
    alpha = 7.3
    before = make_problem(relu_mlp(), loss)
    after = make_problem(relu_mlp(), loss)
    with torch.no_grad():
        layer, head = after.model[3], after.model[5]  # layer l feeds the head through a ReLU
        layer.weight.mul_(alpha)
        layer.bias.mul_(alpha)
        head.weight.div_(alpha)
    x = torch.cat([b.x for b in before.samples])
    with torch.no_grad():
        f0, f1 = before.model(x), after.model(x)
    # each logit is a sum of ~D products; rescaling perturbs each by a few ulps
    assert (f0 - f1).abs().max().item() <= 64 * EPS64 * f0.abs().max().item()

    s0 = head_statistics(create_backend("autograd", before), resolve_head(before.model, None))
    s1 = head_statistics(create_backend("autograd", after), resolve_head(after.model, None))
    # the rescaled weights and features differ from α·(old) by one rounding each, and every
    # derived number is a sum of products over D features and C classes: 4·(D + C) ulps bound it
    tol = 4 * (8 + 5) * EPS64
    assert close(s1.kappa, s0.kappa, tol)
    assert close(s1.weight_trace, alpha**2 * s0.weight_trace, tol)
    assert close(s1.bias_trace, s0.bias_trace, tol)  # the bias sees no rescaling
    assert not close(s1.trace, s0.trace, 0.5)  # the plain head trace is not invariant
