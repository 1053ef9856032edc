"""The certified stop (linalg/certify.py) against dense float64 spectra of small foreign models.

A Ritz value's error bound is r²/δ (Kato–Temple) with δ estimated from the neighbouring Ritz
values, or the residual r where no gap is resolved. The gap estimate can overstate δ (a Ritz
value lies at or below its eigenvalue), so the bound is a claim to be measured: over ≥ 50 seeds
of each of four small architectures (tests/support/spectra.py: a tanh MLP, a small CNN, a
one-head transformer, and a twin whose top pair is a fraction of a percent apart), the dense
eigenvalue lies within the reported bound in ≥ 99 % of the values of lmax's default solver,
block Lanczos from two starts (linalg/block_lanczos.py), and the r²/δ route, not the fallback,
decides most stops. The only allowance besides the bound is float64 round-off of the
products, 64·eps·‖H‖. A one-vector Krylov space fails the twin (an expected failure): the
reason lmax starts from two vectors.
"""

from __future__ import annotations

import pytest
import torch

from flatcheck.linalg.certify import GAP_SAFETY, KATO_TEMPLE, RESIDUAL, TOO_FEW, ritz_bounds
from flatcheck.linalg.block_lanczos import block_lanczos_top
from flatcheck.linalg.lanczos import lanczos_top

from tests.support.spectra import Dense, hessian, small_problem

SEEDS = 50
TOLS = (1e-3, 1e-6)  # the float32 and float64 defaults
ROUNDOFF = 64 * torch.finfo(torch.float64).eps


def _case(arch: str, seed: int) -> torch.Tensor:
    return hessian(*small_problem(arch, seed))


def _coverage(arch: str, runs, solve=block_lanczos_top) -> tuple[int, int, int, int]:
    """(values within their bound, values, stops λ1's r²/δ decided, stops) of `solve` over
    SEEDS seeds and the (tol, k) of `runs`."""
    values = within = certified = stops = 0
    for seed in range(SEEDS):
        H = _case(arch, seed)
        truth = torch.linalg.eigvalsh(H).flip(0)
        slack = ROUNDOFF * truth.abs().max().item()
        for tol, k in runs:
            r = solve(Dense(H), k, generator=torch.Generator().manual_seed(seed), tol=tol)
            assert r.stop_reason in ("converged", "invariant")
            stops += 1
            certified += r.bounds[0].kind == KATO_TEMPLE
            for i, (v, b) in enumerate(zip(r.values, r.bounds)):
                values += 1
                within += abs(v - truth[i].item()) <= b.value + slack
                assert b.value <= tol * abs(v) or r.stop_reason == "invariant"
    print(f"\n{arch} {runs} {solve.__name__}: truth within the bound for {within}/{values} values; r²/δ decided "
          f"{certified}/{stops} stops (λ1's bound)")
    return within, values, certified, stops


@pytest.mark.statistical
@pytest.mark.parametrize("arch", ["mlp", "cnn", "transformer"])
def test_the_truth_lies_within_the_certified_bound(arch):
    within, values, certified, stops = _coverage(arch, [(TOLS[0], 1), (TOLS[1], 3)])
    assert within >= 0.99 * values
    assert certified > stops / 2


def _twin_is_near_degenerate() -> None:
    gaps = []
    for seed in range(SEEDS):
        truth = torch.linalg.eigvalsh(_case("twin", seed)).flip(0)
        gaps.append((truth[0] - truth[1]).item() / truth[0].abs().item())
    assert sorted(gaps)[len(gaps) // 2] < 1e-2  # the case is what it claims


@pytest.mark.statistical
def test_a_near_degenerate_top_pair_is_within_its_bound():
    """Two near-copies side by side: λ1 and λ2 (and every later pair) a fraction of a percent
    apart. Two starts carry two directions into the pair, so the second Ritz value follows λ2
    and the gap is the true one; at tol 1e-3 it is too narrow for r²/δ, and the residual
    decides (measured: r²/δ decided 2 of 50 stops at 1e-3, 50 of 50 at 1e-6)."""
    _twin_is_near_degenerate()
    within, values, certified, stops = _coverage("twin", [(TOLS[0], 1), (TOLS[1], 1), (TOLS[1], 3)])
    assert within >= 0.99 * values


@pytest.mark.statistical
@pytest.mark.xfail(strict=True, reason="a near-degenerate pair a one-vector Krylov space has not resolved hides λ2 "
                                      "and the Ritz gap overstates δ (measured: λ1 within r²/δ for 5/50 seeds at tol "
                                      "1e-6, 38/50 at 1e-3)")
def test_one_start_cannot_bound_a_near_degenerate_top_pair():
    """The same twin with lmax --starts 1: the r²/δ stop comes before the Krylov space has
    resolved the pair (7 products at tol 1e-3, 11 at 1e-6), the hidden λ2 makes the estimated
    gap too wide, and λ1 lies outside its bound; the residual stop missed it too at 1e-6 (λ1
    within r for 40/50 seeds)."""
    _twin_is_near_degenerate()
    within, values, certified, stops = _coverage("twin", [(TOLS[1], 1)], solve=lanczos_top)
    assert within >= 0.99 * values


def test_a_gap_no_wider_than_the_residual_falls_back_to_it():
    tight, loose = ritz_bounds([1.0, 0.99], [0.02, 0.02], (0.5, 0.0))
    assert tight.kind == RESIDUAL and tight.value == 0.02
    assert loose.kind == RESIDUAL  # its gap above (θ1 less θ1's residual) is 0.0 - no wider than r
    (top,) = ritz_bounds([1.0], [0.01], (0.5, 0.1))
    # the gap to 0.5 less its residual 0.1, halved against an eigenvalue not yet seen
    assert top.kind == KATO_TEMPLE and top.gap == pytest.approx(0.4 / GAP_SAFETY)
    assert top.value == pytest.approx(1e-4 / top.gap)
    (alone,) = ritz_bounds([1.0], [0.01], None)
    assert alone.kind == RESIDUAL and alone.gap is None
    (early,) = ritz_bounds([1.0], [0.01], TOO_FEW)  # a Krylov space too small to tell a gap
    assert early.kind == RESIDUAL and early.value == 0.01
