"""lmax: the top-k eigenvalues of H or G, with residuals and the products spent."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ..errors import ConfigError, setting
from ..linalg.certify import KATO_TEMPLE
from ..linalg.block_lanczos import block_lanczos_top, block_lanczos_top_restarted
from ..linalg.lanczos import default_max_iter, lanczos_bytes, lanczos_top, plan_steps
from ..linalg.memory import gib, limit_words
from ..linalg.thick_restart import lanczos_top_restarted, min_rows, restart_bytes
from ..linalg.power import power_top
from ..linalg.warm_block import block_top
from ..operators import CurvatureOperator
from ..report.result import ProbeResult
from .kit import budget_stop, finer_dtype, option, progress_reporter, told_if_budget
from ._memory import limit_products, memory_note, probe_limit
from ..backends.base import GGNVp, Hvp, LimitMemory
from .gating import Gating, number
from .registry import ProbeContext, register_probe

POWER_MAX_ITER = 1000


# the default tolerance per dtype: one the products' round-off lets the residual reach (in
# float32 it stalls near 6e-4·|λ| on a torchvision ResNet-18, so 1e-6 could never be met)
DEFAULT_TOL = {torch.float32: 1e-3, torch.float64: 1e-6}


# a block's working vectors (its rows, their products and leftovers) grow with it, beside the
# basis the memory plan counts: more starts than this cost memory no plan holds, for no gain
# (two resolve a pair; a cluster of more is rare at the top)
MAX_STARTS = 8
DEFAULT_STARTS = 2  # the fewest that resolve a near-degenerate pair (linalg/block_lanczos.py)
# with --k ≥ 2 the default block is k + 1 wide: the k-th value's gap then comes from a direction
# of its own, not from a small Krylov space's next Ritz value, which can sit on λ_{k+1} while λ_k
# has not been seen. On a stranger's 916-parameter ReLU MLP (λ 42.3, 30.7, 19.9) two starts at
# k = 2 certified λ3 as the second eigenvalue on 2 of 2,000 seeds (6 and 8 products); three
# starts on none (products 8.7 → 10.2 on average)


@dataclass(frozen=True)
class LmaxOptions:
    # λmax by default, as the probe's name says; the top few are one flag away (--k 5)
    k: int = option(1, "how many of the largest eigenvalues")
    matrix: Literal["hessian", "ggn"] = option("hessian", "hessian or ggn")
    method: Literal["lanczos", "power"] = option(
        "lanczos", "lanczos (block of two starts, full reorthogonalisation) or power (power finds the largest |λ|)")
    tol: float | None = option(None, "stop when every eigenvalue's error bound (r²/gap, or the residual "
                                     "‖Hq − λq‖ where no gap is resolved) ≤ TOL·|λ| [default: 1e-3 in "
                                     "float32, 1e-6 in float64]")
    max_iter: int | None = option(None, "most Lanczos basis vectors (one product each; --starts 1 adds k "
                                        "for its check), or power iterations per eigenvalue "
                                        "[default: max(300, 20k); power 1000]")
    starts: int | None = option(None, "Lanczos' random start vectors (1–8), taken as a block: 2 resolves a "
                                      "near-degenerate top pair; 1 (one vector) takes fewer products but can "
                                      "certify an eigenvalue its few steps have not yet seen past: a "
                                      "near-degenerate pair as one eigenvalue, a repeated one once, or, early, "
                                      "the next eigenvalue in the place of one it missed "
                                      "[default: 2, or k + 1 for --k ≥ 2]")

    def __post_init__(self):
        if self.k < 1:
            raise ConfigError(f"{setting('k')} must be at least 1, got {self.k}")
        if self.tol is not None and not 0 < self.tol < 1:
            raise ConfigError(f"{setting('tol')} must be in (0, 1) (a relative error bound), got {self.tol}")
        if self.starts is not None and self.method == "power":
            raise ConfigError(f"{setting('starts')} is for {setting('method')} lanczos: power iteration takes one vector at a time")
        if self.starts is not None and not 1 <= self.starts <= MAX_STARTS:
            raise ConfigError(f"{setting('starts')} must be between 1 and {MAX_STARTS}, got {self.starts}")
        if self.max_iter is not None and self.max_iter < max(1, self.k if self.method == "lanczos" else 1):
            raise ConfigError(f"{setting('max_iter')} must be at least {setting('k')} ({self.k}) for lanczos and ≥ 1 for power, "
                              f"got {self.max_iter}")

    def resolved_tol(self, dtype: torch.dtype) -> float:
        return self.tol if self.tol is not None else DEFAULT_TOL.get(dtype, DEFAULT_TOL[torch.float32])

    @property
    def resolved_starts(self) -> int:
        if self.starts is not None:
            return self.starts
        return min(MAX_STARTS, max(DEFAULT_STARTS, self.k + 1))

    @property
    def resolved_max_iter(self) -> int:
        if self.max_iter is not None:
            return self.max_iter
        return default_max_iter(self.k) if self.method == "lanczos" else POWER_MAX_ITER


def check_k_fits(k: int, parameters: int) -> None:
    """A P×P matrix has P eigenvalues; asking for more used to return fewer, marked "NOT
    converged", after the products were spent."""
    if k > parameters:
        raise ConfigError(f"{setting('k')} {k} is more than the {parameters:,} probed parameters (a matrix of that size "
                          f"has {parameters:,} eigenvalues); use {setting('k')} ≤ {parameters:,} or widen {setting('params')}")


@dataclass(frozen=True)
class LmaxGating(Gating):
    """A gate's reading of lmax: λ1 is good to its `error_bound` (at another seed, another
    start vector, an unchanged model's λ1 moves within it), and a Ritz value that did not
    converge is below λ1 by an unknown amount: no verdict on it."""

    def headline_error_bound(self, probe, result):
        found = number(result.get("error_bound"))
        if found is not None:
            return found
        # a report from before `error_bound` (schema < 2.4): a Ritz value lies within its
        # residual ‖Hv − θv‖ of an eigenvalue
        residuals = (result.get("details") or {}).get("residuals")
        return number(residuals[0]) if isinstance(residuals, list) and residuals else None

    def unresolved(self, probe, result):
        d = result.get("details") or {}
        why = super().unresolved(probe, result) if isinstance(d.get("unresolved_reason"), str) else None
        converged = d.get("converged")
        # reports from before `resolved` say it in the details
        if why is None and (result.get("resolved") is False or (
                isinstance(converged, list) and not all(converged) and not d.get("converged_to_noise"))):
            worst = max((r for r in d.get("relative_residuals") or [] if isinstance(r, (int, float))), default=None)
            shown = f" (relative residual {worst:.2g} > tol {d.get('tol')})" if worst is not None else ""
            return (f"{result.get('probe', probe)} did not converge{shown} after {result.get('matvecs')} products; "
                    f"raise probes.{result.get('probe', probe)}.max_iter or tol in the gate file")
        return why


@register_probe
class LmaxProbe:
    """Top-k eigenvalues, largest algebraic first (on an indefinite Hessian "top" means the most
    positive, not the largest in magnitude).

    Block Lanczos from two random starts with full reorthogonalisation (default;
    linalg/block_lanczos.py) stops when every one of the k Ritz values has its error bound ≤
    tol·|λ|: r²/δ (Kato–Temple), with r the residual ‖Hq − λq‖ (exact from the products kept)
    and δ the gap to the neighbouring Ritz values, or r itself where no gap is resolved
    (linalg/certify.py); `error_bound` is λ1's. The second start resolves a near-degenerate
    top pair, whose second eigenvalue a one-vector Krylov space hides. A Tracker's warm calls
    start from the previous eigenvectors (linalg/warm_block.py); a basis that does not fit
    memory is thick-restarted from one vector (linalg/thick_restart.py). Power
    iteration (the seeds' method; deflated for k > 1) sees no gap, so its bound is the
    residual, and it converges to the largest |λ|, which can be a negative eigenvalue of H:
    the notes say so when it happens. The value is λ1; there is no standard error (the
    result is deterministic given the seed, which sets the random start vector).
    """

    name: ClassVar[str] = "lmax"
    gating: ClassVar[Gating] = LmaxGating(tolerance_option="tol")
    summary: ClassVar[str] = "top-k eigenvalues of H or G (Lanczos or power iteration)"
    Options: ClassVar[type] = LmaxOptions
    requires: ClassVar[frozenset[type]] = frozenset({Hvp, GGNVp})
    command_help: ClassVar[str] = "Top-k eigenvalues of H or G (largest algebraic first), with residuals."

    def run(self, ctx: ProbeContext, options: LmaxOptions) -> ProbeResult:
        check_k_fits(options.k, ctx.backend.problem.layout.dim)
        op = CurvatureOperator(ctx.backend, options.matrix)
        start = time.perf_counter()
        max_iter = options.resolved_max_iter
        limit = probe_limit(ctx)
        what = f"probe lmax: {options.method} for k={options.k} over {op.dim:,} parameters"
        rows = None  # a thick-restarted basis of this many vectors instead of one per step
        given = options.max_iter is not None
        if options.method == "lanczos" and not _full_basis_fits(op, max_iter, limit, options.k, given):
            # a basis that cannot hold every step is thick-restarted in the rows that fit, and
            # the steps stay: cutting them short would end the run before it converges
            rows, stored = _restart_rows(ctx, op, min(max_iter, op.dim), limit, options.k, what)
            planned = max_iter
        elif options.method == "lanczos":
            planned, stored = plan_steps(max_iter, op.dim, op.dtype, limit, what=f"{what}, a basis of {max_iter} steps",
                                         flag="--max-iter", k=options.k, given=True)
        else:  # power iteration holds the k vectors it deflates against, no basis
            planned, stored = max_iter, sum(lanczos_bytes(0, op.dim, op.dtype, options.k))
        memory = limit_products(ctx, limit, stored, "lmax")
        max_iter = planned
        tol = options.resolved_tol(op.dtype)
        desc = f"lmax ({options.method})"
        progress = progress_reporter(ctx, desc)
        # cold: block Lanczos from --starts random vectors (2: resolves a near-degenerate top pair
        # that a one-vector Krylov space reports as one eigenvalue with too small a bound)
        solve = power_top if options.method == "power" else block_lanczos_top if options.resolved_starts > 1 else lanczos_top
        # a Tracker keeps the last eigenvectors and the next one (ctx.warm) and starts from them
        warm_key = (self.name, options.matrix, options.k)
        warm = ctx.warm.get(warm_key) if ctx.warm is not None and options.method == "lanczos" else None
        extra = {"start": warm} if warm is not None else {}
        restarts = None
        if rows is not None and warm is None and options.method == "lanczos" and options.resolved_starts > 1:
            # a basis of every step does not fit, but a certified stop takes a few dozen rows: the
            # block in the rows that fit, thick-restarted from its best vectors if it fills them
            res, restarts = block_lanczos_top_restarted(op, options.k, rows=rows, generator=ctx.generator(), tol=tol,
                                                        max_iter=max_iter, progress=progress,
                                                        should_stop=budget_stop(ctx), block=options.resolved_starts)
        elif rows is not None:
            extra = {"start": warm[:options.k]} if warm is not None else {}
            res, restarts = lanczos_top_restarted(op, options.k, rows=rows, generator=ctx.generator(), tol=tol,
                                                  max_iter=max_iter, progress=progress, should_stop=budget_stop(ctx),
                                                  **extra)
        elif warm is not None and warm.shape[0] > options.k:
            # the previous call's top k and next eigenvectors: Rayleigh–Ritz over them, the gap
            # from the next one (linalg/warm_block.py); W and HW held, so half the planned rows
            res = block_top(op, options.k, warm, generator=ctx.generator(), tol=tol, max_iter=max_iter,
                            progress=progress, should_stop=budget_stop(ctx), capacity=max(options.k + 2, max_iter // 2))
        else:
            if ctx.warm is not None and options.method == "lanczos":
                extra["carry_next"] = True  # the next call's block: the top k and the vector below
            if warm is not None:  # the top k carried without the vector below: one-vector Lanczos from them
                solve = lanczos_top
            if solve is block_lanczos_top:
                extra["block"] = options.resolved_starts
            res = solve(op, options.k, generator=ctx.generator(), tol=tol, max_iter=max_iter, progress=progress,
                        should_stop=budget_stop(ctx), **extra)
        told_if_budget(ctx, desc, res.stop_reason)
        if ctx.warm is not None and getattr(res, "vectors", None) is not None:
            nxt = getattr(res, "next_vector", None)
            ctx.warm[warm_key] = res.vectors if nxt is None else torch.cat([res.vectors, nxt.unsqueeze(0)])
        bn_mode = ctx.backend.problem.bn_mode
        symbol = "H" if options.matrix == "hessian" else "G"
        relative = [r / abs(v) if v != 0 else math.inf for v, r in zip(res.values, res.residuals)]
        bounds = res.bounds
        certified = sum(b.kind == KATO_TEMPLE for b in bounds)
        # every value with its bound: the table's column holds λ1's alone
        # a hard bound, not a standard error: worded as the table words it (report.render)
        shown = ", ".join(f"{v:.6g} (within {b.value:.2g})" for v, b in zip(res.values, bounds))
        # Lanczos stalls only once its own recurrence says converged and the true residual stops
        # shrinking: the products' round-off is then the floor, and the values are as good as
        # this dtype gives (a power-iteration stall can also be two close |λ|: not noise)
        to_noise = res.stop_reason == "stalled" and options.method == "lanczos"
        worst = max(relative)
        worst_bound = max(b.value / abs(v) if v != 0 else math.inf for b, v in zip(bounds, res.values))
        if all(res.converged):
            state = "converged"
        elif to_noise:
            state = (f"converged to noise (residuals at the round-off floor, {worst:.2g}·|λ|; "
                     f"error ≤ {worst_bound:.2g}·|λ|)")
        else:
            state = f"NOT converged ({sum(res.converged)}/{len(res.converged)})"
        how = (f"error ≤ r²/gap for {certified}/{len(bounds)}" if certified
               else "error ≤ residual (no gap resolved)")
        how_run = (f"power {res.iterations} iterations" if options.method == "power"
                   else f"block lanczos ({options.resolved_starts} starts) {_steps(res.iterations)}"
                   if res.method == "block lanczos" else f"lanczos {_steps(res.iterations)}")
        notes = (f"top-{len(res.values)}: {shown}; {how_run}, {state} at tol {tol:g} "
                 f"({how}); bn {bn_mode}")
        if options.method == "power" and res.values[0] < 0:
            notes += "; power iteration found the largest |λ|, which is negative: use --method lanczos for λmax"
        finer = finer_dtype(op.dtype)
        if res.stop_reason == "budget":
            notes += f"; stopped by --budget after {res.matvecs} products"
        elif to_noise:
            notes += f"; {finer} resolves them further" if finer else ""
        elif res.stop_reason == "stalled":
            notes += (f"; error bounds stalled at {worst_bound:.2g}·|λ|: use {finer + ', or ' if finer else ''}"
                      f"--tol {worst_bound * 2:.0e}")
        elif not all(res.converged):
            notes += f"; raise --max-iter (now {max_iter}) or --tol{', or use ' + finer if finer else ''}"
        block_run = res.method == "block lanczos"
        if rows is not None:
            limit = "--max-memory" if ctx.memory_allowance is not None else "the default limit, half the free memory"
            notes += (f"; a basis of at most {rows} vectors, the most that fit {limit}" if block_run else
                      f"; thick-restarted in a basis of {rows} vectors, the most that fit {limit} "
                      f"({restarts} restart{'' if restarts == 1 else 's'})")
        notes += memory_note(memory)
        return ProbeResult(
            probe=self.name,
            value=res.values[0],
            stderr=None,
            # a Ritz value short of its tolerance only bounds λmax from below: no verdict on it
            resolved=all(res.converged) or to_noise,
            # λ1's certified bound (r²/δ, or the residual r where no gap is resolved)
            error_bound=bounds[0].value if all(res.converged) or to_noise else None,
            matvecs=op.matvecs,
            seconds=time.perf_counter() - start,
            seed=ctx.seed,
            label=f"λmax({symbol})",
            notes=notes,
            details={
                "matrix": options.matrix,
                "method": options.method,
                "bn_mode": bn_mode,
                "k": options.k,
                "starts": options.resolved_starts if options.method == "lanczos" else None,
                "tol": tol,
                "max_iter": max_iter,
                # the basis held: every step's vector (full; a block's within `basis_rows` where a
                # basis of --max-iter rows did not fit), or `basis_rows` thick-restarted (Wu &
                # Simon 2000: the one-vector recurrence, or a block that filled them)
                "basis": None if options.method != "lanczos" else ("full" if rows is None or block_run
                                                                    else "thick-restart"),
                "basis_rows": rows,
                "restarts": restarts,
                "order": "largest algebraic first" if options.method == "lanczos"
                         else "power: each the largest |λ| left after deflating the ones before",
                "eigenvalues": res.values,
                "residuals": res.residuals,
                "relative_residuals": relative,
                # |λ_i − eigenvalues[i]| ≤ error_bounds[i]: which bound decided it, the gap δ it
                # used (or the unresolved estimate) and how the gaps were estimated
                "error_bounds": [b.value for b in bounds],
                "bound": [b.kind for b in bounds],
                "gaps": [b.gap for b in bounds],
                "gap_from": res.gap_from or "none: power iteration sees one vector at a time, so the bound "
                                            "is the residual",
                "converged": res.converged,
                # the residuals stalled at the products' round-off floor (Lanczos): as converged
                # as this dtype allows, not a failure
                "converged_to_noise": to_noise,
                "iterations": res.iterations,
                "stop_reason": res.stop_reason,
                "parameters": op.dim,
                # started from the eigenvectors of an earlier run (a Tracker's), not only the seed
                "warm_start": warm is not None,
                # how the true residuals were taken: Lanczos' (warm or cold, block or thick-restarted)
                # from the products it took, kept as their coefficients in the basis (no extra product)
                "residuals_from": ("each iteration's product" if options.method == "power"
                                   else "products taken" if block_run or (rows is None and warm is not None)
                                   else "one more product per Ritz vector"),
                "memory": memory,
            },
        )


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def _full_basis_fits(op, steps: int, limit: int | None, k: int, given: bool) -> bool:
    """Whether a basis of every step fits: half the limit for the default steps (the products'
    graphs get the rest), all of it for steps the user gave (the graphs are then cut to what
    the basis leaves, as far as one sample)."""
    if limit is None:
        return True
    per, fixed = lanczos_bytes(0, op.dim, op.dtype, k)
    return min(steps, op.dim) * per + fixed <= (limit if given else limit // 2)


def _restart_rows(ctx: ProbeContext, op, steps: int, limit: int, k: int, what: str) -> tuple[int, int]:
    """(rows, bytes held) of a thick-restarted basis under `limit`: half of it, as a full basis
    gets, when that holds room for k new vectors a cycle beside the kept ones; else what the
    graph of one sample leaves (the products then run a sample at a time, as memory forces).
    Refused up front (exit 2, with the bytes needed) when not even min_rows(k) fit."""
    from ..engines.microbatch import GRAPH_FACTOR, batch_sizes, forward_bytes_per_sample

    per, fixed = restart_bytes(0, op.dim, op.dtype)
    useful = min_rows(k) + k
    rows = (limit // 2 - fixed) // per
    if rows < useful:
        problem = ctx.backend.problem
        graph = GRAPH_FACTOR * forward_bytes_per_sample(problem)
        if not isinstance(ctx.backend, LimitMemory):  # batches run whole
            graph *= max(batch_sizes(problem.samples))
        rows = (limit - graph - fixed) // per
        if rows < min_rows(k):
            need = fixed + min_rows(k) * per + graph
            raise ConfigError(f"{what}: a thick-restarted Lanczos basis of {min_rows(k)} vectors, its working "
                              f"vectors and one sample's graph need {need:,} bytes ({gib(need)}), more than the "
                              f"{limit:,} bytes ({gib(limit)}) allowed ({limit_words()}); raise {setting('max_memory')} or lower --k")
    rows = int(min(rows, steps))
    return rows, fixed + rows * per
