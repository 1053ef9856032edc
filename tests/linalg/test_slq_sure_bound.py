"""spectrum's Tr(H²) and ‖H‖_F against the sure lower bound its Krylov spaces give, and against
dense float64 truth.

A start's Krylov space Q gives ‖H‖_F² = ‖QᵀHQ‖_F² + 2β_m² + ‖P⊥HP⊥‖_F²: the first two parts are
known exactly, so their sum is a sure lower bound, and the value (each start's exact part plus a
deflated Hutchinson draw of the third) is never below it. The Gauss rule alone, rᵀH²r, fell
below the bound it printed beside it in 64 of 100 runs on a stranger's 916-parameter MLP, with
an interval reaching below zero; each test here fails on that estimator.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flatcheck.config import probe_requests
from flatcheck.linalg.slq import Z95, slq, start_variance_floor
from flatcheck.probes.registry import ProbeContext, create_probe
from tests.probes.test_spectrum_coverage import matrices  # noqa: F401  (the fixture: the MLP's and CNN's H, G)
from tests.support.dense import DenseOperator, dense, make_case

SEEDS = 60
EPS = torch.finfo(torch.float64).eps


@pytest.mark.parametrize("steps", [30, 10])
def test_the_value_and_its_interval_never_fall_below_the_sure_bound(matrices, steps):
    """Over 60 seeds of 2 starts on each matrix: Tr(H²) and ‖H‖_F are at least the sure bound,
    and so is their interval's lower end. The Gauss-rule mean of the same starts (the value
    before) falls below the bound in at least a quarter of these runs: checked, so that the test
    tells the two apart."""
    gauss_below, below, estimates = 0, [], []
    for name, A in matrices.items():
        truth = (A * A).sum().item()
        for seed in range(SEEDS):
            run = slq(DenseOperator(A), steps=steps, starts=2, generator=torch.Generator().manual_seed(seed),
                      deflate=True)
            est = start_variance_floor(run)
            sq, fro = est["trace_sq"], est["frobenius"]
            assert sq.ritz_lower_bound <= truth * (1 + 1e-12), (name, seed)  # sure: a compression's norm
            if sq.value < sq.ritz_lower_bound or fro.value < fro.ritz_lower_bound:
                below.append(f"{name} seed {seed}")
            estimates.append(est)
            gauss_below += float(run.moment(2).mean()) < sq.ritz_lower_bound
    assert not below, below
    assert gauss_below >= SEEDS, gauss_below  # of 4 × 60 runs
    for est in estimates:
        sq, fro = est["trace_sq"], est["frobenius"]
        assert sq.interval95[0] >= sq.ritz_lower_bound and fro.interval95[0] >= fro.ritz_lower_bound
        assert fro.value == pytest.approx(math.sqrt(sq.value), rel=1e-14)
        assert sq.interval95[1] == pytest.approx(sq.value + Z95 * sq.stderr, rel=1e-14)


def test_the_value_is_far_closer_to_the_truth_than_the_gauss_rule():
    """The deflated estimate's error is that of the rest the Krylov space left out: at 30 of a
    254-parameter MLP's dimensions its rms error over 60 seeds is a small fraction of the Gauss
    rule's of the same starts, and its stated stderr is not below that error's scale."""
    A = dense(make_case("mlp"))[1]
    truth = (A * A).sum().item()
    err, gauss_err, stderr = [], [], []
    for seed in range(SEEDS):
        run = slq(DenseOperator(A), steps=30, starts=2, generator=torch.Generator().manual_seed(seed), deflate=True)
        sq = start_variance_floor(run)["trace_sq"]
        err.append(sq.value - truth)
        gauss_err.append(float(run.moment(2).mean()) - truth)
        stderr.append(sq.stderr)
    rms, gauss_rms = np.sqrt(np.mean(np.square(err))), np.sqrt(np.mean(np.square(gauss_err)))
    assert rms < 0.1 * gauss_rms, (rms, gauss_rms)
    assert np.mean(np.abs(err) <= Z95 * np.array(stderr)) >= 0.9


def low_rank(dim: int, eigenvalues: list[float], seed: int = 0) -> torch.Tensor:
    Q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    lam = torch.zeros(dim, dtype=torch.float64)
    lam[:len(eigenvalues)] = torch.tensor(eigenvalues, dtype=torch.float64)
    return Q @ torch.diag(lam) @ Q.T


def test_a_closed_krylov_space_gives_the_exact_value():
    """20 distinct nonzero eigenvalues in 120 dimensions (a network's Hessian has many zero
    ones): each start's Krylov space closes after 21 steps holding H's whole range, so the rest
    P⊥HP⊥ is 0 and Tr(H), Tr(H²) and ‖H‖_F are exact to round-off, with stderrs at round-off.
    The Gauss rule of the same starts is a Hutchinson draw, off by tens of per cent. A repeated
    eigenvalue is where a closed space is not the whole story (below)."""
    lam = [8.0, -3.0, 2.5] + [0.1 * (k + 1) for k in range(17)]
    A = low_rank(120, lam)
    truth = {"trace": A.trace().item(), "trace_sq": (A * A).sum().item(), "frobenius": torch.linalg.norm(A).item()}
    run = slq(DenseOperator(A), steps=100, starts=2, generator=torch.Generator().manual_seed(3), deflate=True)
    assert all(r.invariant and r.steps == 21 for r in run.rules)
    scale = max(abs(x) for x in lam)
    tol = 1e3 * EPS * scale * scale * len(lam)
    for key, est in start_variance_floor(run).items():
        assert abs(est.value - truth[key]) <= tol, (key, est.value, truth[key])
        # Tr(H)'s floor is √(2·Tr C²), Tr C² known to round-off: its stderr is at √round-off
        assert est.stderr <= (math.sqrt(tol) if key == "trace" else tol), (key, est.stderr)
    gauss = float(run.moment(2).mean())
    assert abs(gauss - truth["trace_sq"]) > 1e6 * tol  # the old value: not exact at all

    # Four eigenvalues, each 15 times: a start's space closes after 4 steps with one copy of
    # each, so the sure bound holds 1/15 of Tr(H²) and a closed space is not exact; the deflated
    # draw of the other 14 copies carries the value, unbiased: over 60 seeds its mean is within
    # 4 standard errors of the truth, and each run's interval covers the truth at a rate 95 %
    # does not reject (≥ 53 of 60: P < 1 % below)
    n = 60
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    A = Q @ torch.diag(torch.tensor([-1.0, 0.5, 2.0, 7.0], dtype=torch.float64).repeat_interleave(15)) @ Q.T
    truth = (A * A).sum().item()
    values, covered = [], 0
    for seed in range(SEEDS):
        run = slq(DenseOperator(A), steps=30, starts=2, generator=torch.Generator().manual_seed(seed), deflate=True)
        sq = start_variance_floor(run)["trace_sq"]
        assert sq.ritz_lower_bound == pytest.approx(1 + 0.25 + 4 + 49, rel=1e-9)
        values.append(sq.value)
        covered += abs(sq.value - truth) <= Z95 * sq.stderr
    values = np.array(values)
    assert abs(values.mean() - truth) <= 4 * values.std(ddof=1) / math.sqrt(SEEDS)
    assert covered >= 53


def test_the_probe_on_a_network_whose_krylov_space_closes_reports_the_dense_truth():
    """The stranger's worst case: --lanczos-steps past the parameter count, every start's space
    closed, the sure bound equal to the truth and the headline half of it. In float64 on a
    254-parameter MLP the headline, Tr(H²) and Tr(H) equal the dense truth to round-off."""
    case = make_case("mlp")
    H, _ = dense(case)
    (req,) = probe_requests(["spectrum"], {"spectrum": {"starts": 2, "lanczos_steps": 400}})
    r = create_probe("spectrum").run(ProbeContext(case.backend(), seed=0), req.options)
    assert r.details["stop_reason"] == "closed"
    fro = torch.linalg.norm(H).item()
    tol = 1e-8 * fro  # a breakdown leaves out directions below √eps·‖T‖ (lanczos.breakdown_threshold)
    assert abs(r.value - fro) <= tol and r.stderr <= tol
    assert r.value >= r.details["frobenius"]["ritz_lower_bound"]
    assert abs(r.details["trace"]["value"] - H.trace().item()) <= tol * math.sqrt(H.shape[0])


def test_a_closed_krylov_space_still_has_a_round_off_interval():
    """Where every start's Krylov space closes (a tiny model at 300 steps), the starts agree to
    round-off and the stderr was 0 or ~1e-16 relative: an interval of zero width that missed the
    exact value by ulps (a reviewer's finding). The probe floors it at ROUNDOFF_UNITS·eps, and
    the float64 truth lies inside."""
    import math
    import warnings

    import flatcheck
    from flatcheck.linalg.certify import ROUNDOFF_UNITS
    from tests.support.dense import dense, make_case

    case = make_case("mlp", n=23)
    H, _ = dense(case)
    ev = torch.linalg.eigvalsh(H)
    t1, t2 = float(ev.sum()), float((ev ** 2).sum())
    eps = torch.finfo(torch.float64).eps
    for seed in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rep = flatcheck.measure(case.model, (case.X, case.Y), dtype="float64", seed=seed,
                                    probes={"spectrum": {"lanczos_steps": 300, "starts": 2}})
        d = rep.results["spectrum"].details
        for key, truth in (("trace", t1), ("trace_sq", t2)):
            est = d[key]
            assert est["stderr"] >= ROUNDOFF_UNITS * eps * abs(est["value"]) * (1 - 1e-12)
            lo, hi = est["interval95"]
            assert lo <= truth <= hi, (key, seed, lo, truth, hi)
        assert math.isclose(rep.results["spectrum"].value, math.sqrt(t2), rel_tol=1e-12)
