"""Top-k eigenvalues (Lanczos, power iteration) and the lmax probe against dense float64 truth.

Tolerances come from the stopping rule itself: the stop is on each value's reported error
bound (r²/δ, Kato–Temple, or the residual r = ‖Hq − θq‖ where no gap is resolved: a unit
vector q with Rayleigh quotient θ has an eigenvalue within r of θ), so a value lies within its
bound (plus float64 round-off, ~1e-13 here) of the eigenvalue it approximates. "Top" means largest algebraic: the tiny models' Hessians are
indefinite.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.support.dense import DenseOperator, dense, make_case
from flatcheck.config import probe_requests
from flatcheck.errors import ConfigError
from flatcheck.linalg.certify import GAP_FROM_BLOCK_KRYLOV, GAP_FROM_RITZ
from flatcheck.linalg.lanczos import breakdown_threshold, lanczos_top
from flatcheck.linalg.power import power_top
from flatcheck.operators import CurvatureOperator
from flatcheck.probes.registry import ProbeContext, create_probe

TOL = 1e-6


@functools.lru_cache(maxsize=None)
def truth(kind: str, bn_mode: str = "eval"):
    H, G = dense(make_case(kind, bn_mode=bn_mode))
    return {"hessian": torch.linalg.eigvalsh(H), "ggn": torch.linalg.eigvalsh(G)}


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _spectrum_matrix(eigs: list[float], seed: int = 0) -> torch.Tensor:
    n = len(eigs)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen(seed), dtype=torch.float64))
    return Q @ torch.diag(torch.tensor(eigs, dtype=torch.float64)) @ Q.T


# -- Lanczos and power iteration on tiny networks ----------------------------------------------

@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("matrix", ["hessian", "ggn"])
def test_lanczos_top3_matches_dense(kind, matrix):
    eigs = truth(kind)[matrix]
    op = CurvatureOperator(make_case(kind).backend(), matrix)
    r = lanczos_top(op, 3, generator=gen(), tol=TOL)
    top = eigs.flip(0)[:3].tolist()
    assert r.stop_reason == "converged" and all(r.converged)
    for value, bound, want in zip(r.values, r.bounds, top):
        # the stop is on the error bound (r²/δ, or r without a resolved gap), and the value
        # lies within it of the dense eigenvalue (plus float64 round-off)
        assert bound.value <= TOL * abs(value)
        assert abs(value - want) <= bound.value + 1e-12 * abs(want)
    # one product per step, plus 3 per measurement of the true residuals
    assert r.matvecs == op.matvecs and r.matvecs > r.iterations and (r.matvecs - r.iterations) % 3 == 0
    # Krylov convergence: far fewer steps than the dimension
    assert r.iterations < op.dim // 4


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("matrix", ["hessian", "ggn"])
def test_power_iteration_finds_the_top_eigenvalue(kind, matrix):
    eigs = truth(kind)[matrix]
    # power iteration converges to the largest |λ|; here that is the largest algebraic one
    assert abs(eigs[0]) < eigs[-1]
    op = CurvatureOperator(make_case(kind).backend(), matrix)
    r = power_top(op, 1, generator=gen(), tol=TOL, max_iter=2000)
    assert r.converged == [True] and r.residuals[0] <= TOL * abs(r.values[0])
    assert abs(r.values[0] - eigs[-1].item()) <= TOL * eigs[-1].item()
    assert r.matvecs == r.iterations == op.matvecs


# -- the recurrence on dense matrices: breakdown, deflation, round-off --------------------------

def test_breakdown_restarts_until_k_values():
    """Rank 5: the Krylov space of one start vector closes after 6 steps; k = 7 needs a restart,
    whose direction lies in the null space, and returns a second zero."""
    B = torch.randn(40, 5, generator=gen(3), dtype=torch.float64)
    A = B @ B.T
    eigs = torch.linalg.eigvalsh(A).flip(0)
    r = lanczos_top(DenseOperator(A), 7, generator=gen(), tol=TOL)
    assert r.stop_reason == "invariant" and r.iterations == 7
    # a breakdown is declared at β ≤ √eps·‖T‖, so that is what the residuals may be left with
    floor = breakdown_threshold(torch.float64) * eigs[0].item()
    for value, want, res in zip(r.values, eigs[:7].tolist(), r.residuals):
        assert res <= floor
        assert abs(value - want) <= res + 40 * torch.finfo(torch.float64).eps * eigs[0].item()


def test_power_deflation_and_negative_dominant_eigenvalue():
    eigs = [-5.0, 3.0, 2.0, 1.0] + [0.1 * i for i in range(20)]
    A = _spectrum_matrix(eigs)
    power = power_top(DenseOperator(A), 2, generator=gen(), tol=1e-10, max_iter=5000)
    # largest magnitude first, then the largest magnitude of what is left
    assert power.values[0] == pytest.approx(-5.0, rel=1e-9) and power.values[1] == pytest.approx(3.0, rel=1e-9)
    lz = lanczos_top(DenseOperator(A), 2, generator=gen(), tol=1e-10)
    assert lz.values == pytest.approx([3.0, 2.0], rel=1e-9)


def test_float32_round_off_stops_as_stalled():
    """A tolerance below float32 round-off cannot be met; the recurrence must notice rather
    than run to max_iter."""
    A = _spectrum_matrix([10.0, 5.0] + [1.0 / (i + 1) for i in range(200)]).float()
    r = lanczos_top(DenseOperator(A), 1, generator=gen(), tol=1e-12, max_iter=150)
    assert r.stop_reason == "stalled" and r.converged == [False]
    assert r.iterations < 150
    assert r.values[0] == pytest.approx(10.0, rel=1e-5)



# -- warm starts ---------------------------------------------------------------------------------

def _crossed(top: float, n: int = 300):
    """An operator whose old top eigenvector (eigenvalue 5 before) is still an exact eigenvector,
    now of the second eigenvalue 5, while a new one, orthogonal to it, has risen to `top`."""
    eigs = [top, 5.0] + [4.0 * (i + 1) / n for i in range(n - 2)]
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen(5), dtype=torch.float64))
    return Q @ torch.diag(torch.tensor(eigs, dtype=torch.float64)) @ Q.T, Q[:, 1:2].T.clone()


@pytest.mark.parametrize("top, tol", [(10.0, 1e-3), (10.0, 1e-6), (5.5, 1e-6)])
def test_a_warm_start_finds_a_top_eigenvalue_that_crossed_the_old_one(top, tol, monkeypatch):
    """The guard (the random part of the warm start) catches a crossing to twice the old λ at
    tol 1e-3 and one by a gap of 10 % of λ at 1e-6; without it the Krylov space of the old
    eigenvector closes after one product and the old, now second, eigenvalue would be reported
    with a zero residual. (At tol 1e-3 the certified stop, r²/δ, comes after two products, before
    a 10 % crossing grows into view: the Tracker's cold_every steps are the guard there.)"""
    from flatcheck.linalg import lanczos

    A, old = _crossed(top)
    r = lanczos_top(DenseOperator(A), 1, generator=gen(), tol=tol, start=old)
    assert r.converged == [True] and r.stop_reason == "converged"
    assert abs(r.values[0] - top) <= r.bounds[0].value + 1e-12 * top
    monkeypatch.setattr(lanczos, "WARM_MIX", 0.0)
    blind = lanczos_top(DenseOperator(A), 1, generator=gen(), tol=tol, start=old)
    assert blind.values[0] == pytest.approx(5.0, rel=1e-12) and blind.matvecs == 1


def test_warm_residuals_from_the_products_taken_equal_measured_ones():
    """A warm start reports the residual of its Ritz vector from the products the recurrence
    took (no extra product): the same number a fresh product of the vector gives."""
    A = _spectrum_matrix([10.0, 9.0, 5.0] + [1.0 / (i + 1) for i in range(200)])
    eigs = torch.linalg.eigh(A)
    near = eigs.eigenvectors[:, -1] + 0.05 * eigs.eigenvectors[:, -2]
    op = DenseOperator(A)
    r = lanczos_top(op, 1, generator=gen(), tol=TOL, start=near.unsqueeze(0))
    assert r.matvecs == r.iterations == op.matvecs  # one product a step, none for the check
    y = r.vectors[0]
    assert y @ A @ y == pytest.approx(r.values[0], rel=1e-13)
    assert torch.linalg.vector_norm(A @ y - r.values[0] * y).item() == pytest.approx(r.residuals[0], rel=1e-6,
                                                                                     abs=1e-13)
    assert r.bounds[0].value <= TOL * r.values[0] and abs(r.values[0] - 10.0) <= r.bounds[0].value + 1e-12

# -- the probe ---------------------------------------------------------------------------------

def run_probe(case, **opts):
    (req,) = probe_requests(["lmax"], {"lmax": opts})
    return create_probe("lmax").run(ProbeContext(case.backend(), seed=7), req.options)


@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_lmax_probe_reports_pairs_and_mode(bn_mode):
    eigs = truth("cnn", bn_mode)["hessian"].flip(0)
    r = run_probe(make_case("cnn", bn_mode=bn_mode), k=3, tol=TOL)
    d = r.details
    assert r.value == d["eigenvalues"][0] and r.stderr is None and r.seed == 7
    assert r.label == "λmax(H)" and d["bn_mode"] == bn_mode and f"bn {bn_mode}" in r.notes
    assert d["converged"] == [True] * 3 and d["stop_reason"] == "converged"
    assert r.error_bound == d["error_bounds"][0] and d["gap_from"] == GAP_FROM_BLOCK_KRYLOV
    for value, bound, want in zip(d["eigenvalues"], d["error_bounds"], eigs[:3].tolist()):
        assert bound <= TOL * abs(value) and abs(value - want) <= bound + 1e-12 * abs(want)
    for value, bound in zip(d["eigenvalues"], d["error_bounds"]):  # the notes give every value its bound
        assert f"{value:.6g} (within {bound:.2g})" in r.notes
    # k = 3: a block of k + 1 = 4 starts, four products a step (one where a step is likely the
    # last), the residuals from them (no check product)
    assert d["starts"] == 4 and d["iterations"] < r.matvecs <= 4 * d["iterations"]
    assert d["residuals_from"] == "products taken"
    one = run_probe(make_case("cnn", bn_mode=bn_mode), k=3, tol=TOL, starts=1).details
    assert one["gap_from"] == GAP_FROM_RITZ and one["residuals_from"] == "one more product per Ritz vector"
    for value, bound, want in zip(one["eigenvalues"], one["error_bounds"], eigs[:3].tolist()):
        assert bound <= TOL * abs(value) and abs(value - want) <= bound + 1e-12 * abs(want)


def test_lmax_eval_and_train_modes_differ():
    """The cnn's running statistics are set away from its batch statistics, so the two modes
    are different matrices: the mode must reach the products."""
    ev, tr = truth("cnn", "eval")["hessian"][-1].item(), truth("cnn", "train")["hessian"][-1].item()
    assert abs(ev - tr) > 100 * TOL * abs(ev)


@pytest.mark.parametrize("opts,flag", [({"k": 0}, "--k"), ({"tol": 0.0}, "--tol"), ({"tol": 1.5}, "--tol"),
                                       ({"max_iter": 2, "k": 3}, "--max-iter"), ({"method": "foo"}, "method")])
def test_lmax_options_are_validated(opts, flag):
    """The CLI's words name the flag (Python callers get the keyword: errors.setting)."""
    from flatcheck.settings import flag_of

    with pytest.raises(ConfigError) as caught:
        probe_requests(["lmax"], {"lmax": opts})
    assert flag in caught.value.worded(flag_of)


def test_lmax_probe_power_method():
    eigs = truth("mlp")["ggn"]
    r = run_probe(make_case("mlp"), k=1, matrix="ggn", method="power", max_iter=2000)
    d = r.details
    assert d["method"] == "power" and r.label == "λmax(G)" and d["converged"] == [True]
    assert abs(r.value - eigs[-1].item()) <= TOL * eigs[-1].item()
    assert r.matvecs == d["iterations"] and "negative" not in r.notes


# -- defaults that finish, budgets ---------------------------------------------------------------

def test_default_tolerance_is_one_the_dtype_can_reach():
    """float32 products carry round-off near 1e-4..1e-3 of |λ| on real networks; the default
    tolerance there is 1e-3, and 1e-6 in float64 (where the tests above meet 1e-6)."""
    (req,) = probe_requests(["lmax"], {})
    assert req.options.tol is None
    assert req.options.resolved_tol(torch.float32) == 1e-3 and req.options.resolved_tol(torch.float64) == 1e-6
    r = run_probe(make_case("mlp"), k=1)
    assert r.details["tol"] == 1e-6 and r.details["converged"] == [True]


def test_a_stall_at_the_round_off_floor_is_reported_as_converged_to_noise(monkeypatch):
    """The lmax probe on a float32 operator asked for a tolerance below float32 round-off: the
    recurrence stalls, and the probe says the values are as converged as the dtype allows."""
    import flatcheck.probes.lmax as lmax_mod

    A = _spectrum_matrix([10.0, 5.0] + [1.0 / (i + 1) for i in range(200)]).float()

    class Float32Operator(DenseOperator):
        def __init__(self, backend, matrix):
            super().__init__(A)

    monkeypatch.setattr(lmax_mod, "CurvatureOperator", Float32Operator)
    monkeypatch.setattr(lmax_mod, "check_k_fits", lambda k, dim: None)
    r = run_probe(make_case("mlp"), k=1, tol=1e-12, max_iter=150)
    d = r.details
    assert d["stop_reason"] == "stalled" and d["converged_to_noise"] is True
    assert "converged to noise" in r.notes and "NOT converged" not in r.notes
    assert r.value == pytest.approx(10.0, rel=1e-5)


def test_lanczos_budget_reports_true_residuals_of_what_it_reached():
    """A spent budget ends the recurrence after the step in progress (once k Ritz values exist);
    the reported residuals are the true ones, from the products already made (no product
    after the budget), so Weyl's bound still places each value."""
    eigs = [10.0, 9.9, 9.8] + [1.0 / (i + 1) for i in range(300)]
    A = _spectrum_matrix(eigs)
    op = DenseOperator(A)
    r = lanczos_top(op, 2, generator=gen(), tol=1e-12, should_stop=lambda: op.matvecs >= 6)
    assert r.stop_reason == "budget" and r.iterations == 6 and r.matvecs == 6
    truth_ = torch.linalg.eigvalsh(A)
    for value, res in zip(r.values, r.residuals):
        assert (truth_ - value).abs().min().item() <= res + 1e-12


def test_power_budget_stops_with_what_it_reached():
    A = _spectrum_matrix([10.0, 9.5] + [0.1 * i for i in range(50)])
    op = DenseOperator(A)
    r = power_top(op, 2, generator=gen(), tol=1e-12, max_iter=1000, should_stop=lambda: op.matvecs >= 5)
    assert r.stop_reason == "budget" and r.iterations == 5 and len(r.values) == 1
    assert (torch.linalg.eigvalsh(A) - r.values[0]).abs().min().item() <= r.residuals[0] + 1e-12
