"""Lanczos tridiagonalisation with full reorthogonalisation, and top-k eigenpairs from it.

Full reorthogonalisation (classical Gram–Schmidt applied twice against every stored basis
vector) costs O(mP) memory and time per step but keeps the basis orthonormal to round-off,
so no spurious copies ("ghosts") of converged Ritz values appear and the quadrature weights
of SLQ stay meaningful. The tridiagonal eigenproblem is left to LAPACK through
`scipy.linalg.eigh_tridiagonal`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from scipy.linalg import eigh_tridiagonal
from torch import Tensor

from .trace import Operator

Progress = Callable[[int, int], None]


def breakdown_threshold(dtype: torch.dtype) -> float:
    """β below this fraction of ‖T‖ means the Krylov space is invariant.

    √eps: a true residual direction that small changes the Ritz values by O(eps·‖H‖),
    while round-off in a product is already O(eps·‖H‖), so the two cannot be told apart.
    """
    return math.sqrt(torch.finfo(dtype).eps)


class Lanczos:
    """One Lanczos recurrence whose basis is kept; `step()` spends one matrix-vector product.

    After j steps, T_j (alpha, beta) is the projection QᵀHQ and `beta_next` couples it to
    the next basis vector; `restart(v)` continues from a fresh direction after a breakdown,
    which leaves a zero off-diagonal in T (a block-diagonal T, still QᵀHQ).
    """

    def __init__(self, op: Operator, start: Tensor, capacity: int):
        self.op = op
        self.capacity = max(1, min(capacity, op.dim))
        self.Q = torch.empty(self.capacity, op.dim, dtype=op.dtype, device=op.device)
        self.alpha: list[float] = []
        self.beta: list[float] = []  # off-diagonals of T, len(alpha) − 1 of them
        self.size = 0
        self.scale = 0.0  # running max of |α|, |β|: the size of ‖T‖ breakdown is judged against
        self.beta_next = 0.0
        self._pending = self._normalised(start)
        if self._pending is None:
            raise ValueError("Lanczos start vector is zero")

    @property
    def full(self) -> bool:
        return self.size >= self.capacity

    @property
    def broken(self) -> bool:
        """The last step found an invariant subspace (or used up the whole space)."""
        return self._pending is None

    def _normalised(self, v: Tensor) -> Tensor | None:
        v = v.reshape(-1).to(dtype=self.op.dtype, device=self.op.device)
        norm = torch.linalg.vector_norm(v).item()
        return None if norm == 0 or not math.isfinite(norm) else v / norm

    def _orthogonalise(self, w: Tensor) -> Tensor:
        Q = self.Q[: self.size]
        for _ in range(2):  # "twice is enough" (Kahan–Parlett) for an orthonormal basis
            w = w - (Q @ w) @ Q
        return w

    def step(self) -> None:
        """Add one basis vector; afterwards `broken` tells whether the recurrence must stop."""
        if self._pending is None or self.full:
            raise RuntimeError("Lanczos cannot step: broken down or at capacity")
        q = self._pending
        j = self.size
        self.Q[j] = q
        self.size += 1
        w = self.op.matmat(q.unsqueeze(0))[0]
        alpha = torch.dot(q, w).item()
        w = self._orthogonalise(w)  # subtracts α q and β q_prev along with round-off drift
        beta = torch.linalg.vector_norm(w).item()
        if j > 0:
            self.beta.append(self.beta_next)
        self.alpha.append(alpha)
        self.scale = max(self.scale, abs(alpha), beta)
        self.beta_next = beta
        if self.full or beta <= breakdown_threshold(self.op.dtype) * self.scale or not math.isfinite(beta):
            self.beta_next = 0.0 if not self.full or beta <= breakdown_threshold(self.op.dtype) * self.scale else beta
            self._pending = None
        else:
            self._pending = w / beta

    def restart(self, v: Tensor) -> bool:
        """Continue from v made orthogonal to the basis; False when nothing of v is left."""
        if self.full:
            return False
        w = self._orthogonalise(v.reshape(-1).to(dtype=self.op.dtype, device=self.op.device))
        norm = torch.linalg.vector_norm(w).item()
        if norm <= breakdown_threshold(self.op.dtype) * torch.linalg.vector_norm(v).item():
            return False
        # a zero coupling to the new block: T stays QᵀHQ
        self.beta_next = 0.0
        self._pending = w / norm
        return True

    def ritz(self) -> tuple[np.ndarray, np.ndarray]:
        """Eigenvalues θ (ascending) and eigenvectors S of T: T = S diag(θ) Sᵀ."""
        return tridiagonal_eigh(self.alpha, self.beta)

    def vectors(self, S: np.ndarray) -> Tensor:
        """Ritz vectors Y = Sᵀ Q for the columns of S, shape (k, P)."""
        coeff = torch.as_tensor(S.T, dtype=self.op.dtype, device=self.op.device)
        return coeff @ self.Q[: self.size]


def tridiagonal_eigh(alpha, beta) -> tuple[np.ndarray, np.ndarray]:
    d = np.asarray(alpha, dtype=np.float64)
    e = np.asarray(beta, dtype=np.float64)
    if d.size == 1:
        return d.copy(), np.ones((1, 1))
    return eigh_tridiagonal(d, e)


@dataclass(frozen=True)
class EigenResult:
    """Top-k eigenpairs, largest algebraic first."""

    values: list[float]
    residuals: list[float]  # true ‖Hq − λq‖ of the reported unit vectors q
    converged: list[bool]  # residual ≤ tol·|λ|
    matvecs: int  # including the final block product that measures the true residuals
    iterations: int  # Lanczos steps, or power iterations summed over the k pairs
    stop_reason: str  # "converged", "max_iter", or "invariant" (the whole space was spanned)
    method: str
    vectors: Tensor | None = None


def lanczos_top(
    op: Operator,
    k: int,
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int | None = None,
    keep_vectors: bool = False,
    progress: Progress | None = None,
) -> EigenResult:
    """The k largest (algebraic) eigenvalues of a symmetric operator.

    Stops once every one of the top k Ritz pairs has the estimated residual |β_{j+1}·s_{j,i}|
    ≤ tol·|θ_i| (exact in exact arithmetic for Lanczos), then measures the true residual
    with one block product of the k Ritz vectors; if round-off makes a true residual miss
    the tolerance the recurrence goes on. After a breakdown with fewer than k Ritz values,
    it restarts from a fresh random direction orthogonal to the basis, so eigenvalues the
    start vector missed (e.g. further copies of a repeated eigenvalue) can still be found —
    but a repeated eigenvalue's copies are found only through such restarts or round-off.
    """
    from .random import gaussian

    dim = op.dim
    k = min(k, dim)
    limit = min(max_iter if max_iter is not None else max(300, 20 * k), dim)
    start_matvecs = op.matvecs
    lz = Lanczos(op, gaussian(1, dim, generator, dtype=op.dtype, device=op.device)[0], limit)
    stop = "max_iter"
    checked_at = -1
    best: tuple[np.ndarray, Tensor, list[float]] | None = None
    while True:
        if lz.broken and not lz.full and lz.size < k:
            lz.restart(gaussian(1, dim, generator, dtype=op.dtype, device=op.device)[0])
        if lz.broken or lz.full:
            stop = "invariant" if lz.size >= dim or lz.broken else "max_iter"
            break
        lz.step()
        if progress is not None:
            progress(lz.size, limit)
        if lz.size < k:
            continue
        theta, S = lz.ritz()
        top = np.argsort(theta)[::-1][:k]
        est = np.abs(lz.beta_next * S[-1, top])
        if np.all(est <= tol * np.abs(theta[top])):
            # the estimate is cheap; the true residual costs k products, so it is not re-measured
            # on every later step should round-off keep it above tol
            if lz.size - checked_at >= max(1, (lz.size - checked_at) // 2) and checked_at < lz.size:
                values, Y, res = _true_residuals(op, lz, theta, S, top)
                checked_at = lz.size
                best = (values, Y, res)
                if all(r <= tol * abs(v) for r, v in zip(res, values)):
                    stop = "converged"
                    break
    theta, S = lz.ritz()
    top = np.argsort(theta)[::-1][:k]
    if best is None or checked_at != lz.size:
        best = _true_residuals(op, lz, theta, S, top)
    values, Y, res = best
    if stop != "converged" and all(r <= tol * abs(v) for r, v in zip(res, values)):
        stop = "converged" if stop != "invariant" else "invariant"
    return EigenResult(
        values=[float(v) for v in values],
        residuals=res,
        converged=[r <= tol * abs(v) for r, v in zip(res, values)],
        matvecs=op.matvecs - start_matvecs,
        iterations=lz.size,
        stop_reason=stop,
        method="lanczos",
        vectors=Y if keep_vectors else None,
    )


def _true_residuals(op: Operator, lz: Lanczos, theta: np.ndarray, S: np.ndarray, top: np.ndarray):
    Y = lz.vectors(S[:, top])
    Y = Y / torch.linalg.vector_norm(Y, dim=1, keepdim=True)
    HY = op.matmat(Y)
    # Rayleigh quotients of the normalised vectors: at least as accurate as θ, and the
    # residual below is then the true one for exactly the value reported
    values = (Y * HY).sum(1).to(torch.float64).cpu().numpy()
    R = HY - torch.as_tensor(values, dtype=op.dtype, device=op.device).unsqueeze(1) * Y
    res = torch.linalg.vector_norm(R.to(torch.float64), dim=1).cpu().tolist()
    return values, Y, res
