"""Block Lanczos (linalg/block_lanczos.py) against dense float64 eigendecompositions.

The statistical coverage of its bounds on foreign architectures and a near-degenerate pair is
in test_certify.py; here, what must hold exactly: the residuals it takes from the products'
coefficients are the true residuals, it finds both copies of a repeated eigenvalue, and its
stops (budget, invariant, stalled) say what happened."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flatcheck.linalg.block_lanczos import BLOCK, BlockLanczos, block_lanczos_top
from flatcheck.linalg.lanczos import coefficient_residuals

from tests.support.spectra import Dense, hessian, small_problem

EPS = torch.finfo(torch.float64).eps


def _spectrum_matrix(values, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(torch.randn(len(values), len(values), generator=g, dtype=torch.float64))
    return Q @ torch.diag(torch.tensor(values, dtype=torch.float64)) @ Q.T


@pytest.mark.parametrize("block,steps,capacity,rank", [(BLOCK, 5, 40, None), (3, 12, 40, None), (5, 9, 45, None),
                                                      (3, 10, 37, 20)])
def test_residuals_from_the_coefficients_are_the_true_ones(block, steps, capacity, rank):
    """Also with blocks whose rows straddle the basis' storage blocks of INITIAL_ROWS, a basis
    filled to its capacity, and a rank-deficient H whose Krylov space closes (rows dropped)."""
    H = hessian(*small_problem("cnn", 3))
    if rank is not None:
        w, U = torch.linalg.eigh(H)
        H = U[:, -rank:] @ torch.diag(w[-rank:]) @ U[:, -rank:].T
    lz = BlockLanczos(Dense(H), torch.randn(block, H.shape[0], generator=torch.Generator().manual_seed(0),
                                            dtype=torch.float64), capacity)
    for _ in range(steps):
        if not lz.can_step:
            break
        lz.step()
    theta, S = lz.ritz()
    values, res = coefficient_residuals(lz.coefficients(), np.asarray(lz.outside), S[:, -3:])
    Y = lz.vectors(S[:, -3:])
    Y = Y / Y.norm(dim=1, keepdim=True)
    scale = torch.linalg.matrix_norm(H, 2).item()
    for y, v, r in zip(Y, values, res):
        assert v == pytest.approx((y @ H @ y).item(), abs=100 * EPS * scale)
        assert r == pytest.approx((H @ y - v * y).norm().item(), abs=100 * EPS * scale)
    # the basis stays orthonormal to round-off
    Q = torch.cat(lz._basis())
    assert torch.allclose(Q @ Q.T, torch.eye(Q.shape[0], dtype=torch.float64), atol=1e3 * EPS)


def test_the_top_values_agree_with_the_dense_spectrum_within_their_bounds():
    H = hessian(*small_problem("transformer", 1))
    truth = torch.linalg.eigvalsh(H).flip(0)
    r = block_lanczos_top(Dense(H), 3, generator=torch.Generator().manual_seed(0), tol=1e-8)
    assert r.stop_reason == "converged" and all(r.converged)
    for i, (v, b) in enumerate(zip(r.values, r.bounds)):
        assert abs(v - truth[i].item()) <= b.value + 64 * EPS * truth.abs().max().item()
        assert b.value <= 1e-8 * abs(v)
    # a step takes the whole block, or one row where it is likely the last (likely_last)
    assert 2 * r.iterations - 2 <= r.matvecs <= 2 * r.iterations and r.method == "block lanczos"


def test_both_copies_of_a_repeated_top_eigenvalue_are_found():
    """A one-vector Krylov space holds one direction of an eigenspace in exact arithmetic (it
    finds a second copy only through round-off or a restart); two starts hold two."""
    H = _spectrum_matrix([5.0, 5.0] + list(np.linspace(0.0, 3.0, 198)))
    r = block_lanczos_top(Dense(H), 2, generator=torch.Generator().manual_seed(2), tol=1e-10)
    assert r.values == pytest.approx([5.0, 5.0], abs=1e-10) and r.stop_reason == "converged"


def test_a_budget_stops_after_a_step_and_reports_what_it_reached():
    H = hessian(*small_problem("mlp", 0))
    calls = []

    def spent() -> bool:
        calls.append(1)
        return len(calls) >= 2

    r = block_lanczos_top(Dense(H), 1, generator=torch.Generator().manual_seed(0), tol=1e-12, should_stop=spent)
    assert r.stop_reason == "budget" and r.matvecs == 2 * BLOCK and r.iterations == 2
    truth = torch.linalg.eigvalsh(H)[-1].item()
    assert r.values[0] <= truth + 1e-12  # a Ritz value: a lower bound of λmax


def test_a_small_space_closes_and_is_exact():
    H = _spectrum_matrix([3.0, 1.0, -2.0])
    r = block_lanczos_top(Dense(H), 2, generator=torch.Generator().manual_seed(0), tol=1e-6)
    assert r.stop_reason in ("converged", "invariant")
    assert r.values == pytest.approx([3.0, 1.0], abs=1e-12) and r.matvecs <= 3


def test_carry_next_is_the_unit_ritz_vector_below_the_top():
    H = hessian(*small_problem("cnn", 0))
    r = block_lanczos_top(Dense(H), 1, generator=torch.Generator().manual_seed(0), tol=1e-6, carry_next=True)
    assert r.next_vector is not None
    assert r.next_vector.norm().item() == pytest.approx(1.0, abs=1e-12)
    assert abs(torch.dot(r.next_vector, r.vectors[0]).item()) < 1e-10
    truth = torch.linalg.eigvalsh(H).flip(0)
    rq = (r.next_vector @ H @ r.next_vector).item()
    assert truth[2].item() - 1e-8 < rq <= truth[1].item() + 1e-12  # it follows λ2


class Noisy(Dense):
    """Products with an asymmetric relative error of `noise`: the round-off of a float32 product."""

    def __init__(self, H: torch.Tensor, noise: float):
        super().__init__(H)
        self.noise, self.g = noise, torch.Generator().manual_seed(9)

    def matmat(self, V):
        out = super().matmat(V)
        return out + self.noise * out.norm(dim=1, keepdim=True) * torch.randn(out.shape, generator=self.g,
                                                                              dtype=out.dtype) / out.shape[1] ** 0.5


def test_a_bound_held_up_by_the_products_noise_stops_as_stalled():
    H = hessian(*small_problem("cnn", 1))
    r = block_lanczos_top(Noisy(H, 1e-5), 1, generator=torch.Generator().manual_seed(0), tol=1e-12)
    assert r.stop_reason == "stalled" and r.matvecs < H.shape[0]
    assert not r.converged[0] and r.bounds[0].value > 1e-12 * abs(r.values[0])
    truth = torch.linalg.eigvalsh(H)[-1].item()
    assert abs(r.values[0] - truth) <= r.bounds[0].value + 1e-5 * abs(truth)


def test_progress_counts_products_and_ends_at_its_total():
    H = hessian(*small_problem("mlp", 2))
    seen = []
    r = block_lanczos_top(Dense(H), 1, generator=torch.Generator().manual_seed(0), tol=1e-6,
                          progress=lambda done, total, **kw: seen.append((done, total, kw["value"])))
    done = [d for d, _, _ in seen[:-1]]
    # a step's products: the whole block, or one row where the step is likely the last
    assert done[0] == BLOCK and all(b - a in (1, BLOCK) for a, b in zip(done, done[1:]))
    assert seen[-1][:2] == (r.matvecs, r.matvecs) and seen[-1][2] == pytest.approx(r.values[0])


def test_max_iter_caps_the_products_even_below_a_block():
    H = hessian(*small_problem("mlp", 1))
    r = block_lanczos_top(Dense(H), 1, generator=torch.Generator().manual_seed(0), tol=1e-12, max_iter=5)
    assert r.matvecs == 5 and r.stop_reason == "max_iter" and not r.converged[0]
    one = block_lanczos_top(Dense(H), 1, generator=torch.Generator().manual_seed(0), tol=1e-12, max_iter=1)
    assert one.matvecs == 1 and one.stop_reason == "max_iter"


def test_a_block_that_fills_its_rows_goes_on_thick_restarted_from_its_best_vectors():
    from flatcheck.linalg.block_lanczos import block_lanczos_top_restarted

    H = hessian(*small_problem("cnn", 2))
    truth = torch.linalg.eigvalsh(H).flip(0)
    op = Dense(H)
    r, restarts = block_lanczos_top_restarted(op, 1, rows=6, generator=torch.Generator().manual_seed(0), tol=1e-10,
                                              max_iter=200)
    assert r.method == "lanczos" and restarts >= 1 and r.stop_reason == "converged"
    assert r.matvecs == op.matvecs  # the block's products counted in
    assert abs(r.values[0] - truth[0].item()) <= r.bounds[0].value + 64 * EPS * truth.abs().max().item()
    roomy, none = block_lanczos_top_restarted(Dense(H), 1, rows=100, generator=torch.Generator().manual_seed(0),
                                              tol=1e-10, max_iter=200)
    assert roomy.method == "block lanczos" and none == 0 and roomy.stop_reason == "converged"


@pytest.mark.parametrize("block,max_iter", [(2, 9), (2, 11), (3, 7), (3, 10)])
def test_a_last_block_cut_short_keeps_its_residuals_true(block, max_iter):
    """The last step has room for fewer rows than the block: the leftovers it cannot take stay
    outside the basis, added to the residuals by the triangle inequality, so every reported
    residual is at least the true one and the truth lies within every bound."""
    H = hessian(*small_problem("cnn", 4))
    r = block_lanczos_top(Dense(H), 2, generator=torch.Generator().manual_seed(1), tol=1e-14, max_iter=max_iter,
                          block=block)
    assert r.matvecs == max_iter
    scale = torch.linalg.matrix_norm(H, 2).item()
    truth = torch.linalg.eigvalsh(H).flip(0)
    for y, v, res, b, want in zip(r.vectors, r.values, r.residuals, r.bounds, truth.tolist()):
        assert v == pytest.approx((y @ H @ y).item(), abs=1e3 * EPS * scale)
        assert res >= (H @ y - v * y).norm().item() - 1e3 * EPS * scale
        assert abs(v - want) <= b.value + 64 * EPS * scale


def test_a_handover_reports_one_run_of_progress():
    from flatcheck.linalg.block_lanczos import block_lanczos_top_restarted

    H = hessian(*small_problem("cnn", 2))
    seen = []
    r, _ = block_lanczos_top_restarted(Dense(H), 1, rows=6, generator=torch.Generator().manual_seed(0), tol=1e-10,
                                       max_iter=200, progress=lambda d, t, **kw: seen.append((d, t)))
    done = [d for d, _ in seen]
    assert done == sorted(done) and done[-1] == r.matvecs
    # the end (done == total) is reported once, at the end
    assert [i for i, (d, t) in enumerate(seen) if d == t] == [len(seen) - 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_finite_finds_any_non_finite_entry(dtype):
    """linalg.reduce.all_finite against torch.isfinite: a NaN, either infinity, or a pair of
    infinities that cancel in a sum, anywhere; and finite entries whose sum overflows."""
    from flatcheck.linalg.reduce import all_finite

    block = torch.randn(2, 1000, dtype=dtype, generator=torch.Generator().manual_seed(0))
    assert all_finite(block)
    for bad in ([float("nan")], [float("inf")], [-float("inf")], [float("inf"), -float("inf")]):
        b = block.clone()
        b[1, 10:10 + len(bad)] = torch.tensor(bad, dtype=dtype)
        assert not all_finite(b) and not bool(torch.isfinite(b).all())
    huge = torch.full((1, 4), torch.finfo(dtype).max, dtype=dtype)
    assert all_finite(huge)


class Overflowing(Dense):
    """A dense operator whose products overflow to infinity from the second on."""

    def matmat(self, V):
        out = super().matmat(V)
        if self.matvecs > V.shape[0]:
            out[:, 0] = float("inf")
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("solver", ["block", "one vector", "restarted", "power"])
def test_products_that_overflow_advise_float64_only_below_it(dtype, solver):
    """Every solver's error for non-finite products names --dtype float64 as the remedy only
    where the run was not already in float64 (there the model itself is at fault)."""
    from flatcheck.errors import InputError
    from flatcheck.linalg.lanczos import lanczos_top
    from flatcheck.linalg.power import power_top
    from flatcheck.linalg.thick_restart import lanczos_top_restarted

    op = Overflowing(_spectrum_matrix(np.linspace(1.0, 10.0, 30)).to(dtype))
    g = torch.Generator().manual_seed(0)
    run = {"block": lambda: block_lanczos_top(op, 1, generator=g, tol=1e-9),
           "one vector": lambda: lanczos_top(op, 1, generator=g, tol=1e-9),
           "restarted": lambda: lanczos_top_restarted(op, 1, rows=8, generator=g, tol=1e-9, max_iter=30),
           "power": lambda: power_top(op, 1, generator=g, tol=1e-9)}[solver]
    with pytest.raises(InputError, match="not finite") as err:
        run()
    assert ("--dtype float64" in str(err.value)) == (dtype != torch.float64)
