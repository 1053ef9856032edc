"""A float32 run whose products cancel inside the model: its eigenvalue bound still covers the
float64 truth, and it says so.

torch takes tanh's derivative as 1 − y² from the rounded output y: a unit saturated at |a| ~ 8
(true derivative ~5e-7) gets one off by about eps absolute, relative 1e-1. Where every path to
the loss runs through such units (a diverged tanh MLP: a stranger's, lr 2.0, loss 21) and the
samples are confidently wrong (so the logits' second derivatives, weighted by p − e_y ≈ e_m − e_y,
stay in the Hessian), the float32 products are off by ~1e5·eps relative, far past the 16-unit
floor and the logits' 2·eps·max|z|. api._check_products measures one product against float64;
past linalg.certify.PRODUCT_TRUSTED its error is the floor, with a warning.

The model: a random tanh MLP, its first layer ×4, its second layer's biases ±8 (every unit
saturated), its head's first bias +20 (every sample predicted class 0, three in four wrongly).
The truth: the dense float64 Hessian of the same loss at the float32 weights and data, exactly.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import flatcheck
from flatcheck.linalg import certify

from tests.linalg.test_logit_roundoff import _truth  # (λ1, max |logit|, loss): dense float64 at the float32 weights

SEEDS = range(8)
WARNING = "float32 curvature products lose precision"


def _model(saturation: float, shift: float) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """916 parameters, 64 samples of 4 random classes; second-layer biases ±`saturation`,
    head bias of class 0 plus `shift`."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    y = torch.randint(0, 4, (64,), generator=g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 24), nn.Tanh(), nn.Linear(24, 24), nn.Tanh(), nn.Linear(24, 4))
    with torch.no_grad():
        model[0].weight.mul_(4.0)
        model[2].bias.copy_(saturation * torch.sign(model[2].bias))
        model[4].bias[0] += shift
    return model.eval(), x, y


def _ratios(model, x, y, truth) -> list[float]:
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in SEEDS:
            r = flatcheck.measure(model, (x, y), probes={"lmax": {"k": 1}}, seed=seed).results["lmax"]
            assert r.error_bound is not None
            out.append(abs(r.value - truth) / r.error_bound)
    return out


def test_a_cancelling_float32_bound_covers_the_float64_truth(monkeypatch):
    model, x, y = _model(saturation=8.0, shift=20.0)
    truth, _, loss = _truth(model, x, y)
    assert loss > 10  # the case: confidently wrong
    after = _ratios(model, x, y, truth)
    monkeypatch.setattr(certify, "PRODUCT_UNITS", 0.0)  # the floor as it was: max(16, 2·M)
    before = _ratios(model, x, y, truth)
    print(f"\nλ1 {truth:.3e}, loss {loss:.1f}: error/bound before "
          f"{' '.join(f'{v:.2f}' for v in before)}; now {' '.join(f'{v:.2f}' for v in after)}")
    assert max(before) > 1  # the old floor misses the truth here: the test can fail
    assert max(after) <= 1, after


def test_the_run_warns_and_records_the_products_error():
    model, x, y = _model(saturation=8.0, shift=20.0)
    with pytest.warns(UserWarning, match=WARNING):
        report = flatcheck.measure(model, (x, y), probes={"lmax": {"k": 1}})
    found = report.meta["data"]["float32_products"]
    assert found["eps_units"] > certify.PRODUCT_TRUSTED and WARNING in found["warning"]
    r = report.results["lmax"]
    eps = torch.finfo(torch.float32).eps
    assert r.error_bound >= certify.PRODUCT_UNITS * found["eps_units"] * eps * abs(r.value) * (1 - 1e-6)


def test_healthy_and_float64_runs_are_not_touched(monkeypatch):
    """Unsaturated units: the check finds the products within PRODUCT_TRUSTED, and the bounds
    are what they were, to the bit; float64 runs are not checked."""
    model, x, y = _model(saturation=0.5, shift=0.0)
    opts = {"lmax": {"k": 1}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning
        reports = [flatcheck.measure(model, (x, y), probes=opts, seed=s) for s in (0, 1)]
        assert "float32_products" not in flatcheck.measure(model, (x, y), probes=opts, dtype="float64").meta["data"]
    assert all("float32_products" not in r.meta["data"] for r in reports)
    monkeypatch.setattr(certify, "PRODUCT_UNITS", 0.0)
    old = [flatcheck.measure(model, (x, y), probes=opts, seed=s).results["lmax"].error_bound for s in (0, 1)]
    assert [r.results["lmax"].error_bound for r in reports] == old


def test_a_model_without_output_derivative_units_skips_the_float64_check(monkeypatch):
    """The check costs a float64 copy and product (8.8 s on a CPU ResNet-18): only models with
    a tanh or sigmoid module (or a sigmoid_mse loss) pay for it; a ReLU model's run never makes
    it, a tanh model's does."""
    import flatcheck.api as api

    calls = []
    plain = api._hvp
    monkeypatch.setattr(api, "_hvp", lambda *a, **kw: calls.append(1) or plain(*a, **kw))
    torch.manual_seed(0)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    relu = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    flatcheck.measure(relu, (x, y), probes=["lmax"], seed=0)
    assert not calls
    tanh = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))
    flatcheck.measure(tanh, (x, y), probes=["lmax"], seed=0)
    assert len(calls) == 2  # the float32 product and its float64 twin
