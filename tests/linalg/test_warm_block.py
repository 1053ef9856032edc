"""linalg/warm_block: the Tracker's warm λmax from a block of the previous call's top and next
eigenvectors, against dense float64 spectra.

The block's gap comes from its (k+1)-th Ritz value, an estimate (an eigenvalue neither the block
nor its growth has seen can lie inside the gap), so its honesty is measured where it is used:
along gradient-descent trajectories of three small foreign architectures (tests/support/
spectra.py), tracked as the Tracker does it (a cold start, then each call warm from the last
result, the top and next vectors carried one step on), the dense λ1 lies within the reported
bound in ≥ 99 % of the tracked values, and the block's own r²/δ decides most stops. The only
allowance besides the bound is float64 round-off of the products, 64·eps·‖H‖.
"""

from __future__ import annotations

import pytest
import torch

from flatcheck.linalg.certify import GAP_FROM_BLOCK, KATO_TEMPLE
from flatcheck.linalg.lanczos import lanczos_top
from flatcheck.linalg.warm_block import block_top
from flatcheck.workflows.track import extrapolated_block

from tests.support.spectra import Dense, hessian, small_problem

ROUNDOFF = 64 * torch.finfo(torch.float64).eps
TOLS = (1e-3, 1e-6)  # the float32 and float64 defaults
SEEDS = 6  # trajectories per architecture and tolerance
TRACKED = 25  # tracked steps per trajectory, the first cold
EVERY = 5  # gradient-descent steps between tracked steps


def _spectrum(seed: int, n: int = 60, top=(10.0, 7.0, 5.0)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    values = torch.cat([torch.tensor(top, dtype=torch.float64), torch.rand(n - len(top), generator=g,
                                                                           dtype=torch.float64)])
    return Q, values


def test_the_residuals_are_those_of_the_vectors_reported_and_every_product_is_counted():
    Q, values = _spectrum(0)
    A = Q @ torch.diag(values) @ Q.T
    g = torch.Generator().manual_seed(1)
    E = torch.randn(A.shape, generator=g, dtype=torch.float64) * 0.05
    A = A + (E + E.T) / 2  # the weights moved: the old eigenvectors are a few % off
    op = Dense(A)
    res = block_top(op, 1, Q[:, :2].T.clone(), generator=g, tol=1e-6)
    assert res.matvecs == op.matvecs and res.stop_reason == "converged"
    y = res.vectors[0]
    assert torch.linalg.vector_norm(y).item() == pytest.approx(1.0, abs=1e-12)
    theta = (y @ A @ y).item()
    assert res.values[0] == pytest.approx(theta, abs=1e-12)
    assert res.residuals[0] == pytest.approx(torch.linalg.vector_norm(A @ y - theta * y).item(), abs=1e-12)
    truth = torch.linalg.eigvalsh(A)[-1].item()
    assert res.bounds[0].kind == KATO_TEMPLE and abs(res.values[0] - truth) <= res.bounds[0].value
    assert res.next_vector is not None and abs(float(res.next_vector @ y)) < 1e-10


def test_a_block_of_exact_eigenvectors_needs_its_own_products_alone():
    Q, values = _spectrum(2)
    op = Dense(Q @ torch.diag(values) @ Q.T)
    res = block_top(op, 1, Q[:, :2].T.clone(), generator=torch.Generator().manual_seed(0), tol=1e-3)
    assert res.matvecs == 2 and res.values[0] == pytest.approx(10.0, abs=1e-9)


def test_a_start_without_the_gap_vector_is_refused():
    Q, values = _spectrum(3)
    with pytest.raises(ValueError, match="k \\+ 1"):
        block_top(Dense(Q @ torch.diag(values) @ Q.T), 1, Q[:, :1].T.clone(), generator=torch.Generator())


def test_a_block_that_stops_converging_goes_on_by_lanczos(monkeypatch):
    """When the worst bound has not halved over STALL_GROWTHS growths, lanczos_top takes over
    from the block's best vector; the block's products are counted in the result."""
    from flatcheck.linalg import warm_block

    monkeypatch.setattr(warm_block, "not_halving", lambda history, least: len(history) >= 2)
    Q, values = _spectrum(4, top=(10.0, 9.99, 9.98))
    op = Dense(Q @ torch.diag(values) @ Q.T)
    # vectors unrelated to the eigenvectors and a cluster on top: far from converged after 2 growths
    start = torch.randn(2, op.dim, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    res = block_top(op, 1, start, generator=torch.Generator().manual_seed(0), tol=1e-8)
    assert res.gap_from != GAP_FROM_BLOCK  # Lanczos' Ritz gap
    assert res.matvecs == op.matvecs and res.matvecs > 3
    assert abs(res.values[0] - 10.0) <= res.bounds[0].value + ROUNDOFF * 10


def _track(arch: str, seed: int, tol: float):
    """(value, bound, λ1, the bound's kind, the gap's source, products, round-off) per warm
    tracked step of a gradient-descent run: η from {0.5, 1, 1.5, 1.9}/λ1(w0) by seed, so that
    some runs sit at or past the edge of stability (λ1 ≈ 2/η), where the top pair swaps. A run
    that diverges ends there."""
    loss, w = small_problem(arch, seed)
    H = hessian(loss, w)
    lr = (0.5, 1.0, 1.5, 1.9)[seed % 4] / torch.linalg.eigvalsh(H)[-1].item()
    g = torch.Generator().manual_seed(seed)
    cold = lanczos_top(Dense(H), 1, generator=g, tol=tol, carry_next=True)
    held, previous, out = torch.cat([cold.vectors, cold.next_vector[None]]), None, []
    for _ in range(1, TRACKED):
        for _ in range(EVERY):
            w = w.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(loss(w), w)
            w = (w - lr * grad).detach()
        H = hessian(loss, w)
        if not bool(torch.isfinite(H).all()):
            break
        start = held.clone() if previous is None else extrapolated_block(previous, held)
        op = Dense(H)
        res = block_top(op, 1, start, generator=g, tol=tol)
        assert res.matvecs == op.matvecs
        assert res.converged == [True] or res.stop_reason == "invariant"
        previous, held = held, torch.cat([res.vectors, res.next_vector[None]])
        truth = torch.linalg.eigvalsh(H)[-1].item()
        out.append((res.values[0], res.bounds[0].value, truth, res.bounds[0].kind, res.gap_from,
                    res.matvecs, ROUNDOFF * abs(truth)))
    return out


@pytest.mark.statistical
@pytest.mark.parametrize("arch", ["mlp", "cnn", "transformer"])
def test_tracked_values_lie_within_their_bound_along_gradient_descent(arch):
    rows = [row for tol in TOLS for seed in range(SEEDS) for row in _track(arch, seed, tol)]
    within = sum(abs(v - truth) <= b + slack for v, b, truth, *_, slack in rows)
    by_block = sum(kind == KATO_TEMPLE and source == GAP_FROM_BLOCK for _, _, _, kind, source, *_ in rows)
    products = sorted(n for *_, n, _ in rows)
    # how close to its bound the error comes: the 99th percentile of |θ − λ1| / bound
    ratios = sorted(abs(v - truth) / b for v, b, truth, *_ in rows)
    print(f"\n{arch}: λ1 within the bound for {within}/{len(rows)} tracked values; the block's r²/δ "
          f"decided {by_block}/{len(rows)}; median products {products[len(products) // 2]}; "
          f"err/bound q99 {ratios[int(0.99 * (len(ratios) - 1))]:.3g}, max {ratios[-1]:.3g}")
    assert len(rows) >= 50
    assert within >= 0.99 * len(rows)
    assert by_block > len(rows) / 2
