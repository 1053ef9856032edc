"""Block Lanczos from BLOCK random vectors: the top-k eigenpairs that a cold `lmax` reports.

Why a block. A one-vector Krylov space cannot tell a near-degenerate top pair from one
eigenvalue until its polynomial separates them: the Ritz vector is then a mixture of both
eigenvectors, its Ritz value lies between them, and the next Ritz value, which the
Kato–Temple gap is estimated from (linalg/certify.py), follows λ3, not the λ2 the space has
not resolved. The bound r²/δ is then too small by as much as λ1 − λ2 allows (on the demo CNN's
training run, 8.6× at a pair 0.76 % apart; tests/linalg/test_certify.py's twin: λ1 outside its
bound for 12 of 50 seeds at tol 1e-3). A block of two random starts carries two independent
directions into the pair, so both of its eigenvalues rise together (block Krylov convergence
goes with the gap to λ_{p+1}: Golub & Underwood 1977; Saad 2011, ch. 6), the second Ritz value
follows λ2, and the gap is the honest one. A cluster of more than BLOCK eigenvalues inside the
gap can still hide one; the tests measure how often the truth lies within the bound.

The price is products: the top Ritz value converges about as a one-vector Krylov space of half
the dimension would, so a certified stop takes more products than the one-vector recurrence
(measured in benchmarks/results/lmax_resnet18.md). Each block is one `matmat` of BLOCK rows,
which a backend can serve from one graph. A step the bound's decay says is likely the last is
taken a row at a time instead (`likely_last`), each product checked: a stop that the first row
already certifies leaves the rest of the block untaken, so the run can end at any count of
products, not only at a multiple of BLOCK. The row taken is not the block's first as it stands
but the pending rows turned towards the residual of the Ritz pair furthest from its stop
(`lead_with`): the product that one-vector Lanczos on that Ritz vector would take next, so the
pair converges as fast as a one-vector recurrence where its bound is decided, while the other
pending row keeps the block's second direction for the gap. Only for k below the block's size:
with k ≥ block nothing else would keep a second direction into a near-degenerate (λ_k, λ_{k+1}).
Against whole block steps from the same starts (tests/linalg/test_block_lanczos_partial.py) it
takes fewer products on most seeds; the spaces are no longer the block's, so on a few a run
takes one more.

Every product is kept as its coefficients in the basis (as Lanczos.residuals keeps them), so
the residuals of any Ritz vector are exact from the products already taken: no product checks
them. Full reorthogonalisation (two Gram–Schmidt passes where the first cancels) as in
Lanczos. The products' own round-off shows as the asymmetry of the measured QᵀHQ; a bound that
has stopped falling with the top residual at that level has "stalled".
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from .certify import GAP_FROM_BLOCK_KRYLOV, MIN_EXTRA, TOO_FEW, ritz_bounds, round_off_floor
from .forecast import COLD_BLOCK_STEPS, SKIP, DecayForecast, chebyshev_rate
from .lanczos import (STALL_FACTOR, EigenResult, Lanczos, breakdown_threshold,
                      coefficient_residuals, default_max_iter)
from .random import gaussian
from .reduce import all_finite, not_finite
from .trace import Operator, Progress, StopTest

BLOCK = 2  # start vectors: the fewest that resolve a near-degenerate pair
# block steps over which a bound that has not halved, with the top residual at the products'
# round-off, has stalled (or half the steps taken, if more)
STALL_STEPS = 4
# the top residual counts as at the round-off floor within this factor of the measured
# asymmetry of QᵀHQ (a residual has contributions from every basis row, the asymmetry's norm
# from their pairs: the two are of one order)
NOISE_FACTOR = 4.0
GAP_SAFETY = 2.0
# a block step whose forecast worst relative bound is within this of its target is taken a row
# at a time (likely_last); the decay speeds up as Lanczos converges, so the forecast errs long
SPLIT_WITHIN = 8.0


class BlockLanczos(Lanczos):
    """A block Lanczos recurrence whose basis is kept; `step()` spends one product per row of
    the current block. After the steps, the measured projection is C[:m, :m] with C the
    coefficients of every product in the basis, the next block's rows included."""

    def __init__(self, op: Operator, start: Tensor, capacity: int):
        self.columns: list[np.ndarray] = []  # per product: its coefficients over the basis rows
        self.outside: list[float] = []  # per product: the norm of what no basis row holds
        super().__init__(op, start, capacity)

    def _begin(self, start: Tensor) -> None:
        """The first block: the rows of `start` made orthonormal (no one-vector `_next` held)."""
        self.pending = self._fresh(start.reshape(start.shape[0], -1))
        self._pending_block: Tensor | None = None  # the pending rows as one (k, P) tensor, when they are
        self._previous_first = 0  # the last step's first basis row

    @property
    def can_step(self) -> bool:
        return bool(self.pending) and not self.full

    def _fresh(self, rows: Tensor) -> list[Tensor]:
        """Unit rows orthogonal to the basis and to each other; a row with nothing left is dropped."""
        out: list[Tensor] = []
        for v in rows:
            v = v.to(dtype=self.op.dtype, device=self.op.device)
            norm0 = torch.linalg.vector_norm(v).item()
            if not (norm0 > 0 and math.isfinite(norm0)):
                raise ValueError("block Lanczos start vectors must be finite and nonzero")
            w = self._orthogonalise(v)
            for q in out:
                w = w - torch.dot(q, w) * q
            norm = torch.linalg.vector_norm(w).item()
            if norm > breakdown_threshold(self.op.dtype) * norm0:
                out.append(w / norm)
        return out

    def step(self, rows: int | None = None) -> None:
        """One product per pending row taken: all of them (a block step), or the first `rows`.

        A step over the first rows only is a Rayleigh–Ritz on the basis and those rows: the
        rows left out stay pending, and the new leftovers are made orthogonal to them as well,
        their coefficients recorded at those rows' places, so coefficients() still holds every
        product over the basis rows and then the pending rows in order, and every residual
        stays exact. The Ritz values can only rise with the larger space (Cauchy interlacing),
        and a later step over the rest reaches the block step's span."""
        if not self.can_step:
            raise RuntimeError("block Lanczos cannot step: invariant subspace found or at capacity")
        take = min(len(self.pending), self.capacity - self.size, rows if rows is not None else len(self.pending))
        if take < 1:
            raise ValueError(f"a block Lanczos step takes at least one row, not {rows}")
        left = self.pending[take:]  # pending rows no product takes this step
        # the pending rows are usually the rows of the last step's leftovers, one tensor already
        block = self._pending_block
        # a split step copies the rows it takes: as a view they would keep the whole block's
        # memory alive in the basis, one P-sized row per row left, for the rest of the run
        V = torch.stack(self.pending[:take]) if block is None else block[:take].clone() if left else block
        whole = take == len(self.pending)
        first = self.size
        self._adopt(V)  # V's rows are basis rows from here on, in V's own memory
        HV = self.op.matmat(V)
        if not all_finite(HV):
            raise not_finite(self.op.dtype)
        if HV.data_ptr() == V.data_ptr():  # an operator that hands back its input (the identity)
            HV = HV.clone()
        # the block's own rows and the last block's hold most of HV (block Lanczos' three terms);
        # the leftovers are written over HV, which becomes the next block (no new P-sized rows).
        # After a step over part of the pending rows, the window keeps the last whole step's
        # rows, where the products of the rows still to come have theirs.
        W, C = self._project_rows(HV, into=HV, recent=self.size - self._previous_first)
        if whole:
            self._previous_first = first
        C = C.to(torch.float64).cpu().numpy()
        self.scale = max(self.scale, float(np.abs(C[:, first:]).max()))
        # the next block: the leftovers made orthonormal in place (modified Gram–Schmidt) against
        # the pending rows not taken and each other; each product's column gets its leftover's
        # coefficients on the rows accepted so far (the untaken ones first: their places follow
        # the basis in coefficients())
        accepted: list[Tensor] = list(left)
        for w, c in zip(W, C):
            extra = []
            for q in accepted:
                d = torch.dot(q, w).item()
                w.sub_(q, alpha=d)
                extra.append(d)
            norm = torch.linalg.vector_norm(w).item()
            self.scale = max(self.scale, norm)
            # a row the next step has no room for is not taken: the earlier products' coefficients
            # on it would otherwise be read as coefficients on the next step's rows (once the basis
            # is full, every row is kept: they extend C for the residuals, and no step follows)
            room = self.full or self.size + len(accepted) < self.capacity
            if norm > breakdown_threshold(self.op.dtype) * self.scale and room and self.size + len(accepted) < self.op.dim:
                accepted.append(w.div_(norm))
                extra.append(norm)
                self.outside.append(0.0)
            else:  # round-off, the whole space, or no room: outside the basis, added to residuals by the triangle inequality
                self.outside.append(norm)
            self.columns.append(np.concatenate([c, np.asarray(extra)]))
        self._pending_block = W if not left and len(accepted) == W.shape[0] else None
        self.pending = accepted
        self.invariant = not accepted

    def lead_with(self, s: np.ndarray) -> None:
        """Turn the pending rows within their span so that the first is the direction of the
        residual of the Ritz vector y = Qs (s over the basis rows): a step over one row then
        takes the product that does most for that Ritz pair (the next Lanczos vector of y's
        own recurrence), and the rest stay pending. The residual is Hy − θy = Σ s_j Hq_j − θy,
        whose part outside the basis lies in the pending rows' span (each product's leftover
        became a pending row), so its direction there is C[m:, :m]·s. Every product's column
        is turned with the rows, so every residual stays exact. No product is taken."""
        m, p = self.size, len(self.pending)
        if p < 2:
            return
        C = self.coefficients()
        lead = C[m:m + p, :m] @ s
        norm = float(np.linalg.norm(lead))
        if not (norm > 0 and math.isfinite(norm)):
            return
        # a Householder reflection G = I − 2uuᵀ with G·e1 = ℓ, the residual's unit direction: G is
        # symmetric, so its first row is ℓ too. Applied to the rows in place, with one P-sized
        # temporary (Σ u_j q_j), so turning them needs no second copy of the pending block.
        ell = lead / norm
        u = -ell
        u[0] += 1.0
        length = float(np.linalg.norm(u))
        if length <= np.finfo(np.float64).eps:  # the first row is the direction already
            return
        u /= length
        mix = torch.zeros_like(self.pending[0])
        for uj, q in zip(u, self.pending):
            mix.add_(q, alpha=float(uj))
        for ui, q in zip(u, self.pending):
            if ui != 0.0:
                q.sub_(mix, alpha=2.0 * float(ui))
        G = np.eye(p) - 2.0 * np.outer(u, u)
        for j, c in enumerate(self.columns):
            if c.size > m:
                d = np.zeros(p)
                d[: c.size - m] = c[m:]
                self.columns[j] = np.concatenate([c[:m], G @ d])

    def restart(self, v: Tensor) -> bool:
        """Continue from the rows of v made orthogonal to the basis; False when nothing is left."""
        if self.full:
            return False
        self.pending = self._fresh(v.reshape(-1, self.op.dim))
        self._pending_block = None
        self.invariant = not self.pending
        return bool(self.pending)

    def coefficients(self) -> np.ndarray:
        """C: column j holds product j's coefficients over the basis rows and the pending rows."""
        m = self.size
        C = np.zeros((m + len(self.pending), m))
        for j, c in enumerate(self.columns):
            C[: c.size, j] = c
        return C

    def ritz(self) -> tuple[np.ndarray, np.ndarray]:
        """Eigenvalues θ (ascending) and eigenvectors S of the measured projection's symmetric part."""
        A = self.coefficients()[: self.size]
        return np.linalg.eigh((A + A.T) / 2)

    def asymmetry(self) -> float:
        """‖A − Aᵀ‖_F / 2 of the measured projection A = QᵀHQ: the products' round-off, seen."""
        A = self.coefficients()[: self.size]
        return float(np.linalg.norm(A - A.T)) / 2


def block_lanczos_top(op: Operator, k: int, *, generator: torch.Generator, tol: float = 1e-6,
                      max_iter: int | None = None, progress: Progress | None = None,
                      should_stop: StopTest | None = None, carry_next: bool = False,
                      block: int = BLOCK, goes_on: int | None = None) -> EigenResult:
    """The k largest (algebraic) eigenvalues of a symmetric operator by block Lanczos from
    `block` Gaussian start vectors.

    Stops ("converged") once every top-k Ritz value's bound (certify.ritz_bounds: r²/δ, δ from
    the next Ritz value less its residual, or r where no gap is resolved) ≤ tol·|θ|, the
    residuals exact from the products taken; "stalled" when the worst relative bound has not
    halved over the last STALL_STEPS block steps (or half of them) with the top residual at the
    products' measured round-off; "max_iter" at `max_iter` products (basis rows); "budget"
    when `should_stop` says so after a step with at least k Ritz values; "invariant" when the
    Krylov space closes with nothing left to restart from. `carry_next`: also return the Ritz
    vector below the top k (`next_vector`: a Tracker's next warm block). `goes_on`: the cap on
    products of the whole run when another solver goes on from this one at `max_iter`
    (block_lanczos_top_restarted): its progress totals run to that, and its end is not reported."""
    dim = op.dim
    k = min(k, dim)
    block = max(1, min(block, dim))
    limit = min(max_iter if max_iter is not None else default_max_iter(k), dim)
    start_matvecs = op.matvecs
    lz = BlockLanczos(op, gaussian(block, dim, generator, dtype=op.dtype, device=op.device), limit)
    # the progress line's total: the steps the bound's decay says are left, a block's rows a step;
    # before the bound has fallen once, a cold stop of one eigenvalue shows the measured prior
    forecast = DecayForecast(goes_on or limit, per_step=block, prior_steps=COLD_BLOCK_STEPS if k == 1 else 0)
    history: list[tuple[float, float]] = []  # (block steps' worth of products, worst relative bound), finite ones
    stop, steps, top = "max_iter", 0, None
    owed = 0  # rows of a block step being taken one at a time, still to take
    while True:
        if lz.invariant and lz.size < min(k + MIN_EXTRA, dim):
            lz.restart(gaussian(block, dim, generator, dtype=op.dtype, device=op.device))
            owed = 0  # the block being split is gone: the rows owed are counted again
        if not lz.can_step:
            stop = "invariant" if lz.invariant else "max_iter"
            break
        # a row at a time where the step is likely the last, and then the rest of that block's
        # rows one at a time, each product checked; counted in the rows the block has (fewer
        # than `block` where a row was dropped or a restart found fewer)
        if owed == 0 and likely_last(history):
            owed = len(lz.pending)
        if owed and top is not None and k < block and lz.size >= k:
            # the row taken is the residual's direction of the Ritz pair furthest from its stop.
            # Only where the block has rows beyond the k pairs: a led row grows the space as a
            # one-vector recurrence on that pair would, and with k ≥ block nothing else keeps
            # a second direction into a near-degenerate (λ_k, λ_{k+1}) (the lead then certified
            # a mixture at k = 2: 1 of 400 dense runs, none without it)
            values, _, bounds, (S, order, _) = top
            worst_i = max(range(len(bounds)), key=lambda i: bounds[i].value / abs(values[i]) if values[i] else math.inf)
            lz.lead_with(S[:, order[worst_i]])
        lz.step(1 if owed else None)
        owed = max(0, owed - 1)
        steps += 1
        top = _top(lz, k)
        values, res, bounds, _ = top
        worst = max(b.value / (tol * abs(v)) if v != 0 else math.inf for b, v in zip(bounds, values[:k]))
        done = op.matvecs - start_matvecs
        if progress is not None:
            # the Chebyshev rate speaks of the top pairs a block carries: k ≤ block
            rate = chebyshev_rate(top[3][2], block) if k <= block else None
            progress(done, forecast.total(done, worst, rate), value=values[0])
        if lz.size < k:
            continue
        if worst <= 1:
            stop = "converged"
            break
        if math.isfinite(worst):
            # positions in block steps' worth of products, whatever rows the steps took
            history.append((done / block, worst))
            if not_halving(history, STALL_STEPS) and res[0] <= NOISE_FACTOR * lz.asymmetry():
                stop = "stalled"
                break
        if should_stop is not None and lz.can_step and should_stop():
            stop = "budget"
            break
    # the last step's: no product since (a restart that found nothing left adds no row)
    values, res, bounds, (S, order, _) = top
    Y = lz.vectors(S[:, order[:k]])
    Y = Y / torch.linalg.vector_norm(Y, dim=1, keepdim=True)
    matvecs = op.matvecs - start_matvecs
    if progress is not None and stop != "budget" and not (goes_on and stop == "max_iter"):
        progress(matvecs, matvecs, value=values[0])
    result = EigenResult(values=values[:k], residuals=res[:k],
                         converged=[b.value <= tol * abs(v) for b, v in zip(bounds, values)],
                         matvecs=matvecs, iterations=steps, stop_reason=stop, method="block lanczos",
                         vectors=Y, bounds=bounds, gap_from=GAP_FROM_BLOCK_KRYLOV)
    if carry_next and order.size > k:  # no product: a combination of the basis
        nxt = lz.vectors(S[:, order[k:k + 1]])[0]
        result = replace(result, next_vector=nxt / torch.linalg.vector_norm(nxt))
    return result


def block_lanczos_top_restarted(op: Operator, k: int, *, rows: int, generator: torch.Generator, tol: float,
                                max_iter: int, progress: Progress | None = None,
                                should_stop: StopTest | None = None, block: int = BLOCK) -> tuple[EigenResult, int]:
    """block_lanczos_top in a basis of at most `rows` vectors (what memory holds), and the number
    of restarts. Where the block fills its basis short of its stop, the one-vector thick-restarted
    recurrence (linalg/thick_restart.py) goes on from the block's top Ritz vectors, every
    product counted; a near-degenerate pair the block has not resolved by then keeps the
    one-vector risk (its `gap_from` says so)."""
    from .thick_restart import lanczos_top_restarted, min_rows

    # the block's working rows (its next block, the products, their leftovers) beside its basis
    # take what a restarted basis keeps for its own
    first = block_lanczos_top(op, k, generator=generator, tol=tol, max_iter=min(max_iter, max(rows - block, k + 1)),
                              progress=progress, should_stop=should_stop, block=block, goes_on=max_iter)
    if first.stop_reason != "max_iter" or first.matvecs >= max_iter:
        return first, 0
    done = first.matvecs
    res, restarts = lanczos_top_restarted(op, k, rows=max(rows, min_rows(k)), generator=generator, tol=tol,
                                          max_iter=max_iter - done, progress=offset(progress, done),
                                          should_stop=should_stop, start=first.vectors)
    return replace(res, matvecs=res.matvecs + done), restarts


def offset(progress: Progress | None, done: int) -> Progress | None:
    """`progress` for a solver that goes on after `done` products of another: its counts shifted."""
    if progress is None:
        return None

    def shifted(d: int, total: int, **kw) -> None:
        # a guessed total (forecast.Prior) stays marked as one
        progress(d + done, type(total)(total + done) if total else total, **kw)
    return shifted


def _top(lz: BlockLanczos, k: int):
    """The top k Ritz values (largest first) and the next one's, their residual norms from the
    products kept, the top k's bounds (the gap from the next one, TOO_FEW in a space of fewer
    than k + MIN_EXTRA vectors), and (S, order, θ) to make the vectors from (θ: every Ritz
    value, ascending)."""
    theta, S = lz.ritz()
    order = np.argsort(theta)[::-1]
    values, res = coefficient_residuals(lz.coefficients(), np.asarray(lz.outside), S[:, order[: k + 1]])
    below = (values[k], res[k]) if lz.size >= k + MIN_EXTRA and len(values) > k else TOO_FEW
    scale = max(lz.scale, max(abs(v) for v in values))
    bounds = ritz_bounds(values[:k], res[:k], below, round_off_floor(lz.op, scale), GAP_SAFETY)
    return values, res, bounds, (S, order, theta)


def likely_last(history: list[tuple[float, float]]) -> bool:
    """Whether the next block step is likely the last: the worst relative bound, falling at its
    rate over the last two checks for one more block step's worth, reaches SPLIT_WITHIN of its
    target. Such a step is taken a row at a time, each row's product checked and led by the
    residual of the pair furthest from its stop, so that a stop the first row already
    certifies saves the rest of the block's products; elsewhere a block stays one `matmat` (on
    a GPU about the time of one row), whose two directions keep the gap honest."""
    if len(history) < 2 + SKIP:  # the first fall is many times any later one's (forecast.SKIP)
        return False
    (at0, w0), (at1, w1) = history[-2:]
    if not (w1 < w0 and at1 > at0):
        return False
    # log-linear in products: one block step on from the last check
    return math.log(w1) - (math.log(w0) - math.log(w1)) / (at1 - at0) <= math.log(SPLIT_WITHIN)


def not_halving(history: list[tuple[float, float]], least: int) -> bool:
    """The worst relative bound (history: (position, bound), position growing) has not fallen
    by STALL_FACTOR over the last `least` positions, or half the latest position if more."""
    at, worst = history[-1]
    span = max(least, at // 2)
    earlier = [w for s, w in history if s <= at - span]
    return bool(earlier) and worst > STALL_FACTOR * earlier[-1]
