"""Power iteration (the seeds' λmax method), deflated for k > 1, with a residual stopping rule."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .certify import residual_bounds, round_off_floor
from .forecast import DecayForecast
from .lanczos import STALL_FACTOR, EigenResult
from .random import gaussian
from .reduce import not_finite
from .trace import Operator, Progress, StopTest


# iterations without halving the best residual after which power iteration counts as stalled
STALL_WINDOW = 200


def power_top(
    op: Operator,
    k: int,
    *,
    generator: torch.Generator,
    tol: float = 1e-6,
    max_iter: int = 1000,
    progress: Progress | None = None,
    should_stop: StopTest | None = None,
) -> EigenResult:
    """k eigenpairs by power iteration, each on H restricted to the complement of those before.

    Power iteration converges to the eigenvalue of largest MAGNITUDE, which on an indefinite
    Hessian can be the most negative one; the caller says so when it happens. Each iterate
    v gives w = Hv, λ = vᵀw and the true residual ‖w − λv‖ from that one product, so the
    stopping rule ‖Hv − λv‖ ≤ tol·|λ| costs nothing extra. Convergence is linear with
    rate |λ₂/λ₁|: slow when the top of the spectrum is crowded (Lanczos is not). It stops
    as "stalled" when the best residual has not halved in max(200, n) iterations after
    n iterations — round-off, or two eigenvalues of nearly equal magnitude. `should_stop`
    (a budget) ends it after any iteration (stop_reason "budget"): the pairs not reached
    yet are left out, the one in progress is reported with its residual.
    """
    k = min(k, op.dim)
    start_matvecs = op.matvecs
    found: list[Tensor] = []
    values, residuals, iterations = [], [], 0
    stalled = budget = False
    for i in range(k):
        if budget:
            break
        basis = torch.stack(found) if found else None
        v = _project(gaussian(1, op.dim, generator, dtype=op.dtype, device=op.device)[0], basis)
        v = v / torch.linalg.vector_norm(v)
        lam, res = math.nan, math.inf
        best, best_at = math.inf, 0
        forecast, before = DecayForecast(max_iter), iterations
        for it in range(max_iter):
            w = _project(op.matmat(v.unsqueeze(0))[0], basis)
            lam = torch.dot(v, w).item()
            res = torch.linalg.vector_norm((w - lam * v).to(torch.float64)).item()
            iterations += 1
            if not math.isfinite(res):
                raise not_finite(op.dtype)
            if progress is not None:  # this pair's forecast, and as many for each pair after it
                ahead = forecast.total(it + 1, res / (tol * abs(lam)) if lam else math.inf)
                progress(before + it + 1, ahead and before + ahead * (k - i), value=lam)
            if res <= tol * abs(lam):
                break
            if should_stop is not None and should_stop():
                budget = True
                break
            if res < STALL_FACTOR * best:
                best, best_at = res, it
            elif it - best_at > max(STALL_WINDOW, best_at):
                stalled = True
                break
            norm = torch.linalg.vector_norm(w).item()
            if norm == 0:  # v lies in the null space: 0 is an exact eigenvalue here
                break
            v = w / norm
        found.append(v)
        values.append(lam)
        residuals.append(res)
    converged = [r <= tol * abs(v) or (r == 0) for v, r in zip(values, residuals)]
    return EigenResult(
        values=values,
        residuals=residuals,
        converged=converged,
        matvecs=op.matvecs - start_matvecs,
        iterations=iterations,
        stop_reason="converged" if all(converged) and not budget else
                    ("budget" if budget else "stalled" if stalled else "max_iter"),
        method="power",
        # one vector at a time sees no other Ritz value, so no gap: the residual is the bound
        bounds=residual_bounds(residuals, round_off_floor(op, max((abs(v) for v in values), default=0.0))),
    )


def _project(v: Tensor, basis: Tensor | None) -> Tensor:
    if basis is None:
        return v
    for _ in range(2):  # twice, as in Lanczos, so deflation survives round-off
        v = v - (basis @ v) @ basis
    return v
