"""Lanczos tridiagonalisation with full reorthogonalisation, and top-k eigenpairs from it.

Full reorthogonalisation (classical Gram–Schmidt applied twice against every stored basis
vector) costs O(mP) memory and time per step but keeps the basis orthonormal to round-off,
so no spurious copies ("ghosts") of converged Ritz values appear and the quadrature weights
of SLQ stay meaningful. The tridiagonal eigenproblem is left to LAPACK through
`scipy.linalg.eigh_tridiagonal`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor

from .certify import GAP_FROM_RITZ, MIN_EXTRA, TOO_FEW, Bound, ritz_bounds, round_off_floor
from .forecast import DecayForecast
from .random import gaussian
from .reduce import not_finite, rowsum64
from .trace import Operator, Progress, StopTest
# a re-measured true residual that shrank by less than this factor has stalled
STALL_FACTOR = 0.5
# a Gram–Schmidt pass that keeps more than this share of w's norm needs no second pass (DGKS)
DGKS_ETA = 1 / math.sqrt(2)
INITIAL_ROWS = 16  # basis rows per block a full basis allocates (a block recurrence adopts its own)
# P-sized vectors a Lanczos step holds besides its basis: the current and next q, the
# product w, the projection's two temporaries and the product's own
WORK_VECTORS = 6


def breakdown_threshold(dtype: torch.dtype) -> float:
    """β below this fraction of ‖T‖ means the Krylov space is invariant.

    √eps: a true residual direction that small changes the Ritz values by O(eps·‖H‖),
    while round-off in a product is already O(eps·‖H‖), so the two cannot be told apart.
    """
    return math.sqrt(torch.finfo(dtype).eps)


def record_step(rec, alpha: float, beta: float) -> bool:
    """Append a step's α to a recurrence `rec` (alpha, scale, size, op) and say whether its β
    closes an invariant subspace: below the breakdown threshold, or the whole space spanned."""
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        raise not_finite(rec.op.dtype)
    rec.alpha.append(alpha)
    rec.scale = max(rec.scale, abs(alpha), beta)
    return beta <= breakdown_threshold(rec.op.dtype) * rec.scale or rec.size >= rec.op.dim


class Lanczos:
    """One Lanczos recurrence whose basis is kept; `step()` spends one matrix-vector product.

    After j steps, T_j (alpha, beta) is the projection QᵀHQ and `beta_next` couples it to
    the next basis vector (0 once an invariant subspace is found). `restart(v)` continues
    from a fresh direction after a breakdown, leaving a zero off-diagonal in T: a
    block-diagonal T, still QᵀHQ.
    """

    def __init__(self, op: Operator, start: Tensor, capacity: int):
        self.op = op
        self.capacity = max(1, min(capacity, op.dim))
        # the basis grows a block of rows at a time, not allocated at capacity: lmax's default
        # 300 steps of an 11M-parameter ResNet-18 would reserve 13 GB where convergence takes a
        # few dozen rows. Blocks, not one tensor that doubles: a doubling copies the old rows
        # into the new tensor, so both are held at once (up to 2× the basis: a 100-step basis
        # of ViT-B/16 would peak at 164 rows, 56 GB), which no memory plan could promise.
        self.blocks: list[Tensor] = []
        self.starts: list[int] = []  # the index of each block's first row
        self.rows = 0  # rows allocated over all blocks
        self.alpha: list[float] = []
        self.beta: list[float] = []  # off-diagonals of T, len(alpha) − 1 of them
        self.size = 0
        self.scale = 0.0  # running max of |α|, |β|: the ‖T‖ a breakdown is judged against
        self.beta_next = 0.0
        self.invariant = False  # the last step closed an invariant subspace
        # each step's product w = Hq_j written in the basis: w = Σ_i c_i q_i + leftover, with
        # c the two Gram–Schmidt passes' coefficients (α and β among them) and the leftover's
        # norm (β_j, or what a breakdown left out of the basis). They let residuals() give the
        # true residual of any Ritz vector from the products already taken (see there).
        self.coeffs: list[np.ndarray] = []
        self.leftover: list[tuple[float, bool]] = []  # (norm, became the next basis vector)
        self._begin(start)

    def _begin(self, start: Tensor) -> None:
        """The first basis vector: `start` made unit."""
        v = start.reshape(-1).to(dtype=self.op.dtype, device=self.op.device)
        norm = torch.linalg.vector_norm(v).item()
        if not norm > 0 or not math.isfinite(norm):
            raise ValueError("Lanczos start vector is zero or not finite")
        self._next = v / norm

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    @property
    def can_step(self) -> bool:
        return not self.invariant and not self.full

    def _orthogonalise(self, w: Tensor) -> Tensor:
        return self._project_out(w)[0]

    def _project_out(self, w: Tensor) -> tuple[Tensor, Tensor]:
        """w less its part in the basis, and that part's coefficients; w itself is left as it was."""
        W, C = self._project_rows(w.unsqueeze(0), into=None)
        return W[0], C[0]

    def _project_rows(self, W: Tensor, *, into: Tensor | None, recent: int = 0) -> tuple[Tensor, Tensor]:
        """The rows of W (k, P) less their parts in the basis, written into `into` (W itself: in
        place; None: a new tensor), and those parts' coefficients (k, size). `recent`: the last
        rows of the basis, which hold most of W (a block recurrence's own terms), projected out
        first.

        All rows at once: a Gram–Schmidt pass is memory-bound, and one pass over the basis
        serves every row of a block (one matrix product for the coefficients, one for the
        update, written into W). A pass reads the whole basis twice, which at a hundred rows of
        an 11M-parameter model costs as much as the product itself, so the second pass ("twice
        is enough", Kahan–Parlett) is taken only when the first removed more than 1 − DGKS_ETA
        of a row's norm (Daniel, Gragg, Kaufman & Stewart 1976): only then can cancellation
        have left its round-off component in the basis above round-off. Where the recent rows
        hold most of W, their pass first leaves the whole basis' pass only round-off drift, so
        it seldom needs its second."""
        total = torch.zeros(W.shape[0], self.size, dtype=W.dtype, device=W.device)
        if not self.size:
            return (W if into is None else into.copy_(W)), total
        recent = min(recent, self.size)
        if recent:
            W = self._gram_schmidt(W, self.size - recent, total, into)
            into = W
        norm = torch.linalg.vector_norm(W, dim=1)
        for _ in range(2):
            W = self._gram_schmidt(W, 0, total, into)
            into = W
            after = torch.linalg.vector_norm(W, dim=1)
            if bool((after > DGKS_ETA * norm).all()):
                break
            norm = after
        return W, total

    def _gram_schmidt(self, W: Tensor, first: int, total: Tensor, into: Tensor | None) -> Tensor:
        """One classical Gram–Schmidt pass of W's rows against basis rows first … size − 1:
        every coefficient from the same W (added to `total`), then all removed, into `into`."""
        span = self._span(first, self.size)
        c = torch.cat([W @ Q.T for _, Q in span], dim=1)
        for at, Q in span:
            part = c[:, at - first:at - first + Q.shape[0]]
            W = torch.addmm(W, part, Q, alpha=-1, out=into) if into is not None else torch.addmm(W, part, Q, alpha=-1)
            into = W
        total[:, first:] += c
        return W

    def _basis(self) -> list[Tensor]:
        """The basis rows q_0 … q_{size−1}, block by block (views)."""
        return [Q for _, Q in self._span(0, self.size)]

    def _span(self, first: int, end: int) -> list[tuple[int, Tensor]]:
        """Basis rows first … end − 1 as (index of the view's first row, view), block by block."""
        out = []
        for lo, block in zip(self.starts, self.blocks):
            start, stop = max(first, lo), min(end, lo + block.shape[0])
            if start < stop:
                out.append((start, block[start - lo:stop - lo]))
        return out

    def _row(self, i: int) -> Tensor:
        """Basis row q_i (a view)."""
        b = bisect.bisect_right(self.starts, i) - 1
        return self.blocks[b][i - self.starts[b]]

    def _combine(self, coeff: Tensor) -> Tensor:
        """coeff (k, size) → coeff @ Q, (k, P), accumulated block by block in one output."""
        out = None
        for at, Q in self._span(0, self.size):
            part = coeff[:, at:at + Q.shape[0]]
            out = part @ Q if out is None else out.addmm_(part, Q)
        return out

    def step(self) -> None:
        if not self.can_step:
            raise RuntimeError("Lanczos cannot step: invariant subspace found or at capacity")
        q = self._next
        if self.size > 0:
            self.beta.append(self.beta_next)
        self._append(q)
        w = self.op.matmat(q.unsqueeze(0))[0]
        alpha = torch.dot(q, w).item()
        # the three-term recurrence first (α q_j + β q_{j−1}: most of w), so that the
        # re-orthogonalisation's norm test sees only the round-off drift
        w = w - alpha * q  # a new tensor: the rest is written into it
        if self.size > 1 and self.beta[-1] != 0.0:
            w.sub_(self._row(self.size - 2), alpha=self.beta[-1])
        W, C = self._project_rows(w.unsqueeze(0), into=w.unsqueeze(0))
        w, c = W[0], C[0]
        c[self.size - 1] += alpha
        if self.size > 1:
            c[self.size - 2] += self.beta[-1]
        beta = torch.linalg.vector_norm(w).item()
        self.coeffs.append(c.to(torch.float64).cpu().numpy())
        if record_step(self, alpha, beta):
            # the whole space is always invariant; what is left of w is round-off
            self.invariant, self.beta_next = True, 0.0
            self.leftover.append((beta, False))
        else:
            self.beta_next = beta
            self._next = w.div_(beta)
            self.leftover.append((beta, True))

    def _append(self, q: Tensor) -> None:
        """q becomes the basis' next row (a new block of rows where the last is full)."""
        if self.size == self.rows:
            rows = min(INITIAL_ROWS, self.capacity - self.rows)
            self._add_block(torch.empty(rows, self.op.dim, dtype=self.op.dtype, device=self.op.device))
        self.size += 1
        self._row(self.size - 1).copy_(q)

    def _adopt(self, V: Tensor) -> None:
        """The rows of V become the basis' next rows, V itself their storage: no copy, and no
        fresh memory to fill (a P-sized row first written costs a pass of page faults as long
        as the copy). The caller gives V up; a basis with allocated rows still empty copies."""
        if self.size < self.rows:
            for q in V:
                self._append(q)
            return
        self._add_block(V)
        self.size += V.shape[0]

    def _add_block(self, block: Tensor) -> None:
        self.starts.append(self.rows)
        self.blocks.append(block)
        self.rows += block.shape[0]

    def restart(self, v: Tensor) -> bool:
        """Continue from v made orthogonal to the basis; False when nothing of v is left."""
        if self.full:
            return False
        v = v.reshape(-1).to(dtype=self.op.dtype, device=self.op.device)
        w = self._orthogonalise(v)
        norm = torch.linalg.vector_norm(w).item()
        if norm <= breakdown_threshold(self.op.dtype) * torch.linalg.vector_norm(v).item():
            return False
        self.invariant, self.beta_next = False, 0.0
        self._next = w / norm
        return True

    def ritz(self) -> tuple[np.ndarray, np.ndarray]:
        """Eigenvalues θ (ascending) and eigenvectors S of T: T = S diag(θ) Sᵀ."""
        return tridiagonal_eigh(self.alpha, self.beta)

    def residuals(self, S: np.ndarray) -> tuple[list[float], list[float], Tensor]:
        """Rayleigh quotients and true residual norms of the unit Ritz vectors y = Qs (columns
        s of S), and the vectors, from the products already taken: no new product.

        By linearity Hy = Σ_j s_j Hq_j, and each product Hq_j is kept exactly as its
        coefficients in the basis (all of them, not only T's α and β, so round-off drift and a
        product's asymmetry are in it) plus its leftover. With C the (m+1)×m matrix of those
        coefficients, Hy = Q_{m+1} C s: the residual is ‖C s − θ s‖ in the orthonormal basis.
        A breakdown's leftover (≤ √eps·‖T‖, outside the basis) is added by the triangle
        inequality. What this cannot see is the products' nonlinearity in round-off (H of a
        combination against the combination of products), the order of one product's own
        round-off: the same noise a fresh product of y would carry.
        """
        m = self.size
        C = np.zeros((m + 1, m))
        outside = np.zeros(m)
        for j, (c, (rest, kept)) in enumerate(zip(self.coeffs, self.leftover)):
            C[: c.size, j] = c
            if kept:
                C[j + 1, j] = rest
            else:
                outside[j] = rest
        values, res = coefficient_residuals(C, outside, S)
        Y = self.vectors(S)
        return values, res, Y / torch.linalg.vector_norm(Y, dim=1, keepdim=True)

    def vectors(self, S: np.ndarray) -> Tensor:
        """Ritz vectors Y = Sᵀ Q for the columns of S, shape (k, P)."""
        coeff = torch.as_tensor(np.ascontiguousarray(S.T), dtype=self.op.dtype, device=self.op.device)
        return self._combine(coeff)


def coefficient_residuals(C: np.ndarray, outside: np.ndarray, S: np.ndarray) -> tuple[list[float], list[float]]:
    """Rayleigh quotients and residual norms of the unit Ritz vectors y = Qs (columns s of S)
    from C, whose column j holds product j's coefficients in the orthonormal basis (m + extra
    rows: the products' rows and the ones their leftovers became), and `outside`, the norm of
    each product's part no basis row holds (added by the triangle inequality)."""
    m = C.shape[1]
    values, res = [], []
    for s in S.T:
        s = s / np.linalg.norm(s)
        Cs = C @ s
        theta = float(s @ Cs[:m])
        r = Cs.copy()
        r[:m] -= theta * s
        values.append(theta)
        res.append(float(np.linalg.norm(r) + np.abs(outside * s).sum()))
    return values, res


def tridiagonal_eigh(alpha, beta) -> tuple[np.ndarray, np.ndarray]:
    d = np.asarray(alpha, dtype=np.float64)
    e = np.asarray(beta, dtype=np.float64)
    if d.size == 1:
        return d.copy(), np.ones((1, 1))
    # scipy.linalg costs ~0.15 s to import: only the probes that run Lanczos pay it
    from scipy.linalg import eigh_tridiagonal

    return eigh_tridiagonal(d, e)


@dataclass(frozen=True)
class EigenResult:
    """Top-k eigenpairs, largest algebraic first."""

    values: list[float]
    residuals: list[float]  # true ‖Hq − λq‖ of the reported unit vectors q
    converged: list[bool]  # error bound ≤ tol·|λ|
    matvecs: int  # including the block product that measures the true residuals (cold starts only)
    iterations: int  # Lanczos steps, or power iterations summed over the k pairs
    stop_reason: str  # converged, max_iter, stalled (round-off floor), invariant (Krylov space closed)
    method: str
    # the reported unit eigenvectors (k, P), same order as values: a later run's warm start
    vectors: Tensor | None = None
    # |λ − value| ≤ bound, per value (certify.ritz_bounds: r²/δ where a gap is resolved, else r)
    bounds: list[Bound] | None = None
    gap_from: str | None = None  # how the gaps were estimated (None: no gap estimate)
    # the unit Ritz vector just below the top k (lanczos_top(carry_next=True)): a Tracker's next
    # warm block carries it as its gap vector (linalg/warm_block.py)
    next_vector: Tensor | None = None


def lanczos_top(
    op: Operator,
    k: int,
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    progress: Progress | None = None,
    should_stop: StopTest | None = None,
    start: Tensor | None = None,
    carry_next: bool = False,
) -> EigenResult:
    """The k largest (algebraic) eigenvalues of a symmetric operator.

    Stops on the eigenvalues' error, not the residual: once every one of the top k Ritz pairs
    has an error bound (certify.ritz_bounds: r²/δ with δ the gap to the neighbouring Ritz
    values, or r where no gap is resolved) ≤ tol·|θ_i| by its estimated residual
    |β_{j+1}·s_{j,i}| (the exact residual norm in exact arithmetic), the true residual is
    measured with one product per Ritz vector and the bound recomputed from it; if round-off
    keeps it above the tolerance the recurrence goes on (re-measuring only after a quarter
    more steps), and stops as "stalled" once a re-measurement has not at least halved the
    worst relative bound: the limit the products' round-off sets.
    After a breakdown with fewer than k Ritz values it restarts from a random direction
    orthogonal to the basis. Limitation of a one-vector recurrence: further copies of a
    repeated eigenvalue are found only through such restarts or round-off, so a multiple
    top eigenvalue may be listed once. `should_stop` (a budget) ends it after any step with
    at least k Ritz values (stop_reason "budget"); the true residuals of what it reached are
    reported as usual, taken from the products already made (no product after the budget).

    `start` (a warm start, shape (m, P)): eigenvectors of a nearby operator, e.g. the previous
    result on weights a few optimiser steps back. The recurrence starts from their sum plus a
    random part of relative size WARM_MIX, and its residuals are those of the products already
    taken (Lanczos.residuals: the check costs no product), tested from the first step. The
    random part is the guard against a crossing: an old top vector may have become an
    eigenvector of a lower eigenvalue, and a start with no component along the new top one
    would converge to the old as though it were still the largest (the Krylov space of an
    exact eigenvector closes after one step). The random part's residual (≈ WARM_MIX × the
    spread of the spectrum) must be filtered out before the residual test passes, and the
    Krylov polynomial that damps the spectrum below θ grows any eigenvalue above it, so a new
    top eigenvector is brought into view as from a cold start whose start is WARM_MIX times
    smaller along it (tests/test_lanczos: a crossing found; without the random part, missed).
    `carry_next`: also return the Ritz vector below the top k (`next_vector`, no product).
    """
    dim = op.dim
    k = min(k, dim)
    limit = min(max_iter if max_iter is not None else default_max_iter(k), dim)
    start_matvecs = op.matvecs
    random_start = gaussian(1, dim, generator, dtype=op.dtype, device=op.device)[0]
    if start is not None:
        random_start = warm_vector(start, random_start, dim)
        # warm: the residual check from the products taken; cold keeps its measured products
        measure = Lanczos.residuals
    else:
        def measure(lz: Lanczos, S_top: np.ndarray):
            return _true_residuals(op, lz, S_top)
    lz = Lanczos(op, random_start, limit)
    stop, next_check, measured = "max_iter", 0, None
    # the progress line's total: the steps the bound's decay says are left, and a cold check's k
    forecast = DecayForecast(limit, 0 if start is not None else k)
    while True:
        if lz.invariant and lz.size < k:
            lz.restart(gaussian(1, dim, generator, dtype=op.dtype, device=op.device)[0])
        if not lz.can_step:
            stop = "invariant" if lz.invariant else "max_iter"
            break
        lz.step()
        theta, S = lz.ritz()
        estimates = np.abs(lz.beta_next * S[-1])
        ratio = bound_ratio(theta, estimates, k, tol)  # the forecast's and the stopping rule's
        if progress is not None:  # the running λmax: the largest Ritz value
            # counted in products (a check's true residuals too), as the end line's total is
            done = op.matvecs - start_matvecs
            progress(done, forecast.total(done, ratio), value=float(theta[-1]))
        if should_stop is not None and lz.size >= k and lz.can_step and should_stop():
            stop = "budget"
            break
        if lz.size < k or lz.size < next_check:
            continue
        if ratio <= 1:
            top, below = top_and_below(theta, estimates, k)
            previous = measured
            measured = (lz.size, measure(lz, S[:, top]), below, round_off_floor(op, lz.scale))
            verdict = check_verdict(measured, previous, tol)
            if verdict is not None:
                stop = verdict
                break
            next_check = lz.size + max(1, lz.size // 4)
            forecast.not_before = next_check  # the estimate said converged, the check did not
    theta, S = lz.ritz()  # the last step's, which what follows reads
    if measured is None or measured[0] != lz.size:
        top, below = top_and_below(theta, np.abs(lz.beta_next * S[-1]), k)
        # a spent budget takes the residuals from the products already made (Lanczos.residuals):
        # k fresh products of a large model would overrun it by k steps' time
        final = Lanczos.residuals if stop == "budget" else measure
        measured = (lz.size, final(lz, S[:, top]), below, round_off_floor(op, lz.scale))
    if progress is not None and stop != "budget":  # the end: what it took, the check included (a
        # budget's end is told by the probe, as stopped short)
        progress(op.matvecs - start_matvecs, op.matvecs - start_matvecs, value=float(np.max(theta)))
    result = eigen_result(measured, stop, tol, op.matvecs - start_matvecs, lz.size)
    if carry_next and lz.size > k:  # no product: a combination of the basis
        nxt = lz.vectors(S[:, np.argsort(theta)[::-1][k:k + 1]])[0]
        result = replace(result, next_vector=nxt / torch.linalg.vector_norm(nxt))
    return result


def bound_ratio(theta: np.ndarray, estimates: np.ndarray, k: int, tol: float) -> float:
    """The worst of the top k Ritz values' error bounds from their residual estimates, over
    tol·|θ|: ≤ 1 is the stop's first test passed (inf before there are k Ritz values)."""
    if theta.size < k:
        return math.inf
    top, below = top_and_below(theta, estimates, k)
    bounds = ritz_bounds(theta[top].tolist(), estimates[top].tolist(), below)
    return max(b.value / (tol * abs(t)) if t != 0 else math.inf for b, t in zip(bounds, theta[top]))


def top_and_below(theta: np.ndarray, estimates: np.ndarray, k: int) -> tuple[np.ndarray, tuple[float, float] | str]:
    """The indices of the k largest Ritz values (largest first), and the next one below them
    with its residual estimate: the gap the top k are certified by (certify.TOO_FEW in a space
    too small to tell one)."""
    order = np.argsort(theta)[::-1]
    below = TOO_FEW if order.size < k + MIN_EXTRA else (float(theta[order[k]]), float(estimates[order[k]]))
    return order[:k], below


def check_verdict(measured, previous, tol: float) -> str | None:
    """What a check ends in: "converged" when every value's error bound (certify.ritz_bounds) is
    within tol·|λ|, "stalled" when the worst relative bound has not halved since the previous
    check's — the recurrence says converged, the products disagree and more steps do not help:
    their own round-off (float32) is above what tol asks — else None (go on)."""
    if _all_within(measured, tol):
        return "converged"
    if previous is not None and _worst(measured) > STALL_FACTOR * _worst(previous):
        return "stalled"
    return None


def eigen_result(measured, stop: str, tol: float, matvecs: int, iterations: int,
                 method: str = "lanczos") -> EigenResult:
    """The EigenResult of a check (steps, (values, residuals, vectors), below, round-off floor),
    largest first."""
    _, (values, res, vectors), below, floor = measured
    if stop == "max_iter" and _all_within(measured, tol):
        stop = "converged"
    order = sorted(range(len(values)), key=lambda i: -values[i])
    values, res = [float(values[i]) for i in order], [res[i] for i in order]
    bounds = ritz_bounds(values, res, below, floor)
    return EigenResult(
        values=values,
        # a view stays a view when already in order: a copy of k parameter-sized rows would be
        # memory the run's plan did not count
        vectors=vectors if order == sorted(order) else vectors[order],
        residuals=res,
        converged=[b.value <= tol * abs(v) for b, v in zip(bounds, values)],
        matvecs=matvecs,
        iterations=iterations,
        stop_reason=stop,
        method=method,
        bounds=bounds,
        gap_from=GAP_FROM_RITZ,
    )


# Warm starts: the random part's norm relative to the old eigenvectors' sum (see lanczos_top).
# On the demo CNN's training run (benchmarks/results/tracker.md) 0.1 costs no step over 0: the
# old vector's own drift (relative residual ~8e-2 after 10 steps of gradient descent) sets the
# steps, and the random part is what lets a top eigenvalue that appeared since grow into view.
WARM_MIX = 0.1


def warm_vector(start: Tensor, noise: Tensor, dim: int) -> Tensor:
    """The sum of the unit rows of `start` with WARM_MIX of a random direction added."""
    V = start.reshape(-1, dim).to(dtype=noise.dtype, device=noise.device)
    norms = torch.linalg.vector_norm(V, dim=1, keepdim=True)
    if not bool(torch.isfinite(V).all()) or not bool((norms > 0).all()):
        raise ValueError("a warm start needs finite, nonzero vectors")
    v = (V / norms).sum(0)
    v = v / torch.linalg.vector_norm(v)
    return v + WARM_MIX * noise / torch.linalg.vector_norm(noise)


def default_max_iter(k: int) -> int:
    return max(300, 20 * k)


def lanczos_bytes(steps: int, dim: int, dtype: torch.dtype, k: int = 0) -> tuple[int, int]:
    """(bytes per stored basis vector, bytes besides the basis) of a Lanczos run over `dim`
    parameters: the basis holds min(steps, dim) vectors; besides it a step's working vectors
    and, for k Ritz pairs (lanczos_top), the Ritz vectors and the three vectors of one's true
    residual (_true_residuals)."""
    per = dim * torch.empty((), dtype=dtype).element_size()
    return per, (WORK_VECTORS + (k + 3 if k else 0)) * per


def plan_steps(steps: int, dim: int, dtype: torch.dtype, limit: int | None, *, what: str, flag: str,
               k: int = 0, given: bool = True) -> tuple[int, int]:
    """(Lanczos steps to run, bytes they hold) under `limit` bytes (None: no limit).

    Steps the user asked for (`given`) are run or refused up front (exit 2, with the bytes
    needed and the largest `flag` that fits): fewer steps give other nodes, another
    quantity. A default step count that is only a cap on convergence (lmax's max_iter) is
    lowered to what fits in half the limit (the other half is the products' graphs'), not
    below k + 1."""
    from .memory import most_that_fit, refuse_count

    steps = min(steps, dim)
    per, fixed = lanczos_bytes(steps, dim, dtype, k)
    if not given:
        most = most_that_fit(per, fixed, None if limit is None else limit // 2)
        if most is not None and most < steps:
            steps = max(most, min(k + 1, steps))
    refuse_count(steps, per, fixed, limit, what, flag, least=k if k else 2)
    return steps, steps * per + fixed


def _relative_bounds(measured) -> list[float]:
    _, (values, res, _vectors), below, floor = measured
    order = sorted(range(len(values)), key=lambda i: -values[i])
    values = [values[i] for i in order]
    bounds = ritz_bounds(values, [res[i] for i in order], below, floor)
    return [b.value / abs(v) if v != 0 else math.inf for b, v in zip(bounds, values)]


def _worst(measured) -> float:
    return max(_relative_bounds(measured))


def _all_within(measured, tol: float) -> bool:
    return all(b <= tol for b in _relative_bounds(measured))


def _true_residuals(op: Operator, lz: Lanczos, S_top: np.ndarray) -> tuple[list[float], list[float], Tensor]:
    """Rayleigh quotients of the normalised Ritz vectors, their true residual norms, and the vectors.

    One Ritz vector at a time (the same k products as a block): a block would hold the vectors,
    their products and the residuals, 3k parameter-sized vectors (15 of 346 MB for ViT-B/16's
    top 5), where this holds the k vectors and three more."""
    values, res, rows = [], [], []
    for i in range(S_top.shape[1]):
        y = lz.vectors(S_top[:, i:i + 1])[0]
        y = y / torch.linalg.vector_norm(y)
        hy = op.matmat(y.unsqueeze(0))[0]
        # the Rayleigh quotient is at least as accurate as θ, and the residual is then the
        # true one for exactly the value reported; it is summed in float64, and the residual
        # vector's round-off (eps·‖Hy‖) lies far below any tolerance the dtype can reach
        value = rowsum64((y * hy).unsqueeze(0))[0].item()
        res.append(torch.linalg.vector_norm(hy.sub_(y, alpha=value)).item())
        values.append(value)
        rows.append(y)
    return values, res, torch.stack(rows)
