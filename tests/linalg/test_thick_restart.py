"""Thick-restarted Lanczos (linalg/thick_restart.py): the top-k eigenpairs in a basis of fixed
size, against dense float64 truth and against the full-basis Lanczos it stands in for."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.dense import DenseOperator
from flatcheck.linalg.lanczos import lanczos_top
from flatcheck.linalg.thick_restart import RestartedLanczos, lanczos_top_restarted, min_rows, restart_keep


def clustered(n=300, seed=0):
    """A symmetric matrix whose top three eigenvalues are close (10, 9.5, 9.2) above a dense
    bulk on [−3, 8.5]: slow for a small Krylov space, so restarts are many."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    ev = torch.cat([torch.tensor([10.0, 9.5, 9.2]), torch.linspace(-3, 8.5, n - 3)]).double()
    return Q @ torch.diag(ev) @ Q.T, ev.sort(descending=True).values


@pytest.mark.parametrize("k, rows", [(1, 3), (1, 8), (3, 6), (3, 20), (5, 12)])
def test_top_k_agree_with_dense_truth_within_the_residual_bound(k, rows):
    A, ev = clustered()
    tol = 1e-8
    res, restarts = lanczos_top_restarted(DenseOperator(A), k, rows=rows, generator=torch.Generator().manual_seed(1),
                                          tol=tol, max_iter=5000)
    assert res.stop_reason == "converged" and all(res.converged) and restarts > 0
    gap = (ev[k - 1] - ev[k]).item()
    for value, r, truth, vec in zip(res.values, res.residuals, ev[:k].tolist(), res.vectors):
        # a Ritz value with residual r lies within r of an eigenvalue, and within r²/gap once
        # it is the nearest (Kato–Temple); the residual reported is the true one
        assert abs(value - truth) <= r * r / gap + 1e-12 * abs(truth)
        assert math.isclose(torch.linalg.vector_norm(A @ vec - value * vec).item(), r, rel_tol=1e-6, abs_tol=1e-12)
    for value, bound in zip(res.values, res.bounds):  # the stop is on the error bound
        assert bound.value <= tol * abs(value)
    assert res.matvecs >= res.iterations + k  # the confirmation products are counted


def test_values_equal_full_lanczos_while_the_basis_holds_every_step():
    """Until the basis fills, the restarted recurrence is the full one: with room for every
    step, nothing is counted as a restart (the convergence check's own is not), and both stop
    at the same step with the same values."""
    A, _ = clustered()
    full = lanczos_top(DenseOperator(A), 2, generator=torch.Generator().manual_seed(3), tol=1e-8, max_iter=200)
    same, restarts = lanczos_top_restarted(DenseOperator(A), 2, rows=200, generator=torch.Generator().manual_seed(3),
                                           tol=1e-8, max_iter=200)
    assert restarts == 0 and same.iterations == full.iterations
    assert same.values == pytest.approx(full.values, rel=1e-12)


def test_the_lanczos_relation_holds_after_restarts():
    """H V = V T + β v eₙᵀ with T the measured projection, arrowhead after a restart: what
    makes β·|s| the Ritz residual the stopping rule reads."""
    A, _ = clustered(120)
    lz = RestartedLanczos(DenseOperator(A), torch.ones(120, dtype=torch.float64), rows=7)
    for _ in range(30):
        lz.step()
        if lz.full:
            lz.restart(restart_keep(7, 2))
    lz.step()
    n = lz.n
    V, T = lz.V[:n], torch.from_numpy(lz.T[:n, :n])
    assert torch.allclose(V @ V.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    rel = (V @ A) - T @ V
    rel[-1] -= lz.beta * lz.V[n]
    assert torch.linalg.matrix_norm(rel).item() <= 1e-11 * torch.linalg.matrix_norm(A).item()
    assert lz.restarts >= 4


def test_budget_stop_reports_the_recurrences_own_residuals_without_a_product():
    A, _ = clustered()
    op = DenseOperator(A)
    calls = iter(range(10**6))
    res, _ = lanczos_top_restarted(op, 1, rows=5, generator=torch.Generator().manual_seed(1), tol=1e-12,
                                   max_iter=5000, should_stop=lambda: next(calls) >= 20)
    assert res.stop_reason == "budget" and res.iterations == 21 and op.matvecs == 21
    y = res.vectors[0]
    assert math.isclose(torch.linalg.vector_norm(A @ y - res.values[0] * y).item(), res.residuals[0], rel_tol=1e-6)


def test_a_warm_start_from_the_answer_converges_at_once():
    A, ev = clustered()
    top = torch.linalg.eigh(A).eigenvectors[:, -1:].T
    cold, _ = lanczos_top_restarted(DenseOperator(A), 1, rows=4, generator=torch.Generator().manual_seed(1),
                                    tol=1e-8, max_iter=5000)
    warm, _ = lanczos_top_restarted(DenseOperator(A), 1, rows=4, generator=torch.Generator().manual_seed(1),
                                    tol=1e-8, max_iter=5000, start=top)
    assert abs(warm.values[0] - ev[0].item()) <= warm.bounds[0].value + 1e-12
    assert warm.iterations < cold.iterations


def test_min_rows_and_keep():
    assert min_rows(1) == 3 and min_rows(5) == 7
    assert restart_keep(3, 1) == 1 and restart_keep(8, 1) == 4 and restart_keep(12, 5) == 8
    with pytest.raises(ValueError):
        RestartedLanczos(DenseOperator(torch.eye(3, dtype=torch.float64)), torch.ones(3, dtype=torch.float64), rows=1)
