"""The top-k eigenpairs of a symmetric operator in a basis of fixed size: Lanczos with full
re-orthogonalisation, thick-restarted (Wu & Simon 2000) whenever the basis is full.

lanczos_top keeps every basis vector until it converges; on a large model that basis is the
probe's memory (ViT-B/16 at 100 steps: 34 GB in float32). Here the basis holds at most `rows`
vectors. When it is full, the `keep` largest Ritz vectors y_i = V s_i and the next Lanczos
vector v replace it, and the recurrence goes on from v. The Lanczos relation
H V = V T + β v e_nᵀ still holds, with T now an arrowhead: diag(θ) bordered by
T[i, keep] = β·s_i[n] (= y_iᵀ H v), so each Ritz pair's residual is still β·|s_i[n]|, and the
kept Ritz vectors go on improving instead of being discarded (an explicit restart from one
vector would lose the others' progress). Every product is orthogonalised against the whole
basis (two classical Gram–Schmidt passes when the first cancels, as lanczos.Lanczos does), and
T is filled with the coefficients measured, not assumed tridiagonal.

Memory: rows + 1 parameter-sized vectors of basis, a step's working vectors, and two more for
the true residual check (restart_bytes), whatever the number of steps: the check restarts
first, so the Ritz vectors it measures are the basis's first rows.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from .lanczos import (WORK_VECTORS, DGKS_ETA, EigenResult, breakdown_threshold, check_verdict, eigen_result,
                      bound_ratio, top_and_below, warm_vector)
from .certify import round_off_floor
from .forecast import DecayForecast
from .random import gaussian
from .reduce import not_finite, rowsum64
from .trace import Operator, Progress, StopTest

# rows a product is projected on before the whole basis: the three-term recurrence's q_n, q_{n−1}
LOCAL_ROWS = 2
# columns of the basis recombined at a time when it restarts: the new rows are written over the
# old ones, and only (keep × this) floats are held besides
RESTART_COLUMNS = 1 << 20


def restart_keep(rows: int, k: int) -> int:
    """Ritz vectors kept at a restart: k and as many more as leave the basis room for as many
    new Lanczos vectors again (about half the basis), which is what lets the kept ones
    converge without the steps between restarts shrinking to nothing."""
    return max(k, min(rows - 2, (rows + k) // 2))


def restart_bytes(rows: int, dim: int, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes per vector, bytes held in all) of a restarted run: the basis and the next Lanczos
    vector, a step's working vectors, and the product and residual of the true residual check
    (its Ritz vectors are basis rows)."""
    per = dim * torch.empty((), dtype=dtype).element_size()
    return per, (rows + 1 + WORK_VECTORS + 2) * per


def min_rows(k: int) -> int:
    """The smallest basis that can restart: the k kept Ritz vectors, one more, and room to step."""
    return k + 2


class RestartedLanczos:
    """A Lanczos recurrence in `rows` stored vectors; `step()` spends one product, `restart()`
    makes room when the basis is full."""

    def __init__(self, op: Operator, start: Tensor, rows: int):
        if rows < 2:
            raise ValueError("a restarted Lanczos basis needs at least 2 rows")
        self.op = op
        self.rows = min(rows, op.dim)
        # rows + 1: the basis and the next Lanczos vector, whose product is not yet taken. Rows
        # past the next vector are never read, so they are left unwritten: zeroing them would
        # touch every page of a basis a short run never fills (2.7 GB, seconds before the first
        # product, on a ResNet-18)
        self.V = torch.empty(self.rows + 1, op.dim, dtype=op.dtype, device=op.device)
        self.T = np.zeros((self.rows + 1, self.rows + 1))
        self.n = 0  # basis vectors whose products are taken (T's order)
        self.steps = 0  # products taken by the recurrence
        self.restarts = 0  # restarts of a full basis
        self.beta = 0.0  # norm of the last product's part outside the basis
        self.scale = 0.0  # running max |T|: what a breakdown is judged against
        self.invariant = False
        v = start.reshape(-1).to(dtype=op.dtype, device=op.device)
        norm = torch.linalg.vector_norm(v).item()
        if not norm > 0 or not math.isfinite(norm):
            raise ValueError("Lanczos start vector is zero or not finite")
        self.V[0] = v / norm

    @property
    def full(self) -> bool:
        return self.n >= self.rows

    def _project_out(self, w: Tensor, upto: int) -> tuple[Tensor, np.ndarray]:
        """w (the caller's fresh product or draw, overwritten) less its part in rows 0 … upto − 1,
        and that part's coefficients. The last two rows (the recurrence's own α and β terms,
        most of a product between restarts) go first, so that the pass over the whole basis
        sees only drift and seldom needs its second (DGKS) pass: each pass reads every row
        twice. Right after a restart the product couples to every kept Ritz vector; the DGKS
        test then takes the second pass."""
        total = np.zeros(upto)
        recent = min(upto, LOCAL_ROWS)
        if recent and upto > recent:
            w = self._pass(w, upto - recent, upto, total)
        norm = torch.linalg.vector_norm(w).item()
        for _ in range(2):
            w = self._pass(w, 0, upto, total)
            after = torch.linalg.vector_norm(w).item()
            if after > DGKS_ETA * norm:
                break
            norm = after
        return w, total

    def _pass(self, w: Tensor, first: int, upto: int, total: np.ndarray) -> Tensor:
        """One classical Gram–Schmidt pass of w against rows first … upto − 1, in place."""
        Q = self.V[first:upto]
        c = Q @ w
        w.addmv_(Q.T, c, alpha=-1)
        total[first:upto] += c.double().cpu().numpy()
        return w

    def step(self) -> None:
        n = self.n
        w = self.op.matmat(self.V[n:n + 1])[0]
        w, c = self._project_out(w, n + 1)
        if not (np.all(np.isfinite(c)) and math.isfinite(torch.linalg.vector_norm(w).item())):
            raise not_finite(self.op.dtype)
        self.T[:n + 1, n] = c
        self.T[n, :n + 1] = c
        self.beta = torch.linalg.vector_norm(w).item()
        self.scale = max(self.scale, float(np.abs(c).max()), self.beta)
        self.n += 1
        self.steps += 1
        self.invariant = self.beta <= breakdown_threshold(self.op.dtype) * self.scale or self.n >= self.op.dim
        if not self.invariant:
            self.V[self.n] = w.div_(self.beta)

    def fresh_direction(self, v: Tensor) -> None:
        """After a breakdown with too few Ritz values: go on from `v`, orthogonalised to the
        basis, with no coupling to it in T (a block-diagonal T, still VᵀHV)."""
        v = v.reshape(-1).to(dtype=self.op.dtype, device=self.op.device)
        v, _ = self._project_out(v, self.n)
        self.V[self.n] = v / torch.linalg.vector_norm(v)
        self.beta = 0.0
        self.invariant = False

    def ritz(self) -> tuple[np.ndarray, np.ndarray]:
        """Ritz values (ascending) and T's eigenvectors (columns)."""
        return np.linalg.eigh(self.T[:self.n, :self.n])

    def estimates(self, S: np.ndarray) -> np.ndarray:
        """‖H y − θ y‖ of the Ritz vectors y = V s for the columns s of S: β·|s[n−1]|."""
        return self.beta * np.abs(S[-1])

    def restart(self, keep: int, full: bool = True) -> None:
        """Keep the `keep` largest Ritz vectors, largest first, and the next Lanczos vector (none
        after a breakdown); T becomes the arrowhead diag(θ) bordered by β·s_i[n−1]. `full`: the
        basis had no room left (what `restarts` counts), not a residual check's restart."""
        theta, S = self.ritz()
        keep = min(keep, self.n)
        top = np.argsort(theta)[::-1][:keep]
        S_keep = torch.from_numpy(np.ascontiguousarray(S[:, top].T)).to(self.V)  # (keep, n)
        n = self.n
        for c0 in range(0, self.op.dim, RESTART_COLUMNS):  # the right side is read whole before the rows are written
            cols = slice(c0, c0 + RESTART_COLUMNS)
            self.V[:keep, cols] = S_keep @ self.V[:n, cols]
        if not self.invariant:  # the rows past it are never read (see __init__)
            self.V[keep] = self.V[n]
        border = self.beta * S[-1, top]
        self.T[:] = 0
        self.T[np.arange(keep), np.arange(keep)] = theta[top]
        self.T[:keep, keep] = border
        self.T[keep, :keep] = border
        self.n = keep
        self.restarts += full

    def true_residuals(self, k: int) -> tuple[list[float], list[float], Tensor]:
        """Right after a restart the top k Ritz vectors are the basis's first rows: their
        Rayleigh quotients and true residual norms ‖Hy − λy‖, one product each, with two
        more vectors held (the product and the residual) and the rows themselves returned."""
        values, res = [], []
        for i in range(k):
            y = self.V[i]
            hy = self.op.matmat(y.unsqueeze(0))[0]
            # the Rayleigh quotient (at least as accurate as θ), summed in float64, so that the
            # residual is the true one of exactly the value reported
            value = rowsum64((y * hy).unsqueeze(0))[0].item()
            res.append(torch.linalg.vector_norm(hy.sub_(y, alpha=value)).item())
            values.append(value)
        return values, res, self.V[:k]

    def estimated_residuals(self, k: int) -> tuple[list[float], list[float], Tensor]:
        """Right after a restart: the Ritz values and the recurrence's own residuals |β·s_i|
        (no product), and the rows."""
        return ([float(self.T[i, i]) for i in range(k)], [abs(float(self.T[i, self.n])) for i in range(k)],
                self.V[:k])


def lanczos_top_restarted(
    op: Operator,
    k: int,
    *,
    rows: int,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int = 300,
    progress: Progress | None = None,
    should_stop: StopTest | None = None,
    start: Tensor | None = None,
) -> tuple[EigenResult, int]:
    """The k largest (algebraic) eigenvalues in a basis of at most `rows` vectors, and the
    number of restarts. Stops as lanczos_top does: once every top-k Ritz pair's error bound
    from its residual estimate β·|s| (r²/δ, or r with no gap) ≤ tol·|θ|, confirmed by the
    true residuals of the Ritz vectors (k more products), or "stalled" when a re-measurement
    has not halved the worst bound (the products' round-off floor), or after `max_iter`
    steps, or at the budget (then the residuals are the estimates, with no product past it). `start`: a warm start's
    eigenvectors (lanczos.warm_vector: their sum with a random part, as lanczos_top takes it)."""
    dim = op.dim
    k = min(k, dim)
    rows = min(max(rows, min_rows(k)), dim)
    keep = restart_keep(rows, k)
    start_matvecs = op.matvecs
    first = gaussian(1, dim, generator, dtype=op.dtype, device=op.device)[0]
    if start is not None:
        first = warm_vector(start, first, dim)
    lz = RestartedLanczos(op, first, rows)
    stop, next_check, measured = "max_iter", 0, None
    forecast = DecayForecast(max_iter, k)  # every check measures k true residuals
    while lz.steps < max_iter:
        lz.step()
        theta, S = lz.ritz()
        if progress is not None:
            ratio = bound_ratio(theta, lz.estimates(S), k, tol) if lz.n >= k else math.inf
            # counted in products (a check's true residuals too), as the end line's total is
            done = op.matvecs - start_matvecs
            progress(done, forecast.total(done, ratio), value=float(theta[-1]))
        if lz.invariant:
            if lz.n >= k:
                stop = "invariant"
                break
            lz.fresh_direction(gaussian(1, dim, generator, dtype=op.dtype, device=op.device)[0])
            continue
        if should_stop is not None and lz.n >= k and should_stop():
            stop = "budget"
            break
        if lz.n >= k and lz.steps >= next_check:
            _, below = top_and_below(theta, lz.estimates(S), k)
            if bound_ratio(theta, lz.estimates(S), k, tol) <= 1:
                # the check restarts first, so the Ritz vectors it measures are basis rows, not
                # k more vectors; the recurrence goes on from there if they fall short
                lz.restart(keep, full=False)
                previous = measured
                measured = (lz.steps, lz.true_residuals(k), below, round_off_floor(op, lz.scale))
                verdict = check_verdict(measured, previous, tol)
                if verdict is not None:
                    stop = verdict
                    break
                next_check = lz.steps + max(1, lz.steps // 4)
                forecast.not_before = next_check  # the estimate said converged, the check did not
                continue
        if lz.full:
            lz.restart(keep)
    if measured is None or measured[0] != lz.steps:
        theta, S = lz.ritz()
        _, below = top_and_below(theta, lz.estimates(S), k)
        lz.restart(keep, full=False)
        # no product past a budget: the recurrence's own residuals
        found = lz.estimated_residuals(k) if stop == "budget" else lz.true_residuals(k)
        measured = (lz.steps, found, below, round_off_floor(op, lz.scale))
    if progress is not None and stop != "budget":  # the end: what it took, the check included (a
        # budget's end is told by the probe, as stopped short)
        progress(op.matvecs - start_matvecs, op.matvecs - start_matvecs, value=float(np.max(lz.ritz()[0])))
    result = eigen_result(measured, stop, tol, op.matvecs - start_matvecs, lz.steps)
    return result, lz.restarts
