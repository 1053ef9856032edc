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
from .trace import Z95, Operator, Progress

# the interval a spectrum moment's (value, stderr) stand for: value ± z·stderr, z the normal
# quantile, stderr floored by the per-start variance (start_variance_floor); the Frobenius
# norm's symmetric enclosure is for the 95 % level (Z95)
INTERVAL_START_FLOOR = "normal_start_variance_floor"


def mean_stderr(values: np.ndarray) -> tuple[float, float]:
    """The mean of per-start values and their spread over √n (n ≥ 2)."""
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))


@dataclass(frozen=True)
class Quadrature:
    """One start vector's Gauss rule: nodes ascending, weights summing to 1."""

    nodes: np.ndarray
    weights: np.ndarray
    steps: int  # Lanczos steps taken (fewer than asked after a breakdown)
    invariant: bool  # the Krylov space closed: the rule is μ_v itself, no approximation
    # β_m, the coupling of the Krylov space K to the rest (0 once K is invariant): H·Q = Q·T +
    # β_m q_{m+1} e_mᵀ, so ‖H‖_F² = ‖T‖_F² + 2β_m² + ‖P⊥HP⊥‖_F², P⊥ = I − QQᵀ
    beta: float = 0.0
    # (zᵀCz, zᵀC²z) of C = P⊥HP⊥ and a Rademacher z drawn after K was built: Hutchinson's
    # draws of what K left out of Tr(H) and Tr(H²) (deflated_rest); None without the basis
    rest: tuple[float, float] | None = None

    @property
    def resolved(self) -> tuple[float, float]:
        """What K holds of Tr(H) and Tr(H²) exactly: Tr T = Σθ, and ‖T‖_F² + 2β_m²."""
        return float(self.nodes.sum()), float(np.sum(self.nodes**2)) + 2 * self.beta**2


@dataclass(frozen=True)
class SLQ:
    rules: list[Quadrature]
    dim: int
    matvecs: int
    stopped: bool = False  # the budget cut some rule short: fewer steps than asked
    # the Lanczos basis was kept orthogonal (full re-orthogonalisation): the nodes are then the
    # eigenvalues of a compression QᵀHQ; without it converged eigenvalues repeat as ghosts
    orthogonal: bool = True

    def moment(self, power: int) -> np.ndarray:
        """P·Σ_j w_j θ_j^power for each start vector: unbiased for Tr(H^power) when 2m > power."""
        return np.array([self.dim * float(np.sum(r.weights * r.nodes**power)) for r in self.rules])

    @property
    def deflated(self) -> bool:
        return bool(self.rules) and all(r.rest is not None for r in self.rules)

    def sure_square(self) -> float:
        """A sure lower bound on Tr(H²): with the basis kept, the largest over starts of
        ‖T‖_F² + 2β_m² (two of the three nonnegative parts of ‖H‖_F², Quadrature.beta);
        without it ritz_power_sum(2)."""
        if self.orthogonal:
            return max(r.resolved[1] for r in self.rules)
        return self.ritz_power_sum(2)

    def ritz_power_sum(self, power: int) -> float:
        """The largest over start vectors of Σ_j |θ_j|^power: a sure lower bound on Tr|H|^power
        (Schatten norms of a compression QᵀHQ do not exceed H's; Bhatia 1997, §IV.2). Without
        re-orthogonalisation ghosts would count an eigenvalue twice, so only the largest |θ|
        counts then (‖H‖₂^power ≤ Tr|H|^power)."""
        if self.orthogonal:
            return max(float(np.sum(np.abs(r.nodes) ** power)) for r in self.rules)
        return max(float(np.max(np.abs(r.nodes))) for r in self.rules) ** power

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
    deflate: bool = False,
) -> SLQ:
    """`starts` independent Gauss rules of `steps` nodes each (fewer when Lanczos breaks down,
    which means v's Krylov space is invariant and the rule is then exact for every f).

    `deadline` (a budget, as time.monotonic()) gives each start vector an equal share of the
    time left when it begins, so that every one of them runs — a standard error needs at
    least two — and a rule cut short keeps the nodes it has (a Gauss rule with fewer nodes,
    still exact for Tr(H) and Tr(H²) from two on); `stopped` says it happened.

    `deflate` (with the basis kept) spends one more product per start on deflated_rest: what
    the start's Krylov space left out of Tr(H) and Tr(H²), for start_variance_floor."""
    steps = min(steps, op.dim)
    begin = op.matvecs
    rules = []
    stopped = False
    # a start's products: its steps, and with deflation one more for the part outside its basis
    per = steps + (1 if deflate and reorthogonalise else 0)
    for s in range(starts):
        v = rademacher(1, op.dim, generator, dtype=op.dtype, device=op.device)[0]
        lz = (Lanczos if reorthogonalise else ThreeTermLanczos)(op, v, steps)
        until = None if deadline is None else time.monotonic() + (deadline - time.monotonic()) / (starts - s)
        while lz.can_step:
            lz.step()
            if progress is not None:
                progress(s * per + lz.size, starts * per)
            if until is not None and lz.size >= 2 and lz.can_step and time.monotonic() >= until:
                stopped = True
                break
        theta, S = lz.ritz()
        weights = S[0, :] ** 2
        beta = 0.0 if lz.invariant else float(lz.beta_next)
        rest = None
        if deflate and reorthogonalise:
            rest = deflated_rest(lz, rademacher(1, op.dim, generator, dtype=op.dtype, device=op.device)[0])
            if progress is not None and lz.size < lz.op.dim:  # its product, counted as the steps' are
                progress(s * per + lz.size + 1, starts * per)
        rules.append(Quadrature(theta, weights / weights.sum(), lz.size, lz.invariant, beta, rest))
    return SLQ(rules, op.dim, op.matvecs - begin, stopped, orthogonal=reorthogonalise)


def deflated_rest(lz: Lanczos, z: torch.Tensor) -> tuple[float, float]:
    """(zᵀCz, zᵀC²z), C = P⊥HP⊥ the part of H outside the Krylov space of `lz`, for a z drawn
    independently of that space: given the space, unbiased for Tr C and Tr C² = ‖P⊥HP⊥‖_F², the
    parts of Tr(H) and Tr(H²) the space leaves out (Quadrature.resolved holds the rest). One
    product, Hu with u = P⊥z: zᵀCz = uᵀHu, zᵀC²z = ‖P⊥Hu‖². The same split of a trace into a
    part a subspace resolves and a Hutchinson estimate of the deflated rest as Hutch++ (Meyer,
    Musco, Musco & Woodruff 2021), with a Krylov space (Chen & Hallman 2023)."""
    if lz.size >= lz.op.dim:
        return 0.0, 0.0  # the whole space: nothing is left out
    u = lz._orthogonalise(z.to(dtype=lz.op.dtype, device=lz.op.device))
    hu = lz.op.matmat(u.unsqueeze(0))[0]
    first = torch.dot(u, hu).item()
    second = torch.linalg.vector_norm(lz._orthogonalise(hu)).item() ** 2
    return first, second


@dataclass(frozen=True)
class MomentEstimate:
    """A spectrum moment and its standard error, the larger of the start vectors' spread and
    the floor its known per-start variance gives (start_variance_floor)."""

    value: float
    stderr: float
    spread_stderr: float | None  # the per-start values' standard deviation over √n
    known_stderr: float | None  # the floor; None for ‖H‖_F, whose interval is Tr(H²)'s
    # a sure lower bound (SLQ.sure_square): Tr(H²) ≥ ‖T‖_F² + 2β_m², ‖H‖_F its square root;
    # None for Tr(H), which an indefinite H's Ritz values do not bound
    ritz_lower_bound: float | None = None
    # the 95 % interval: value ± Z95·stderr with its lower end raised to ritz_lower_bound
    interval95: tuple[float, float] | None = None
    # the mean of the per-start estimates fell below ritz_lower_bound and the value is the bound
    at_bound: bool = False


# how spectrum's moments are estimated (details.estimator): each start's Krylov space resolves
# its part exactly and an independent vector estimates the rest (SLQ.deflated); without the
# basis, each start's Gauss rule, Hutchinson's rᵀf(H)r
ESTIMATOR_DEFLATED = "krylov_deflated"
ESTIMATOR_RULE = "gauss_rule"


def start_estimates(result: SLQ) -> tuple[np.ndarray, np.ndarray]:
    """Each start's estimate of Tr(H) and of Tr(H²) (start_variance_floor's, whose means they
    are): deflated where the run is (SLQ.deflated), else the Gauss rule's."""
    if not result.deflated:
        return result.moment(1), result.moment(2)
    resolved = np.array([r.resolved for r in result.rules])
    rest = np.array([r.rest for r in result.rules])
    return resolved[:, 0] + rest[:, 0], resolved[:, 1] + rest[:, 1]


def start_variance_floor(result: SLQ, roundoff: float = 0.0) -> dict[str, MomentEstimate]:
    """Tr(H), Tr(H²) and ‖H‖_F = √Tr(H²) with standard errors a normal interval value ± z·stderr
    can be read from (INTERVAL_START_FLOOR), over the n start vectors of `result`.

    With the basis kept (SLQ.deflated), start i's estimate is what its Krylov space K_i resolves
    exactly (Quadrature.resolved: Σθ for Tr(H); ‖T‖_F² + 2β_m² for Tr(H²)) plus a Hutchinson
    draw of the rest with a vector independent of K_i (Quadrature.rest): unbiased, and its error
    is that draw's alone, of C_i = P⊥HP⊥, which holds none of the eigenvalues K_i found. Once K_i
    holds the dominant eigenvalues (a few dozen steps: Lanczos finds outliers whatever their
    weight in the start), Tr(H²)'s rest is small and so is its error; where K_i closed, the rest
    is what its start could not reach (an eigenvalue's further multiplicity), 0 on a spectrum of
    distinct eigenvalues. Without the basis it is the start's Gauss rule, P·Σwθ^p = rᵀH^p r.

    A draw's variance is known, Var zᵀAz = 2(‖A‖_F² − Σ A_jj²) ≤ 2·Tr A², and where few
    eigenvalues dominate A, draws are skewed: a few that miss them give a low mean and a small
    spread together (the spread of two Gauss-rule starts read on Student's t, dof 1, covered the
    truth in 89–90 % of runs for a nominal 95 % on a small CNN's G). So each stderr is floored by
    √(Σ_i 2·Tr A_i²)/n, with the moment it needs taken from the run itself:

    - Tr(H²): the mean estimate, raised to the sure lower bound SLQ.sure_square (the estimate
      is never below what the Krylov spaces prove; `at_bound` says it was raised), which is also
      the lower end of its interval (interval95).
    - Tr(H) needs Tr A² = Tr C_i² (deflated: Tr(H²) less K_i's part, with Tr(H²) the largest
      start's estimate where that is above the value: a draw that missed the rest's dominant
      eigenvalues would otherwise shrink its own floor; else Tr(H²)).
    - Tr(H²) needs Tr A² = Tr C_i⁴ (deflated: at most (Tr C_i²)², ‖H‖₂²·Tr C_i² with ‖H‖₂ the
      largest |θ|, and Tr(H⁴); else Tr(H⁴)), Tr(H⁴) the larger of its Gauss-rule estimate (exact
      for rules of ≥ 3 nodes) and Σθ⁴; where a rule has 2 nodes (a --budget cut) the estimate of
      Tr(H⁴) is not exact and (Tr H²)² stands in. These caps exceed Tr C_i⁴ where the rest is
      spread over many eigenvalues, and the interval is then wider than it needs to be (2–8× on
      small models at 10–100 steps) but still many times narrower than the Gauss rule's.
    - ‖H‖_F: the square root of Tr(H²)'s interval, and its symmetric enclosure about √Tr(H²) as
      stderr (the square root bends the interval: the lower side is the longer).

    The moments in the floors are estimates from the same starts, not the truth; the Ritz
    bounds are what keeps them from failing together with the values they bound.

    `roundoff` (relative: certify's units of the products' dtype eps) floors each stderr at that
    share of its value: where every start's Krylov space closes, the starts agree to round-off
    and an interval of zero width would miss the exact value by a few ulps.
    """
    n = len(result.rules)
    sure2 = result.sure_square()
    m1, m2 = start_estimates(result)
    resolved = np.array([r.resolved for r in result.rules])
    spread1, spread2 = (mean_stderr(m)[1] if n > 1 else None for m in (m1, m2))
    t1, mean2 = float(m1.mean()), float(m2.mean())
    t2 = max(mean2, sure2)
    if all(r.invariant or r.steps >= 3 for r in result.rules):
        fourth = max(float(result.moment(4).mean()), result.ritz_power_sum(4))
    else:
        fourth = t2 * t2
    if result.deflated:
        # each start's Tr C_i², from Tr(H²) held up by the largest start's estimate
        left = np.maximum(max(t2, float(m2.max())) - resolved[:, 1], 0.0)
        known1 = math.sqrt(2 * float(left.sum())) / n
        top = max(abs(result.nodes_min), abs(result.nodes_max)) ** 2  # ≈ ‖H‖₂² ≥ ‖C_i‖₂²
        known2 = math.sqrt(2 * float(np.minimum(np.minimum(left, top) * left, fourth).sum())) / n
    else:
        known1, known2 = math.sqrt(2 * t2 / n), math.sqrt(2 * fourth / n)
    se1 = max(spread1 or 0.0, known1, roundoff * abs(t1))
    se2 = max(spread2 or 0.0, known2, roundoff * t2)
    # the sure bound is itself computed with round-off: the interval may reach that far below it
    lo2, hi2 = max(t2 - Z95 * se2, sure2 * (1 - roundoff)), t2 + Z95 * se2
    frob, lo, hi = math.sqrt(t2), math.sqrt(lo2), math.sqrt(hi2)
    se_frob = max(frob - lo, hi - frob) / Z95
    raised = mean2 < sure2
    return {
        "trace": MomentEstimate(t1, se1, spread1, known1, interval95=(t1 - Z95 * se1, t1 + Z95 * se1)),
        "trace_sq": MomentEstimate(t2, se2, spread2, known2, sure2, (lo2, hi2), raised),
        "frobenius": MomentEstimate(frob, se_frob, None, None, math.sqrt(sure2), (lo, hi), raised),
    }


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
