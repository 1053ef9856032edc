"""Stochastic Lanczos quadrature (Ghorbani, Krishnan & Xiao 2019; Granziol 2020 App. B).

For a unit start vector v, m Lanczos steps give T_m = S diag(θ) Sᵀ, and the Gauss rule
with nodes θ_j and weights w_j = S_{1j}² integrates the spectral measure of H seen from v,
μ_v = Σ_i (φ_iᵀv)² δ_{λ_i}, exactly for polynomials of degree < 2m. With v = r/√P and r
Rademacher, P·E[μ_v] is the eigenvalue counting measure, so P·Σ w_j f(θ_j) is unbiased for
Tr f(H) whenever the rule is exact for f — in particular for Tr(H) and Tr(H²) from m ≥ 2.

Without re-orthogonalisation (`reorthogonalise=False`, for a model whose m-vector basis does
not fit in memory) the recurrence keeps two vectors instead of m. In floating point its basis
then loses orthogonality once Ritz values converge, and converged eigenvalues reappear as
copies ("ghosts") that share their weight. The rule stays a Gauss rule of a measure close to
μ_v (Greenbaum 1989; for SLQ's spectral CDF, Chen, Trogdon & Ubaru 2021): the density keeps
its shape, but its nodes are no longer distinct eigenvalue estimates. Tr(H) and Tr(H²) come
from α₁ and β₁ (the first step, before anything is lost) and are unbiased either way.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .lanczos import Lanczos, record_step, tridiagonal_eigh
from .random import rademacher
from .trace import Operator, Progress


@dataclass(frozen=True)
class Quadrature:
    """One start vector's Gauss rule: nodes ascending, weights summing to 1."""

    nodes: np.ndarray
    weights: np.ndarray
    steps: int  # Lanczos steps taken (fewer than asked after a breakdown)
    invariant: bool  # the Krylov space closed: the rule is μ_v itself, no approximation


@dataclass(frozen=True)
class SLQ:
    rules: list[Quadrature]
    dim: int
    matvecs: int
    stopped: bool = False  # the budget cut some rule short: fewer steps than asked

    def moment(self, power: int) -> np.ndarray:
        """P·Σ_j w_j θ_j^power for each start vector: unbiased for Tr(H^power) when 2m > power."""
        return np.array([self.dim * float(np.sum(r.weights * r.nodes**power)) for r in self.rules])

    @property
    def nodes_min(self) -> float:
        return float(min(r.nodes[0] for r in self.rules))

    @property
    def nodes_max(self) -> float:
        return float(max(r.nodes[-1] for r in self.rules))


class ThreeTermLanczos:
    """The Lanczos recurrence without re-orthogonalisation: two P-vectors, whatever the steps.
    The same interface as `Lanczos` for SLQ (step, can_step, size, invariant, ritz)."""

    def __init__(self, op: Operator, start: torch.Tensor, capacity: int):
        self.op = op
        self.capacity = max(1, min(capacity, op.dim))
        v = start.reshape(-1).to(dtype=op.dtype, device=op.device)
        norm = torch.linalg.vector_norm(v).item()
        if not norm > 0 or not math.isfinite(norm):
            raise ValueError("Lanczos start vector is zero or not finite")
        self.q = v / norm
        self.q_prev: torch.Tensor | None = None
        self.alpha: list[float] = []
        self.beta: list[float] = []
        self.beta_next = 0.0
        self.scale = 0.0
        self.invariant = False

    @property
    def size(self) -> int:
        return len(self.alpha)

    @property
    def can_step(self) -> bool:
        return not self.invariant and self.size < self.capacity

    def step(self) -> None:
        if self.size:
            self.beta.append(self.beta_next)
        # in place on the product (a fresh tensor): on a large model every temporary of the
        # recurrence is a parameter-sized vector the memory plan would have to count
        w = self.op.matmat(self.q.unsqueeze(0))[0]
        alpha = torch.dot(self.q, w).item()
        w.sub_(self.q, alpha=alpha)
        if self.q_prev is not None:
            w.sub_(self.q_prev, alpha=self.beta_next)
        beta = torch.linalg.vector_norm(w).item()
        if record_step(self, alpha, beta):
            self.invariant, self.beta_next = True, 0.0
        else:
            self.q_prev, self.q, self.beta_next = self.q, w.div_(beta), beta

    def ritz(self) -> tuple[np.ndarray, np.ndarray]:
        return tridiagonal_eigh(self.alpha, self.beta)


def slq(
    op: Operator,
    *,
    steps: int,
    starts: int,
    generator: torch.Generator,
    progress: Progress | None = None,
    deadline: float | None = None,
    reorthogonalise: bool = True,
) -> SLQ:
    """`starts` independent Gauss rules of `steps` nodes each (fewer when Lanczos breaks down,
    which means v's Krylov space is invariant and the rule is then exact for every f).

    `deadline` (a budget, as time.monotonic()) gives each start vector an equal share of the
    time left when it begins, so that every one of them runs — a standard error needs at
    least two — and a rule cut short keeps the nodes it has (a Gauss rule with fewer nodes,
    still exact for Tr(H) and Tr(H²) from two on); `stopped` says it happened."""
    steps = min(steps, op.dim)
    begin = op.matvecs
    rules = []
    stopped = False
    for s in range(starts):
        v = rademacher(1, op.dim, generator, dtype=op.dtype, device=op.device)[0]
        lz = (Lanczos if reorthogonalise else ThreeTermLanczos)(op, v, steps)
        until = None if deadline is None else time.monotonic() + (deadline - time.monotonic()) / (starts - s)
        while lz.can_step:
            lz.step()
            if progress is not None:
                progress(s * steps + lz.size, starts * steps)
            if until is not None and lz.size >= 2 and lz.can_step and time.monotonic() >= until:
                stopped = True
                break
        theta, S = lz.ritz()
        weights = S[0, :] ** 2
        rules.append(Quadrature(theta, weights / weights.sum(), lz.size, lz.invariant))
    return SLQ(rules, op.dim, op.matvecs - begin, stopped)


MAX_GRID_POINTS = 200_000


@dataclass(frozen=True)
class Density:
    grid: np.ndarray
    values: np.ndarray
    sigma: float
    per_start: list[np.ndarray] = field(default_factory=list)


def auto_sigma(result: SLQ) -> float:
    """A kernel narrow enough to keep isolated outliers apart, wide enough to merge nodes of
    one bulk: the node span over 2m, m the Lanczos steps (about half the mean gap of m
    equally spaced nodes)."""
    span = result.nodes_max - result.nodes_min
    m = max(r.steps for r in result.rules)
    if span <= 0:
        span = max(abs(result.nodes_max), 1.0)
    return span / (2 * m)


def density(result: SLQ, sigma: float | None = None, *, points: int = 1024, reach: float = 6.0) -> Density:
    """Mean over start vectors of Σ_j w_j N(x; θ_j, σ²) on a uniform grid.

    The grid reaches `reach`·σ past the outermost nodes (mass outside: erfc(reach/√2) ≈ 2e-9
    for 6) and has at least 4 points per σ, so a trapezoid sum of each Gaussian equals its
    mass to far below that (Poisson summation: error ≈ 2·exp(−2π²(σ/h)²)).
    """
    sigma = auto_sigma(result) if sigma is None else float(sigma)
    lo, hi = result.nodes_min - reach * sigma, result.nodes_max + reach * sigma
    needed = int(math.ceil((hi - lo) / sigma * 4)) + 1
    if needed > MAX_GRID_POINTS:
        raise ValueError(f"a kernel width of {sigma:.3g} needs {needed:,} grid points for nodes spanning "
                         f"[{result.nodes_min:.4g}, {result.nodes_max:.4g}]; the most is {MAX_GRID_POINTS:,}")
    points = max(points, needed)
    grid = np.linspace(lo, hi, points)
    per_start = []
    norm = 1.0 / (sigma * math.sqrt(2 * math.pi))
    for r in result.rules:
        z = (grid[:, None] - r.nodes[None, :]) / sigma
        per_start.append(norm * np.exp(-0.5 * z * z) @ r.weights)
    return Density(grid, np.mean(per_start, axis=0), sigma, per_start)
