"""Adaptive sharpness (Kwon et al. 2021, Andriushchenko et al. 2023, Chen et al. 2023 §E.2, App. F):
elementwise adaptive average-case sharpness."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import ClassVar, Iterator, Literal

import torch
from torch import Tensor

from ..backends import Hvp, Outputs, rebuild
from ..backends.base import Backend
from ..errors import ConfigError, SpecError, setting
from ..linalg import hutchinson
from ..models.spec import LOSSES, LossSpec
from ..operators import CurvatureOperator
from ..report.result import ProbeResult
from .kit import budget_stop, option, progress_reporter, refuse_unused, time_left, told_if_budget
from .kit import mean_loss as sample_loss  # L(θ) over the sample set
from .gating import Gating
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class AdaptiveSharpnessOptions:
    rho: float = option(0.0005, "relative noise scale: δ ~ N(0, ρ² |w|²)")
    # independent δ; each is evaluated at +δ and −δ
    noise_draws: int = option(16, "Monte Carlo draws δ (each at +δ and −δ)")
    # overrides the spec's loss for this probe only
    loss: str | None = option(None, "loss for this probe: cross_entropy, mse, sigmoid_mse or label_smoothing "
                                    "[default: the spec's]")
    method: Literal["mc", "second-order", "both"] = option("both", "mc, second-order or both")
    probes_max: int = option(100, "Hutchinson probes of the second-order form",
                             flags=("--probes-max", "--max-probes"))
    block_size: int | None = option(None, "probes per block of the second-order form [default: sized by "
                                          "memory, as for trace]")

    def __post_init__(self):
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ConfigError(f"{setting('rho')} must be a positive number, got {self.rho}")
        if self.noise_draws < 2:
            raise ConfigError(f"{setting('noise_draws')} must be at least 2 (a standard error needs two draws), "
                              f"got {self.noise_draws}")
        if self.probes_max < 2:
            raise ConfigError(f"{setting('probes_max')} must be at least 2 (a standard error needs two probes), "
                              f"got {self.probes_max}")
        if self.block_size is not None and self.block_size < 1:
            raise ConfigError(f"adaptive-sharpness.block_size must be a positive integer, got {self.block_size}")
        if self.loss is not None:
            try:
                name = LossSpec(self.loss).name
            except SpecError:
                raise ConfigError(f"{setting('loss')} must be one of {', '.join(LOSSES)}, got {self.loss!r}") from None
            object.__setattr__(self, "loss", name)


    def check_given(self, given: frozenset[str]) -> None:
        """An estimator's options given with the method that does not run it did nothing
        (registry.parse_options passes the names given; defaults are not the user's)."""
        unused = {"mc": ("probes_max", "block_size"), "second-order": ("noise_draws",)}.get(self.method, ())
        other = "second-order" if self.method == "mc" else "mc"
        refuse_unused(self, given, unused, "adaptive-sharpness", f"{setting('method')} {self.method}",
                      f"it sizes the {other} estimate", f"leave it out or use {setting('method')} both")


# the headline's routes (details.route), each with the `method` that takes it alone
ROUTE_METHODS = {"monte-carlo": "mc", "second-order": "second-order"}
# rounding floors of L that S_ρ must reach for the Monte Carlo headline: the pairs share L(w)'s
# rounding, a bias of the order of a floor (a few, through a deep forward pass), about 1 % there
ROUNDING_MARGIN = 100.0
# second-order probes, on a stream of their own, that decide the route and nothing else: an
# estimate of S_ρ's order, against a margin of 100 floors, needs no more
PILOT_PROBES = 8


@register_probe
class AdaptiveSharpnessProbe:
    """S_ρ = E_{δ ~ N(0, ρ² diag(|w|²))}[L(w + δ)] − L(w) over the parameters of the layout
    (all trainable ones, or those `--params` selects), on the whole sample set.

    Monte Carlo: δ = ρ·|w|⊙ε with ε standard normal, evaluated as an antithetic pair,
    s = (L(w + δ) + L(w − δ))/2 − L(w). The pair cancels every odd-order term of the Taylor
    series exactly (s = ½δᵀHδ + O(δ⁴)), which removes the gradient term's variance; the mean
    and standard error are over the `noise_draws` pairs. Weights are restored by copying the
    saved tensors back (never by subtracting δ, which would not round-trip in floating point).
    In float32 each loss carries a rounding error of order eps·L, visible in the stderr when
    S_ρ is that small; use --dtype float64 then.

    Second order: S_ρ ≈ (ρ²/2)·Tr(diag|w| H diag|w|), by Hutchinson on the operator
    V ↦ (H (V⊙|w|))⊙|w| with Rademacher V, with its own standard error and matvecs.
    `loss` replaces the spec's loss for this probe (Chen et al. 2023 use sigmoid-mse for ViTs).
    Headline (details.route): the Monte Carlo value where the loss's rounding cannot hold it up
    — a pilot of PILOT_PROBES second-order probes puts S_ρ at ROUNDING_MARGIN rounding floors
    ε·|L| or more — else the second-order form, whose Hessian products do not lose S_ρ in the
    rounding of two nearly equal losses (on an ImageNet ViT in float32 at ρ = 5e-4 the Monte
    Carlo value is 0 within noise). Every pair shares the rounding of L(w), a bias its standard
    error does not show. The pilot's probes are a stream of their own, shared with neither
    estimate: a route decided by the estimate it then reports favours that estimate's draws
    (taking the Monte Carlo value when its own interval cleared zero biased the headline by
    +16 % over seeds on a small MLP in float64, +26 % where it was taken, and flipped with the
    seed; deciding by the second-order estimate biases it downwards near the threshold, by 3–11 %
    in simulation). A non-finite Monte Carlo value is never the headline. details.route_reason
    says why and details.route_pilot holds the pilot. Both
    parts stay in details; method "mc" or "second-order" fixes the route.
    """

    name: ClassVar[str] = "adaptive-sharpness"
    summary: ClassVar[str] = "elementwise adaptive sharpness (Monte Carlo and second-order form)"
    Options: ClassVar[type] = AdaptiveSharpnessOptions
    requires: ClassVar[frozenset[type]] = frozenset({Hvp, Outputs})
    # S_ρ grows as ρ² (loss None: the model's); its two routes are two estimators of S_ρ
    # a rerun raises the count of the estimate the headline is: the draws of δ or the probes
    gating: ClassVar[Gating] = Gating(quantity_options=("rho", "loss"), routes=frozenset(ROUTE_METHODS),
                                      estimator_routes=ROUTE_METHODS, route_option="method",
                                      route_efforts={"monte-carlo": "noise_draws", "second-order": "probes_max"},
                                      field_efforts={"details.mc.": "noise_draws",
                                                     "details.second_order.": "probes_max"})
    command_help: ClassVar[str] = ("Elementwise adaptive sharpness: Monte Carlo over ±δ noise pairs and its "
                                   "second-order Hutchinson form.")

    def run(self, ctx: ProbeContext, options: AdaptiveSharpnessOptions) -> ProbeResult:
        start = time.perf_counter()
        backend = ctx.backend
        if options.loss is not None and options.loss != backend.problem.loss.name:
            backend = rebuild(backend, loss=LossSpec(options.loss))
        problem = backend.problem
        details: dict = {"rho": options.rho, "loss": problem.loss.name, "method": options.method,
                         "parameters": problem.layout.dim}
        mc = second = None
        if options.method in ("mc", "both"):
            mc = monte_carlo(backend, options.rho, options.noise_draws, ctx.generator(),
                             progress_reporter(ctx, "adaptive-sharpness (Monte Carlo)"), budget_stop(ctx))
            details["mc"] = mc
        matvecs = 0
        if options.method in ("second-order", "both"):
            second = second_order(backend, options, ctx)
            details["second_order"] = second
            matvecs = second["matvecs"]
        pilot = None
        if options.method == "both":
            pilot = second_order(backend, options, ctx, probes=PILOT_PROBES, stream=_PILOT_STREAM,
                                 desc="adaptive-sharpness (route pilot)")
            details["route_pilot"] = pilot
            matvecs += pilot["matvecs"]
        head, details["route"], details["route_reason"] = headline(mc, second, options.rho, pilot)
        # "budget" when --budget ended either part early; else how the headline part ended
        details["stop_reason"] = ("budget" if any(p is not None and p["stop_reason"] == "budget" for p in (mc, second))
                                  else head["stop_reason"])
        notes = [f"loss {problem.loss.name}, ρ = {options.rho:g}"]
        if mc is not None:
            notes.append(f"MC {mc['value']:.4g} ± {mc['stderr']:.2g} ({mc['draws']} ± pairs)")
        if second is not None:
            notes.append(f"second order {second['value']:.4g} ± {second['stderr']:.2g} ({second['probes']} probes)")
        if mc is not None and second is not None:  # else the method named the route
            notes.append(f"headline: {details['route']}")
        return ProbeResult(
            probe=self.name,
            value=head["value"],
            stderr=head["stderr"],
            # the stderr is a sample standard deviation over the ± pairs (or probes): t intervals
            dof=(head["draws"] if head is mc else head["probes"]) - 1,
            matvecs=matvecs,
            seconds=time.perf_counter() - start,
            seed=ctx.seed,
            label="adaptive sharpness S_ρ",
            notes="; ".join(notes),
            details=details,
        )


def headline(mc: dict | None, second: dict | None, rho: float, pilot: dict | None = None) -> tuple[dict, str, str]:
    """(headline part, route, why): with both parts, the Monte Carlo one where the pilot (a
    second-order estimate sharing no randomness with either part) puts |S_ρ| at ROUNDING_MARGIN
    or more of the Monte Carlo's rounding floor, and that part is finite."""
    if second is None:
        return mc, "monte-carlo", "method mc"
    if mc is None:
        return second, "second-order", "method second-order"
    if not (math.isfinite(mc["value"]) and mc["stderr"] is not None and math.isfinite(mc["stderr"])):
        return second, "second-order", "the Monte Carlo value or its standard error is not finite"
    if pilot is None or not math.isfinite(pilot["value"]):
        return second, "second-order", "no finite pilot estimate of S_ρ's size to decide the route by"
    floor, size = mc.get("rounding_floor", 0.0), abs(pilot["value"])
    if size >= ROUNDING_MARGIN * floor:
        return mc, "monte-carlo", (f"a pilot of {pilot['probes']} second-order probes puts |S_ρ| at {size:.3g}, at least "
                                   f"{ROUNDING_MARGIN:g}× the loss's rounding floor {floor:.2g} at ρ = {rho:g}, which the "
                                   "Monte Carlo pairs share (the pilot shares no draw with either estimate)")
    return second, "second-order", (f"a pilot of {pilot['probes']} second-order probes puts |S_ρ| at {size:.3g}, below "
                                    f"{ROUNDING_MARGIN:g}× the loss's rounding floor {floor:.2g} at ρ = {rho:g}: the Monte "
                                    "Carlo pairs share that rounding of L(w), a bias their standard error does not show")


@contextlib.contextmanager
def restored(params: list[Tensor]) -> Iterator[list[Tensor]]:
    """Yield copies of `params`; on exit, however it comes, copy them back bit for bit."""
    saved = [p.detach().clone() for p in params]
    try:
        yield saved
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


def monte_carlo(backend: Backend, rho: float, draws: int, generator: torch.Generator, progress=None,
                should_stop=None) -> dict:
    """Mean and standard error of the antithetic pairs; `should_stop` (a budget) ends it after
    any pair from the second on, with the pairs drawn so far (stop_reason "budget")."""
    problem = backend.problem
    params = problem.layout.params(problem.model)
    base = sample_loss(backend)
    values = []
    stop = "draws"
    with restored(params) as saved:
        for i in range(draws):
            # z drawn on the CPU so a seed gives the same δ on every device (the product with
            # ρ|w| is one correctly rounded multiply wherever it runs); in float32, four times
            # cheaper to draw than float64, which made the CPU most of a GPU run's time
            deltas = [rho * s.abs() * torch.randn(s.shape, generator=generator, dtype=torch.float32)
                      .to(dtype=s.dtype, device=s.device) for s in saved]
            pair = []
            for sign in (1.0, -1.0):
                with torch.no_grad():
                    for p, s, d in zip(params, saved, deltas):
                        p.copy_(s + sign * d)
                pair.append(sample_loss(backend))
            values.append(0.5 * (pair[0] + pair[1]) - base)
            if progress is not None:
                mean, se = _mean_se(values)
                progress(i + 1, draws, value=mean, stderr=se)
            if should_stop is not None and len(values) >= 2 and i + 1 < draws and should_stop():
                stop = "budget"
                break
    value, stderr = _mean_se(values)
    return {
        "value": value,
        "stderr": stderr,
        "draws": len(values),
        "loss_evaluations": 2 * len(values) + 1,
        "base_loss": base,
        # one unit of rounding of L in the model's dtype: every pair shares L(w)'s rounding, so
        # below this the pairs' mean is biased by it, whatever their standard error says
        "rounding_floor": torch.finfo(params[0].dtype).eps * abs(base) if params else 0.0,
        "stop_reason": stop,
    }


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    v = torch.tensor(values, dtype=torch.float64)
    return v.mean().item(), (v.std(unbiased=True).item() / math.sqrt(len(values)) if len(values) > 1 else None)


_SECOND_ORDER_STREAM = 0x9E3779B9
_PILOT_STREAM = 0x7F4A7C15


class _ScaledOperator:
    """diag|w| · M · diag|w| for a curvature operator M. Its quadratic form is M's at |w| ⊙ v,
    which the autograd backend takes by forward tangents (no Hessian-vector product)."""

    def __init__(self, op: CurvatureOperator, scale: Tensor):
        self.op, self.scale = op, scale
        self.dim, self.dtype, self.device = op.dim, op.dtype, op.device
        self.streams_total = op.takes_vhv

    def matmat(self, V: Tensor) -> Tensor:
        return self.op.matmat(V * self.scale) * self.scale

    def quadratic(self, S: Tensor, split=None) -> tuple[Tensor, dict]:
        return self.op.quadratic(S, None, scale=self.scale)


def second_order(backend: Backend, options: AdaptiveSharpnessOptions, ctx: ProbeContext, *,
                 probes: int | None = None, stream: int = _SECOND_ORDER_STREAM,
                 desc: str = "adaptive-sharpness (second order)") -> dict:
    """(ρ²/2)·Tr(diag|w| H diag|w|) by Hutchinson with `probes` (default: --probes-max) on the
    stream `stream` (the second-order estimate's own, or the route pilot's)."""
    problem = backend.problem
    op = CurvatureOperator(backend, "hessian")
    scale = torch.cat([p.detach().abs().reshape(-1) for p in problem.layout.params(problem.model)])

    # its own stream: independent of the Monte Carlo noise, and the same whichever method runs
    generator = torch.Generator().manual_seed(ctx.seed + stream)
    factor = options.rho**2 / 2
    est = hutchinson(_ScaledOperator(op, scale), generator=generator, max_probes=probes or options.probes_max,
                     block_size=options.block_size, progress=progress_reporter(ctx, desc, scale=factor),
                     should_stop=budget_stop(ctx), time_left=time_left(ctx))
    told_if_budget(ctx, desc, est.stop_reason)
    return {
        "value": factor * est.value,
        "stderr": factor * est.stderr,
        "scaled_trace": est.value,  # Tr(diag|w| H diag|w|)
        "scaled_trace_stderr": est.stderr,
        "probes": est.probes,
        "matvecs": op.matvecs,
        "stop_reason": est.stop_reason,
    }
