"""Adaptive sharpness: Monte Carlo vs second-order form vs the dense
(ρ²/2)·Tr(diag|w| H diag|w|), weights restored bit for bit, loss override, --params.

Tolerances are z = 4 standard errors (false-alarm rate below 1e-4 for a normal estimate);
the MC–second-order comparison uses the two independent standard errors combined.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.support.dense import dense, make_case
from flatcheck.backends import ParamLayout
from flatcheck.errors import ConfigError
from flatcheck.models.spec import LossSpec
from flatcheck.probes import adaptive_sharpness as mod
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options

Z = 4.0


def run(case, seed: int = 0, **options):
    ctx = ProbeContext(backend=case.backend(), seed=seed)
    return create_probe("adaptive-sharpness").run(ctx, parse_options("adaptive-sharpness", options))


def dense_second_order(case, rho: float) -> float:
    H, _ = dense(case)
    w = torch.cat([p.detach().abs().reshape(-1) for p in case.problem.layout.params(case.model)])
    return rho**2 / 2 * (w[:, None] * H * w[None, :]).trace().item()


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


def assert_bitwise_equal(model, saved):
    now = model.state_dict(keep_vars=True)
    for k, v in saved.items():
        assert torch.equal(now[k].detach(), v), k  # torch.equal: every element identical


@pytest.mark.statistical
def test_second_order_matches_dense_within_its_stderr():
    case = make_case("cnn")
    r = run(case, method="second-order", probes_max=60)
    so = r.details["second_order"]
    assert r.value == so["value"] and r.stderr == so["stderr"] and r.matvecs == so["matvecs"] == 60
    assert abs(so["value"] - dense_second_order(case, rho=0.0005)) <= Z * so["stderr"]
    assert "mc" not in r.details
    # ρ only scales: the same probes at another ρ give the ratio (ρ'/ρ)² exactly
    r2 = run(case, method="second-order", probes_max=60, rho=0.05)
    assert math.isclose(r2.value, r.value * (0.05 / 0.0005) ** 2, rel_tol=1e-12)


@pytest.mark.parametrize("loss", ["cross_entropy", "sigmoid_mse"])
def test_monte_carlo_agrees_with_second_order_for_small_rho(loss):
    """The ± pair removes the odd Taylor terms, so the MC mean is ½E[δᵀHδ] + O(ρ⁴) — with
    ρ = 1e-3 the quartic term is ~1e-6 of the quadratic, far inside the standard errors."""
    case = make_case("mlp", loss=loss)
    r = run(case, rho=1e-3, noise_draws=64, probes_max=100)
    mc, so = r.details["mc"], r.details["second_order"]
    assert r.value == mc["value"] and r.stderr == mc["stderr"] and r.seed == 0
    assert mc["draws"] == 64 and mc["loss_evaluations"] == 129
    combined = math.hypot(mc["stderr"], so["stderr"])
    assert abs(mc["value"] - so["value"]) <= Z * combined
    assert abs(mc["value"] - dense_second_order(case, 1e-3)) <= Z * mc["stderr"]


def test_weights_restored_bitwise():
    case = make_case("cnn")
    saved = snapshot(case.model)
    run(case, rho=0.3, noise_draws=3, method="mc")  # large ρ: a bad restore would show
    assert_bitwise_equal(case.model, saved)


def test_weights_restored_when_a_loss_evaluation_fails(monkeypatch):
    case = make_case("mlp")
    saved = snapshot(case.model)
    calls = {"n": 0}
    real = mod.sample_loss

    def failing(backend):
        calls["n"] += 1
        if calls["n"] == 3:  # inside the first perturbation pair
            raise RuntimeError("boom")
        return real(backend)

    monkeypatch.setattr(mod, "sample_loss", failing)
    with pytest.raises(RuntimeError, match="boom"):
        run(case, rho=0.3, noise_draws=2, method="mc")
    assert_bitwise_equal(case.model, saved)


def test_loss_override_uses_a_new_problem_and_leaves_the_spec_loss():
    case = make_case("mlp")  # cross entropy
    r = run(case, method="second-order", loss="sigmoid-mse", probes_max=60)
    assert r.details["loss"] == "sigmoid_mse"
    assert case.problem.loss.name == "cross_entropy"
    truth = dense_second_order(make_case("mlp", loss="sigmoid_mse"), 0.0005)
    assert abs(r.value - truth) <= Z * r.stderr


def test_params_subset_is_respected():
    case = make_case("mlp")
    case.problem = dataclasses.replace(case.problem, layout=ParamLayout.from_model(case.model, ("5.*",)))
    saved = snapshot(case.model)
    r = run(case, method="both", noise_draws=4, probes_max=40)
    assert r.details["parameters"] == 8 * 4 + 4
    assert_bitwise_equal(case.model, saved)
    assert abs(r.details["second_order"]["value"] - dense_second_order(case, 0.0005)) \
        <= Z * r.details["second_order"]["stderr"]


def test_same_seed_same_numbers_and_second_order_independent_of_method():
    case = make_case("mlp")
    a = run(case, noise_draws=4, probes_max=20, seed=7)
    b = run(case, noise_draws=4, probes_max=20, seed=7)
    c = run(case, method="second-order", probes_max=20, seed=7)
    assert a.details == b.details
    assert c.details["second_order"] == a.details["second_order"]


@pytest.mark.parametrize("bad, flag", [
    ({"rho": -1.0}, "--rho"), ({"rho": float("nan")}, "--rho"), ({"noise_draws": 0}, "--noise-draws"),
    ({"noise_draws": 1}, "--noise-draws"), ({"loss": "hinge"}, "--loss"), ({"probes_max": 1}, "--probes-max"),
])
def test_bad_options_name_their_flag(bad, flag):
    """The CLI's words name the flag; a Python caller's name the keyword (errors.setting)."""
    from flatcheck.settings import flag_of

    with pytest.raises(ConfigError) as caught:
        parse_options("adaptive-sharpness", bad)
    assert flag in caught.value.worded(flag_of)
    assert str(caught.value).startswith(flag.removeprefix("--").replace("-", "_"))


def test_loss_names_are_normalised():
    assert parse_options("adaptive-sharpness", {"loss": "Sigmoid-MSE"}).loss == "sigmoid_mse"
    assert LossSpec("sigmoid_mse").name == "sigmoid_mse"


def test_second_order_by_forward_tangents_equals_the_product_route():
    """The autograd backend takes (|w|⊙v)ᵀH(|w|⊙v) by forward tangents; forcing the (k, P)
    product route gives the same probes, so the same value and probe values to round-off. The
    product route alone sees each product, so only its stderr is floored by the products' own
    variance (`known_stderr`): never below the spread's."""
    from flatcheck.linalg import hutchinson
    from flatcheck.operators import CurvatureOperator

    case = make_case("cnn", bn_mode="train")
    H, _ = dense(case)
    op = CurvatureOperator(case.backend("autograd"))
    w = torch.cat([p.detach().abs().reshape(-1) for p in case.problem.layout.params(case.model)])
    fast = mod._ScaledOperator(op, w)
    assert fast.streams_total
    slow = mod._ScaledOperator(CurvatureOperator(case.backend("autograd")), w)
    slow.streams_total = False
    a, b = (hutchinson(o, generator=torch.Generator().manual_seed(5), max_probes=9, block_size=4)
            for o in (fast, slow))
    assert op.matvecs == 9 and a.matvecs == b.matvecs == 9
    # each probe value is a sum of P² terms no larger than |w_i H_ij w_j|
    tol = 1e3 * torch.finfo(torch.float64).eps * (w[:, None] * H * w[None, :]).abs().sum().item()
    assert math.isclose(a.value, b.value, abs_tol=tol)
    assert all(math.isclose(x, y, abs_tol=tol) for x, y in zip(a.samples, b.samples, strict=True))
    # the streamed route's stderr is its spread widened by the values' skewness (linalg.trace)
    assert a.known_stderr is None and math.isclose(b.stderr, max(a.spread_stderr, b.known_stderr), abs_tol=tol)
    from flatcheck.backends import Vhv

    assert not isinstance(case.backend("func"), Vhv)
    assert not mod._ScaledOperator(CurvatureOperator(case.backend("func")), w).streams_total


def test_result_carries_the_degrees_of_freedom_of_its_stderr():
    """A gate's interval on S_ρ takes Student's t with draws − 1 (Monte Carlo) or probes − 1
    (second order) degrees of freedom."""
    from flatcheck.probes.adaptive_sharpness import AdaptiveSharpnessOptions, AdaptiveSharpnessProbe
    from flatcheck.probes.registry import ProbeContext
    from tests.support.dense import make_case

    backend = make_case("mlp").backend()
    probe = AdaptiveSharpnessProbe()
    mc = probe.run(ProbeContext(backend=backend, seed=0), AdaptiveSharpnessOptions(method="mc", noise_draws=5))
    assert mc.dof == 4 and mc.details["mc"]["draws"] == 5
    second = probe.run(ProbeContext(backend=backend, seed=0),
                       AdaptiveSharpnessOptions(method="second-order", probes_max=7))
    assert second.dof == 6 and second.details["second_order"]["probes"] == 7


def test_headline_route_is_the_monte_carlo_where_the_rounding_cannot_hold_it_up():
    case = make_case("mlp")
    r = run(case, rho=1e-5, noise_draws=16, probes_max=50)
    d = r.details
    assert d["route"] == "monte-carlo" and f"at least {mod.ROUNDING_MARGIN:g}× the loss's rounding floor" in d["route_reason"]
    assert (r.value, r.stderr, r.dof) == (d["mc"]["value"], d["mc"]["stderr"], d["mc"]["draws"] - 1)
    # the pilot's products are counted, and it drew its own probes
    pilot = d["route_pilot"]
    assert pilot["probes"] == mod.PILOT_PROBES and r.matvecs == d["second_order"]["matvecs"] + pilot["matvecs"]
    assert pilot["value"] != d["second_order"]["value"]
    assert abs(r.value - dense_second_order(case, 1e-5)) <= Z * r.stderr


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_headline_falls_back_to_the_second_order_form_below_the_rounding_floor(kind):
    """At ρ = 1e-8 S_ρ (~3e-18) is far below one rounding of L (~3e-16 in float64): the ± pairs
    share L(w)'s rounding, and on the CNN their mean, 1.2e-16 ± 4e-17, looks 'significant'
    by its standard error alone while being 50× the truth. The headline must not be it."""
    case = make_case(kind)
    r = run(case, rho=1e-8, noise_draws=16, probes_max=50)
    d = r.details
    truth = dense_second_order(case, 1e-8)
    floor = d["mc"]["rounding_floor"]
    assert d["route"] == "second-order"
    assert (f"puts |S_ρ| at {abs(d['route_pilot']['value']):.3g}, below {mod.ROUNDING_MARGIN:g}× the loss's "
            f"rounding floor {floor:.2g}") in d["route_reason"]
    assert floor == pytest.approx(torch.finfo(torch.float64).eps * d["mc"]["base_loss"])
    assert (r.value, r.stderr, r.dof) == (d["second_order"]["value"], d["second_order"]["stderr"],
                                          d["second_order"]["probes"] - 1)
    assert abs(r.value - truth) <= Z * r.stderr
    assert "headline: second-order" in r.notes


def test_the_route_is_decided_by_neither_reported_estimate():
    """Whatever the Monte Carlo draws and the second-order probes came out as, the same pilot
    picks the same route: a route taken because the reported estimate's own draws came out high
    (or low) biases the headline."""
    pilot = {"value": -2e-12, "stderr": 1e-12, "probes": mod.PILOT_PROBES}
    for floor, route in ((1e-16, "monte-carlo"), (1e-13, "second-order")):
        for value, stderr in ((-3e-12, 1e-12), (0.0, 5e-12), (2e-12, 1e-14), (9e-11, 1e-12)):
            mc = {"value": value, "stderr": stderr, "draws": 16, "rounding_floor": floor}
            for second_value in (1e-15, 2e-12, 5e-11):
                second = {"value": second_value, "stderr": 1e-13, "probes": 50}
                assert mod.headline(mc, second, 1e-3, pilot)[1] == route


@pytest.mark.parametrize("bad", [(float("inf"), float("nan")), (float("nan"), 1e-3), (1e-3, None)])
def test_a_monte_carlo_part_without_a_finite_value_is_never_the_headline(bad):
    value, stderr = bad
    mc = {"value": value, "stderr": stderr, "draws": 16, "rounding_floor": 1e-16}
    second = {"value": 1e-3, "stderr": 1e-5, "probes": 50}
    part, route, why = mod.headline(mc, second, 1.0, {"value": 1e-3, "probes": mod.PILOT_PROBES})
    assert part is second and route == "second-order" and "not finite" in why


@pytest.mark.statistical
def test_the_headline_over_seeds_is_unbiased_where_the_monte_carlo_is_noisy():
    """A regime where the Monte Carlo interval straddles zero on some seeds (which is where a
    route decided by it flipped and biased the headline): over 24 seeds the route stays the
    Monte Carlo, and the headlines' mean lies within Z standard errors of the mean of the dense
    truth (ρ small enough that S_ρ's fourth-order part is far below that error)."""
    case = make_case("mlp")
    rho = 1e-4
    runs = [run(case, seed=s, rho=rho, noise_draws=4, probes_max=20) for s in range(24)]
    assert {r.details["route"] for r in runs} == {"monte-carlo"}
    values = torch.tensor([r.value for r in runs], dtype=torch.float64)
    se = values.std().item() / math.sqrt(len(values))
    assert abs(values.mean().item() - dense_second_order(case, rho)) <= Z * se
