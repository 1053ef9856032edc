"""Spectrum: the eigenvalue density of H or G by stochastic Lanczos quadrature."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from ..errors import ConfigError, setting
from ..linalg.certify import ROUNDOFF_UNITS
from ..linalg.lanczos import lanczos_bytes, plan_steps
from ..linalg.memory import gib
from ..linalg.slq import (ESTIMATOR_DEFLATED, ESTIMATOR_RULE, INTERVAL_START_FLOOR, SLQ, density, slq,
                          start_estimates, start_variance_floor)
from ..operators import CurvatureOperator
from ..report.plots import check_plot_target, plot_density, plot_nodes
from ..report.progress_hooks import counted, report_stop
from ..report.result import ProbeResult
from .kit import option, progress_reporter
from ._memory import limit_products, memory_note, probe_limit
from ..backends.base import GGNVp, Hvp
from .gating import Gating
from .registry import ProbeContext, register_probe


def check_slq_options(steps: int, starts: int) -> None:
    if steps < 2:
        # one node integrates only constants and linear functions: no Tr(H²), no shape
        raise ConfigError(f"{setting('lanczos_steps')} must be at least 2, got {steps}")
    if starts < 2:
        raise ConfigError(f"{setting('starts')} must be at least 2 (a standard error needs two start vectors), got {starts}")


def run_slq(ctx: ProbeContext, op: CurvatureOperator, steps: int, starts: int, desc: str,
            memory: dict | None = None, deflate: bool = False) -> SLQ:
    # progress counts products: a start cut short by --budget would make slq's own count jump
    result = slq(op, steps=steps, starts=starts, generator=ctx.generator(),
                 progress=counted(progress_reporter(ctx, desc)), deadline=ctx.deadline,
                 reorthogonalise=(memory or {}).get("reorthogonalization", "full") == "full", deflate=deflate)
    if result.stopped:
        report_stop(ctx.progress, desc, "budget")
    return result


def plan_slq(ctx: ProbeContext, op: CurvatureOperator, steps: int, desc: str, reorth: str = "full") -> dict:
    """--max-memory before SLQ runs, and with it whether the Lanczos basis is kept (`reorth`):
    full keeps `steps` vectors and is refused up front (exit 2, with the steps that would fit)
    when they do not fit beside the backend's graphs; none keeps two; auto takes full when it
    fits and none otherwise, saying why. The memory plan, for the details."""
    limit = probe_limit(ctx)
    what = f"probe {desc}: a Lanczos basis of {steps} steps over {op.dim:,} parameters"
    per, fixed = lanczos_bytes(steps, op.dim, op.dtype)
    need = min(steps, op.dim) * per + fixed
    reason = None
    if reorth == "auto":
        fits = limit is None or need <= limit
        reorth = "full" if fits else "none"
        if not fits:
            reason = (f"a {min(steps, op.dim)}-step basis needs {gib(need)}, more than the {gib(limit)} "
                      "--max-memory leaves the probe (without it, half the free memory)")
    if reorth == "full":
        _steps, stored = plan_steps(steps, op.dim, op.dtype, limit, flag="--lanczos-steps", what=what)
    else:
        stored = fixed  # the recurrence's own vectors only
    plan = limit_products(ctx, limit, stored, desc)
    return {**plan, "reorthogonalization": reorth, **({"reorthogonalization_reason": reason} if reason else {})}


def reorth_note(memory: dict) -> str:
    """A note's clause when the basis was not kept."""
    if memory.get("reorthogonalization") != "none":
        return ""
    why = memory.get("reorthogonalization_reason")
    return ("; Lanczos without re-orthogonalisation" + (f" ({why})" if why else "") +
            ": the density may hold copies of converged eigenvalues; Tr and Tr² are unaffected")


def budget_cut(result: SLQ, asked: int) -> str | None:
    """What --budget left of the rules, in words, or None when it cut none: a rule of a few
    nodes integrates the moments Tr and Tr² but places no eigenvalue."""
    if not result.stopped:
        return None
    taken = [r.steps for r in result.rules]
    lo, hi = min(taken), max(taken)
    span = f"{lo}" if lo == hi else f"{lo}–{hi}"
    return f"--budget cut the Lanczos rules to {span} of {min(asked, result.dim)} steps"


def rough_note(starts: int) -> str:
    """The note of a ± over so few start vectors that the table marks it rough (report/render.
    ROUGH_DOF), with how many make it usable; "" from there on. The default stays 2 starts
    (dof 1) for its cost: each start is --lanczos-steps products."""
    from ..report.render import ROUGH_DOF

    if starts - 1 >= ROUGH_DOF:
        return ""
    # not "--starts 6 suffices": a quadratic form of a matrix that one eigenvalue dominates is
    # skewed (most starts miss that direction), so a few starts under-read the mean and its
    # spread alike, and dof alone does not make the ± usable
    return (f"; the ± rest on {starts} starts (dof {starts - 1}) and are rough: raise --starts (20, say) "
            f"for a usable error bar")


def budget_unresolved(result: SLQ, asked: int, lost: str) -> str | None:
    """details.unresolved_reason of an SLQ probe whose rules --budget cut (budget_cut), or None
    when it cut none. A rule cut short has fewer nodes than asked for, and what its nodes place
    (`lost`: the density's shape, the origin's mass) is then another quantity than a full run's,
    which no gate may compare with one; the moments Tr and Tr² stay unbiased."""
    cut = budget_cut(result, asked)
    if cut is None:
        return None
    return f"{cut}: too few nodes to {lost}; raise --budget, or lower --starts or --lanczos-steps"


def stop_reason(result: SLQ) -> str:
    """Why the rules have the nodes they have (details.stop_reason): the budget, every start's
    Krylov space closing before its steps ("closed", fewer steps taken than asked), or the
    steps asked for."""
    if result.stopped:
        return "budget"
    return "closed" if result.rules and all(r.invariant for r in result.rules) else "steps"


# the SLQ options spectrum and rank share: one declaration each
def lanczos_steps_option() -> Any:
    return option(100, "Lanczos steps (quadrature nodes) per start vector")


def starts_option() -> Any:
    # 2 by default: each start is --lanczos-steps products plus a re-orthogonalisation that
    # grows with the steps, and 3 × 100 on a torchvision ResNet-18 (64 samples, 2 cores) took
    # 195 s against the 3-minute goal for a default run. A gate that finds the interval too
    # wide raises the starts (effort_option) when its policy is rerun.
    return option(2, "Rademacher start vectors (≥ 2, for a standard error: spectrum's floored by a start's known "
                     "variance, rank's on starts − 1 degrees of freedom)")


def reorth_option() -> Any:
    return option("auto", "full: keep the Lanczos basis (steps × parameters numbers) and re-orthogonalise against "
                          "it; none: keep two vectors (the density may show copies of converged eigenvalues; "
                          "Tr and Tr² unaffected); auto: full when the basis fits --max-memory, else none")


def _sigma(text: str) -> float | None:
    if text.strip().lower() in ("auto", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{setting('sigma')} must be 'auto' or a positive number, got {text!r}") from None


@dataclass(frozen=True)
class SpectrumOptions:
    matrix: Literal["hessian", "ggn"] = option("hessian", "hessian or ggn")
    lanczos_steps: int = lanczos_steps_option()
    starts: int = starts_option()
    reorth: Literal["auto", "full", "none"] = reorth_option()
    # Gaussian kernel width; None: span of the nodes / (2·steps)
    sigma: float | None = option(None, "Gaussian kernel width of the density, or auto (node span / (2·steps))",
                                 parse=_sigma, show_default="auto")
    plot: str | None = option(None, "write the density to PATH.png (log y-axis; needs matplotlib)")

    def __post_init__(self):
        check_slq_options(self.lanczos_steps, self.starts)
        if self.sigma is not None and not (self.sigma > 0 and math.isfinite(self.sigma)):
            raise ConfigError(f"{setting('sigma')} must be 'auto' or a positive number, got {self.sigma}")
        if self.plot is not None:
            check_plot_target(self.plot)


@dataclass(frozen=True)
class SpectrumGating(Gating):
    """Until schema 2.6 spectrum's standard errors were the spread of its few starts on t with
    starts − 1 dof, far too small where the starts miss the top eigenvalues; from 2.6 each is
    floored by a start's known variance (a normal interval). A gate weighing an old record's
    error beside a new one would mix the two. A record without details.estimator took each
    start's Gauss rule alone: unbiased, with an honest but wide error, so it stays a baseline
    (a rule against it is decided on that width, or rerun)."""

    def superseded(self, probe, result, schema, fields):
        # by the record, not the schema alone: 2.6 came a few commits before the floor did
        if (result.get("details") or {}).get("interval") != INTERVAL_START_FLOOR:
            return ("its standard errors are the spread of its starts alone, measured before spectrum floored each "
                    "by a start's known variance (schema 2.6)")
        return None


@register_probe
class SpectrumProbe:
    """Stochastic Lanczos quadrature: `starts` Rademacher start vectors (normalised), each with
    `lanczos_steps` steps of Lanczos with full reorthogonalisation. Nodes are the Ritz values,
    weights the squared first components of T's eigenvectors (they sum to 1 per start vector);
    the density is the mean over start vectors of Gaussian kernels at the nodes.

    Per start vector Tr(H) and Tr(H²) are what its Krylov space resolves exactly plus a
    Hutchinson draw of the rest from one more product with an independent vector (without the
    basis: P·Σ w θ and P·Σ w θ², the Gauss rule, exact for these polynomials); both unbiased.
    Tr(H²) is never below the sure bound the Krylov spaces give. Their means are reported with
    standard errors floored by each
    start's known variance, estimated from the run's own Tr(H²), Tr(H⁴) and Ritz values (a
    normal interval, dof null: linalg.slq.start_variance_floor says which moment each floor
    uses), with ‖H‖_F = √Tr(H²) (its error from Tr(H²)'s interval) as the value, the mean eigenvalue
    Tr/P, and the spectral norm max|θ| — a lower bound on ‖H‖₂ (Ritz values interlace the
    eigenvalues), equal to it once the extreme Ritz value has converged. A Lanczos breakdown
    means the start vector's Krylov space is invariant: that rule stops early and is exact.
    """

    name: ClassVar[str] = "spectrum"
    # every field is an average over the same few start vectors (one normal interval, its stderr
    # floored by the per-start variance: start_variance_floor); a rerun raises them
    gating: ClassVar[Gating] = SpectrumGating(effort_option="starts", every_field_shares_draws=True)
    summary: ClassVar[str] = "eigenvalue density, Tr(H), Tr(H²), ‖H‖_F by stochastic Lanczos quadrature"
    Options: ClassVar[type] = SpectrumOptions
    requires: ClassVar[frozenset[type]] = frozenset({Hvp, GGNVp})
    command_help: ClassVar[str] = "Eigenvalue density of H or G by stochastic Lanczos quadrature; Tr, Tr², norms."

    def run(self, ctx: ProbeContext, options: SpectrumOptions) -> ProbeResult:
        op = CurvatureOperator(ctx.backend, options.matrix)
        start = time.perf_counter()
        memory = plan_slq(ctx, op, options.lanczos_steps, "spectrum (SLQ)", options.reorth)
        result = run_slq(ctx, op, options.lanczos_steps, options.starts, "spectrum (SLQ)", memory, deflate=True)
        cut = budget_cut(result, options.lanczos_steps)
        unresolved = budget_unresolved(
            result, options.lanczos_steps, "place the eigenvalues, so the density's shape is not resolved and no "
            "smoothed density is given (Tr, Tr² and the norm stay unbiased)")
        dens = None
        if cut is None:
            try:
                dens = density(result, options.sigma)
            except ValueError as exc:
                raise ConfigError(f"{setting('sigma')}: {exc}") from None
        P = op.dim
        # no interval narrower than the products' round-off (linalg.certify.ROUNDOFF_UNITS of eps)
        moments = start_variance_floor(result, ROUNDOFF_UNITS * torch.finfo(op.dtype).eps)
        trace, trace_se = moments["trace"].value, moments["trace"].stderr
        trace_sq, trace_sq_se = moments["trace_sq"].value, moments["trace_sq"].stderr
        frob, frob_se = moments["frobenius"].value, moments["frobenius"].stderr
        spectral = max(abs(result.nodes_min), abs(result.nodes_max))
        bn_mode = ctx.backend.problem.bn_mode
        symbol = "H" if options.matrix == "hessian" else "G"
        steps_taken = [r.steps for r in result.rules]
        invariant = sum(r.invariant for r in result.rules)

        plot_path = None
        if options.plot is not None:
            arch = ctx.spec.arch if ctx.spec is not None else "model"
            smoothing = f"σ = {dens.sigma:.3g}" if dens is not None else "UNRESOLVED: nodes only, not smoothed"
            title = (f"{arch}: eigenvalue density of {'the Hessian' if symbol == 'H' else 'the GGN'} {symbol}\n"
                     f"SLQ {options.starts}×{max(steps_taken)} steps, {smoothing}, "
                     f"N = {ctx.backend.problem.samples.n}, bn {bn_mode}")
            nodes = np.concatenate([r.nodes for r in result.rules])
            if dens is not None:
                plot_density(options.plot, dens.grid, dens.values, title=title, nodes=nodes)
            else:
                # each start's weights are a probability over its nodes: 1/starts of the mean rule
                weights = np.concatenate([r.weights for r in result.rules]) / len(result.rules)
                plot_nodes(options.plot, nodes, weights, title=title, note=cut)
            plot_path = options.plot

        notes = (f"Tr({symbol}) {trace:.4g} ± {trace_se:.2g}, Tr({symbol}²) {trace_sq:.4g} ± {trace_sq_se:.2g}, "
                 f"‖{symbol}‖₂ ≥ {spectral:.4g}, "
                 f"‖{symbol}‖_F ≥ {moments['frobenius'].ritz_lower_bound:.4g} (sure, from the Krylov spaces)"
                 f"{', raised to it' if moments['frobenius'].at_bound else ''}, "
                 f"nodes in [{result.nodes_min:.4g}, {result.nodes_max:.4g}]; "
                 f"{options.starts} starts × {max(steps_taken)} steps; bn {bn_mode}")
        if invariant:
            # closed to β ≤ √eps·‖T‖: exact in float64 on a spectrum resolved above that, while in
            # float32 eigenvalues closer than it to one another (or to 0) merge into one node
            dtype = str(op.dtype).removeprefix("torch.")
            notes += (f"; {invariant} start(s) closed their Krylov space early (to √eps·‖{symbol}‖ in {dtype}: "
                      "nodes closer than that merge; Tr and Tr² are not affected)")
        notes += ("; Tr and Tr²: each start's Krylov-space part plus an independent vector's draw of the rest"
                  if result.deflated else "")
        notes += ("; ± floored by the per-start variance (from Tr²/Tr⁴ and the Ritz values' bounds; "
                  "normal interval)")
        if unresolved is not None:
            notes += f"; UNRESOLVED: {unresolved}"
        notes += memory_note(memory) + reorth_note(memory)
        if plot_path:
            notes += f"; plot {plot_path}"
        return ProbeResult(
            probe=self.name,
            value=frob,
            stderr=frob_se,
            # normal: the stderr is at least the known per-start variance's (start_variance_floor),
            # not a spread of starts − 1 dof alone
            dof=None,
            matvecs=op.matvecs,
            seconds=time.perf_counter() - start,
            seed=ctx.seed,
            label=f"‖{symbol}‖_F (SLQ)",
            notes=notes,
            resolved=unresolved is None,
            details={
                "matrix": options.matrix,
                "bn_mode": bn_mode,
                "parameters": P,
                "lanczos_steps": options.lanczos_steps,
                "starts": options.starts,
                "steps_taken": steps_taken,
                "stop_reason": stop_reason(result),
                # every stderr below is for value ± z·stderr, z normal (linalg.slq.start_variance_floor):
                # the larger of the starts' spread (spread_stderr) and the known per-start variance's
                # floor (known_stderr); ‖·‖_F's is the square root of trace_sq's interval.
                # ritz_lower_bound: what the Krylov spaces prove (Tr² ≥ ‖T‖_F² + 2β²), whatever the
                # weights; the value is never below it (at_bound: raised to it), nor interval95's
                # lower end
                "interval": INTERVAL_START_FLOOR,
                "estimator": ESTIMATOR_DEFLATED if result.deflated else ESTIMATOR_RULE,
                **{key: {"value": est.value, "stderr": est.stderr, "spread_stderr": est.spread_stderr,
                         "known_stderr": est.known_stderr, "ritz_lower_bound": est.ritz_lower_bound,
                         "interval95": list(est.interval95), "at_bound": est.at_bound}
                   for key, est in moments.items()},
                "mean_eigenvalue": {"value": trace / P, "stderr": trace_se / P},
                "spectral_norm": spectral,
                "spectral_norm_note": "max |Ritz value|: a lower bound on the spectral norm",
                "node_range": [result.nodes_min, result.nodes_max],
                # trace, trace_sq: the start's estimates (their means are the values); beta and
                # rest: what the start's Krylov space couples to and leaves out (linalg.slq.Quadrature)
                "per_start": [
                    {"nodes": r.nodes.tolist(), "weights": r.weights.tolist(), "steps": r.steps,
                     "invariant": r.invariant, "beta": r.beta, "rest": None if r.rest is None else list(r.rest),
                     "trace": float(t), "trace_sq": float(t2)}
                    for r, t, t2 in zip(result.rules, *start_estimates(result))
                ],
                "density": ({"sigma": dens.sigma, "grid": dens.grid.tolist(), "values": dens.values.tolist()}
                            if dens is not None else
                            {"sigma": None, "grid": None, "values": None, "null_reason": unresolved}),
                **({"unresolved_reason": unresolved} if unresolved is not None else {}),
                "plot": plot_path,
                "memory": memory,
            },
        )
