"""lmax's bound on a saturated float32 model covers the logits' own rounding.

Each float32 logit carries about eps·|z| of rounding, and cross entropy's curvature depends on
the shares exp(z_j − z_m): a model trained far into interpolation (a stranger's CNN at loss 5e-8,
|z| up to 137) has eigenvalues known to about eps·max|z| relative, which the products' 16-unit
round-off floor does not cover (there, the truth lay 5.5× outside the bound on 2 of 8 seeds).
The floor's units are max(16, LOGIT_UNITS·M) with M the largest |logit| (linalg/certify.py).

The model: a small MLP trained on separable data, then its last layer scaled (so the margins,
and the loss, shrink as after long training) and shifted by a common offset (so |z| reaches
~120, as a drifting last bias does; the softmax is unchanged in exact arithmetic). The truth:
the dense float64 Hessian of the same pivoted loss at the float32 weights and data, exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call

import flatcheck
from flatcheck.linalg import certify
from flatcheck.losses import per_sample_loss
from flatcheck.models.spec import LossSpec

CE = LossSpec("cross_entropy")
EPS32 = torch.finfo(torch.float32).eps
SEEDS = range(8)


def _model(scale: float, offset: float) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A 533-parameter MLP on 16 samples of 5 classes, trained in float64, its last layer
    times `scale` plus `offset`; returned in float32."""
    g = torch.Generator().manual_seed(1)
    proto = torch.randn(5, 16, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (16,), generator=g)
    x = proto[y] + 0.5 * torch.randn(16, 16, generator=g, dtype=torch.float64)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 5)).double()
    opt = torch.optim.Adam(model.parameters(), 3e-2)
    for _ in range(200):
        opt.zero_grad()
        per_sample_loss(model(x), y, CE).mean().backward()
        opt.step()
    with torch.no_grad():
        model[-1].weight.mul_(scale)
        model[-1].bias.mul_(scale).add_(offset)
    return model.float().eval(), x.float(), y


def _truth(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float, float]:
    """(λ1, max |logit|, loss) in float64 at the float32 weights and data, exactly."""
    exact = copy.deepcopy(model).double()
    names = [n for n, _ in exact.named_parameters()]
    shapes = [p.shape for _, p in exact.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in exact.parameters()])

    def loss(w):
        parts = dict(zip(names, (c.reshape(s) for c, s in zip(w.split([s.numel() for s in shapes]), shapes))))
        return per_sample_loss(functional_call(exact, parts, (x.double(),)), y, CE).mean()

    H = torch.autograd.functional.hessian(loss, flat)
    with torch.no_grad():
        z = exact(x.double())
        value = loss(flat).item()
    return torch.linalg.eigvalsh((H + H.T) / 2).max().item(), z.abs().max().item(), value


def _ratios(model, x, y, truth) -> list[float]:
    """|λ − truth| / bound over the seeds (tol 1e-6: the bound is the round-off floor)."""
    out = []
    for seed in SEEDS:
        r = flatcheck.measure(model, (x, y), probes={"lmax": {"k": 1, "tol": 1e-6}}, seed=seed).results["lmax"]
        assert r.error_bound is not None and r.resolved
        out.append(abs(r.value - truth) / r.error_bound)
    return out


def test_a_saturated_float32_bound_covers_the_logits_rounding(monkeypatch):
    model, x, y = _model(scale=2.0, offset=100.0)
    truth, M, loss = _truth(model, x, y)
    assert loss < 1e-6 and M > 100  # the case: saturated, large logits
    after, units = _ratios(model, x, y, truth), certify.LOGIT_UNITS
    monkeypatch.setattr(certify, "LOGIT_UNITS", 0.0)  # the floor as it was: 16 units
    before = _ratios(model, x, y, truth)
    print(f"\nloss {loss:.1e}, max|z| {M:.0f}: error/bound at 16 units "
          f"{' '.join(f'{v:.2f}' for v in before)}; at max(16, {units:g}·M) "
          f"{' '.join(f'{v:.2f}' for v in after)}")
    assert max(before) > 1  # the old floor misses the truth here: the test can fail
    assert max(after) <= 1, after


def test_the_floor_takes_the_largest_logit_the_run_measured():
    model, x, y = _model(scale=2.0, offset=100.0)
    _, M, _ = _truth(model, x, y)
    report = flatcheck.measure(model, (x, y), probes={"lmax": {"k": 1, "tol": 1e-6}})
    got = report.meta["data"]["softmax_saturation"]["max_abs_logit"]
    assert got == pytest.approx(M, rel=4 * EPS32)  # the float32 forward's, within its rounding
    r = report.results["lmax"]
    assert r.error_bound >= certify.LOGIT_UNITS * got * EPS32 * abs(r.value) * (1 - 1e-6)


def test_an_unsaturated_model_keeps_the_products_floor(monkeypatch):
    """Logits under ROUNDOFF_UNITS / LOGIT_UNITS: the bound is what it was, to the bit."""
    model, x, y = _model(scale=0.5, offset=0.0)
    _, M, _ = _truth(model, x, y)
    assert certify.LOGIT_UNITS * M < certify.ROUNDOFF_UNITS
    assert certify.roundoff_units(M) == certify.ROUNDOFF_UNITS
    opts = {"lmax": {"k": 1, "tol": 1e-6}}
    now = [flatcheck.measure(model, (x, y), probes=opts, seed=s).results["lmax"].error_bound for s in (0, 1)]
    monkeypatch.setattr(certify, "LOGIT_UNITS", 0.0)
    old = [flatcheck.measure(model, (x, y), probes=opts, seed=s).results["lmax"].error_bound for s in (0, 1)]
    assert now == old


def test_other_losses_keep_the_products_floor(monkeypatch):
    """MSE's output Hessian is the identity: no share of the outputs to round, so the same
    large logits leave its bound as it was, to the bit."""
    model, x, y = _model(scale=2.0, offset=100.0)
    opts = {"lmax": {"k": 1, "tol": 1e-6}}
    report = flatcheck.measure(model, (x, y), probes=opts, loss="mse")
    assert "softmax_saturation" not in report.meta["data"]
    monkeypatch.setattr(certify, "LOGIT_UNITS", 0.0)
    old = flatcheck.measure(model, (x, y), probes=opts, loss="mse").results["lmax"]
    assert report.results["lmax"].error_bound == old.error_bound


def test_a_tracker_measures_the_logits_of_each_step():
    """A Tracker reuses its session: the logits it measured on the first step must not stand
    for a later one's, whose logits have grown (as training does; here the last layer is
    scaled in place). The warm solver's floor then takes the new M."""
    model, x, y = _model(scale=0.5, offset=0.0)
    tracker = flatcheck.Tracker(model, (x, y), probes={"lmax": {"k": 1, "tol": 1e-6}}, every=1, out=None, quiet=True)
    tracker.step(0)
    with torch.no_grad():
        model[-1].weight.mul_(4.0)
        model[-1].bias.mul_(4.0).add_(100.0)
    tracker.step(1)
    r = tracker.last_record["results"]["lmax"]
    truth, M, _ = _truth(model, x, y)
    assert M > 100 and r["details"]["warm_start"]
    # the floor's ‖H‖ is the solver's running scale, here 1 % under the final |λ|; a stale M
    # (the first step's, under 8) would leave it at 16 units, 15× lower
    assert r["error_bound"] >= 0.9 * certify.LOGIT_UNITS * M * EPS32 * abs(r["value"])
    assert abs(r["value"] - truth) <= r["error_bound"]


def test_a_tracker_measures_the_logits_after_an_update_through_data():
    """Weights changed through `.data` leave the parameters' in-place versions as they were (a
    reviewer's case: a reused session kept M 0.53 where the logits had grown to 31.8); the
    Tracker's session measures M again on every step whatever moved the weights."""
    model, x, y = _model(scale=0.5, offset=0.0)
    tracker = flatcheck.Tracker(model, (x, y), probes={"lmax": {"k": 1, "tol": 1e-6}}, every=1, out=None, quiet=True)
    tracker.step(0)
    with torch.no_grad():
        model[-1].weight.data.mul_(4.0)
        model[-1].bias.data.mul_(4.0).add_(100.0)
    tracker.step(1)
    r = tracker.last_record["results"]["lmax"]
    truth, M, _ = _truth(model, x, y)
    assert M > 100
    assert r["error_bound"] >= 0.9 * certify.LOGIT_UNITS * M * EPS32 * abs(r["value"])
    assert abs(r["value"] - truth) <= r["error_bound"]
