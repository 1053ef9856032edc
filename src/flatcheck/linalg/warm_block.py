"""The top-k eigenpairs of a symmetric operator from a block of earlier eigenvectors: a
Tracker's warm start.

The block holds the previous call's top k eigenvectors and the one below them (k + 1 rows,
the first maybe carried one step on by the caller). Rayleigh–Ritz over its span costs one
product per row and gives, besides the top k Ritz pairs, a (k+1)-th Ritz value that follows
λ_{k+1}: the gap the Kato–Temple bound r²/δ needs (linalg/certify.py) comes from a vector
placed there to approximate the next eigenvector, not from the Ritz values of a short Krylov
space, whose lower ones are averages over the rest of the spectrum and overstate it. Every
residual is exact from the products kept (Hy = Σ s_i Hw_i), so the check costs no product.
While the bound is short of tol·|θ| the span grows by the top pairs' residuals, one product
each (for one vector this is Lanczos' own growth; with a block it is Davidson's method without
a preconditioner), and by the gap pair's residual where no gap is resolved yet.

The (k+1)-th row carries WARM_MIX of a random direction, as lanczos_top's warm start does: the
guard against an eigenvalue that rose from the rest of the spectrum since the last call, which
no earlier eigenvector holds. On that row its residual lowers the gap estimate (min_j
|θ_i − θ_j| − r_j) instead of delaying the top pair's convergence. A crossing by a small gap can
still hide behind the old vectors for a while; the Tracker's periodic cold steps bound how long.

Memory: the basis and its products, two parameter-sized vectors a row (a Lanczos basis holds
one), so a caller gives half the rows it planned for Lanczos as `capacity`. Where the growth
stops converging (a top pair that swapped since the last call), lanczos_top goes on from the
block's best vectors.

The gap is an estimate (an eigenvalue neither the block nor its growth has seen can lie inside
it): how often the truth lies within the reported bound along gradient-descent trajectories is
measured in tests/linalg/test_warm_block.py against dense float64 spectra.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
from torch import Tensor

from .certify import GAP_FROM_BLOCK, GAP_SAFETY, ritz_bounds, round_off_floor
from .block_lanczos import not_halving, offset
from .forecast import DecayForecast
from .lanczos import DGKS_ETA, WARM_MIX, EigenResult, breakdown_threshold, lanczos_top
from .random import gaussian
from .reduce import all_finite, not_finite, rowsum64
from .trace import Operator, Progress, StopTest

# the block's gap estimate is divided by this (certify.ritz_bounds' safety)
BLOCK_GAP_SAFETY = GAP_SAFETY
# growths without the worst bound halving after which the block hands over to Lanczos
STALL_GROWTHS = 3


class Block:
    """An orthonormal basis W and its products HW (kept: every residual comes from them)."""

    def __init__(self, op: Operator, capacity: int):
        self.op, self.capacity = op, capacity
        self.W: list[Tensor] = []
        self.HW: list[Tensor] = []
        self.A = np.zeros((0, 0))  # WᵀHW as measured, float64
        self.M = self.A  # its symmetric part
        self.scale = 0.0  # the largest |θ| seen: ‖H‖ ≥ it, for the round-off floor and breakdowns

    @property
    def size(self) -> int:
        return len(self.W)

    def orthonormal(self, vectors: Tensor) -> list[Tensor]:
        """The rows of `vectors` made orthonormal to the basis and to each other (two Gram–Schmidt
        passes where the first cancels); a row with nothing left beyond round-off is dropped."""
        out: list[Tensor] = []
        for v in vectors:
            w = v.to(dtype=self.op.dtype, device=self.op.device).clone()
            norm0 = torch.linalg.vector_norm(w).item()
            if not (norm0 > 0 and math.isfinite(norm0)):
                continue
            basis = self.W + out
            norm = norm0
            for _ in range(2):
                for q in basis:
                    w.sub_(q, alpha=torch.dot(q, w).item())
                after = torch.linalg.vector_norm(w).item()
                if after > DGKS_ETA * norm:
                    break
                norm = after
            if after > breakdown_threshold(self.op.dtype) * norm0:
                out.append(w / after)
        return out

    def add(self, vectors: list[Tensor]) -> None:
        """Take the products of orthonormal `vectors` (one each) and extend WᵀHW."""
        if not vectors:
            return
        V = torch.stack(vectors)
        HV = self.op.matmat(V)
        if not all_finite(HV):
            raise not_finite(self.op.dtype)
        self.W += list(V)
        self.HW += list(HV)
        n, old = self.size, self.size - len(vectors)
        A = np.zeros((n, n))  # WᵀHW as measured: a product's round-off makes it slightly asymmetric
        A[:old, :old] = self.A
        for j in range(old, n):  # the new columns, and the new rows against the old columns
            A[:, j] = [_dot64(w, self.HW[j]) for w in self.W]
            A[j, :old] = [_dot64(self.W[j], hw) for hw in self.HW[:old]]
        self.A = A
        self.M = (A + A.T) / 2  # its symmetric part is the projection

    def ritz(self, count: int) -> tuple[list[float], list[float], Tensor, Tensor]:
        """The `count` largest Ritz values (largest first), their true residual norms
        ‖Hy − θy‖ from the products kept, the unit Ritz vectors and their residual vectors."""
        theta, S = np.linalg.eigh(self.M)
        order = np.argsort(theta)[::-1][:count]
        coeff = torch.as_tensor(np.ascontiguousarray(S[:, order].T), dtype=self.op.dtype, device=self.op.device)
        Y, HY = _combine(coeff, self.W), _combine(coeff, self.HW)
        norms = torch.linalg.vector_norm(Y, dim=1, keepdim=True)
        Y, HY = Y / norms, HY / norms
        values = rowsum64(Y * HY).tolist()  # Rayleigh quotients of exactly the vectors reported
        R = HY - torch.tensor(values, dtype=Y.dtype, device=Y.device).unsqueeze(1) * Y
        self.scale = max(self.scale, float(np.abs(theta).max()))
        return values, torch.linalg.vector_norm(R, dim=1).tolist(), Y, R


def _dot64(a: Tensor, b: Tensor) -> float:
    return rowsum64((a * b).unsqueeze(0))[0].item()


def _combine(coeff: Tensor, rows: list[Tensor]) -> Tensor:
    """coeff (c, n) @ rows (n vectors), one row at a time: no (n, P) copy of the basis."""
    out = torch.zeros(coeff.shape[0], rows[0].shape[0], dtype=rows[0].dtype, device=rows[0].device)
    for i, row in enumerate(rows):
        out.addr_(coeff[:, i], row)
    return out


def block_top(op: Operator, k: int, start: Tensor, *, generator: torch.Generator, tol: float = 1e-6,
              max_iter: int = 300, progress: Progress | None = None, should_stop: StopTest | None = None,
              capacity: int | None = None) -> EigenResult:
    """The k largest (algebraic) eigenvalues from `start` (m ≥ k + 1 unit rows: the previous
    top k eigenvectors and the next one, shape (m, P)). Stops once every top-k Ritz value's
    bound (certify.ritz_bounds, the gap from the (k+1)-th Ritz value) ≤ tol·|θ|; "max_iter" at
    `max_iter` products or `capacity` basis vectors; "budget" when `should_stop` says so;
    "invariant" when nothing new is left to grow by. Where STALL_GROWTHS growths have not halved
    the worst relative bound, lanczos_top goes on from the block's top Ritz vectors (warm) and
    its result is returned, with the block's products counted in. `vectors` of the
    result holds the top k Ritz vectors and `next_vector` the one below (the next call's block)."""
    dim = op.dim
    k = min(k, dim)
    if start.dim() != 2 or start.shape[1] != dim or start.shape[0] < min(k + 1, dim):
        raise ValueError(f"a block warm start needs at least k + 1 = {k + 1} rows of {dim}")
    carry = min(k + 1, dim)
    capacity = min(capacity or max_iter, max_iter, dim)
    start_matvecs = op.matvecs
    rows = start.to(dtype=op.dtype, device=op.device)
    rows = rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    if not bool(torch.isfinite(rows).all()):
        raise ValueError("a warm start needs finite, nonzero vectors")
    noise = gaussian(1, dim, generator, dtype=op.dtype, device=op.device)[0]
    rows = rows.clone()
    rows[carry - 1] += WARM_MIX * noise / torch.linalg.vector_norm(noise)
    block = Block(op, capacity)
    block.add(block.orthonormal(rows[: max(carry, min(rows.shape[0], capacity))]))
    while block.size < carry:  # a row that depended on the others: a random one in its place
        block.add(block.orthonormal(gaussian(1, dim, generator, dtype=op.dtype, device=op.device)))
    forecast = DecayForecast(max_iter)
    history: list[tuple[int, float]] = []  # (size, worst relative bound) after each growth
    stop = "max_iter"
    while True:
        values, res, Y, R = block.ritz(min(carry, block.size))
        floor = round_off_floor(op, block.scale)
        below = (values[k], res[k]) if len(values) > k else None
        bounds = ritz_bounds(values[:k], res[:k], below, floor, BLOCK_GAP_SAFETY)
        ratios = [b.value / (tol * abs(v)) if v != 0 else math.inf for b, v in zip(bounds, values)]
        worst = max(ratios)
        done = op.matvecs - start_matvecs
        if progress is not None:
            progress(done, forecast.total(done, worst), value=values[0])
        if worst <= 1:
            stop = "converged"
            break
        history.append((block.size, worst))
        if not_halving(history, STALL_GROWTHS):  # over the last STALL_GROWTHS vectors, or half the basis
            # the block no longer converges (a top pair that swapped or crossed in since the last
            # call, or the products' round-off): Lanczos from its best vectors, with its own stop
            return _continue_by_lanczos(op, k, Y[:k], start_matvecs, generator=generator, tol=tol,
                                        max_iter=max_iter, progress=progress, should_stop=should_stop)
        if should_stop is not None and should_stop():
            stop = "budget"
            break
        # grow by the residuals of the pairs short of their bound, and by the gap pair's where a
        # bound fell back to the residual (no gap resolved yet)
        grow = [R[i] for i in range(len(bounds)) if ratios[i] > 1]
        if len(values) > k and any(b.gap is None or b.value >= res[i] for i, b in enumerate(bounds)):
            grow.append(R[k])
        room = min(capacity - block.size, max_iter - done)
        fresh = block.orthonormal(torch.stack(grow))[: max(room, 0)]
        if not fresh:
            stop = "invariant" if room > 0 else "max_iter"
            break
        block.add(fresh)
    if progress is not None and stop != "budget":
        progress(op.matvecs - start_matvecs, op.matvecs - start_matvecs, value=values[0])
    return EigenResult(values=values[:k], residuals=res[:k],
                       converged=[b.value <= tol * abs(v) for b, v in zip(bounds, values)],
                       matvecs=op.matvecs - start_matvecs, iterations=block.size, stop_reason=stop,
                       method="lanczos", vectors=Y[:k], bounds=bounds, gap_from=GAP_FROM_BLOCK,
                       next_vector=Y[k] if Y.shape[0] > k else None)


def _continue_by_lanczos(op: Operator, k: int, best: Tensor, start_matvecs: int, *, generator: torch.Generator,
                         tol: float, max_iter: int, progress: Progress | None,
                         should_stop: StopTest | None) -> EigenResult:
    """lanczos_top warm from the block's top k Ritz vectors; every product counted, the
    block's included."""
    done = op.matvecs - start_matvecs
    res = lanczos_top(op, k, generator=generator, tol=tol, max_iter=max(max_iter - done, k + 1),
                      progress=offset(progress, done),
                      should_stop=should_stop, start=best, carry_next=True)
    return replace(res, matvecs=op.matvecs - start_matvecs)
