"""Invariance check: run probes, apply a function-preserving rescaling, check that the
predictions did not change, run the probes again, and say which numbers moved."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from rich.console import Console
from rich.table import Table

from ..api import ProgressFn, open_session, run
from ..config import RunConfig
from ..errors import ConfigError
from ..report.render import fmt, fmt_estimate, header
from ..report.result import ProbeResult, Report
from .rescale import Rescaling, apply_rescaling, candidate_rescalings, trial

Z = 4.0  # a stochastic value "moved" when the change exceeds Z combined standard errors
EXACT_RTOL_ULPS = 1e3  # exact values: relative change beyond 1e3 ulps of the working dtype


@dataclass(frozen=True)
class Comparison:
    probe: str
    label: str
    before: ProbeResult
    after: ProbeResult
    predicted: float | None  # what the math says the rescaled value must be, where known
    moved: bool
    # the predicted value's standard error where it is built from sampled parts; None: exact
    predicted_stderr: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.before.value in (None, 0) or self.after.value is None:
            return None
        return self.after.value / self.before.value


@dataclass(frozen=True)
class InvarianceReport:
    rescaling: Rescaling
    max_logit_change: float  # max |Δ logit| / max |logit|
    logit_tolerance: float
    argmax_agreement: float
    original: Report
    rescaled: Report
    comparisons: list[Comparison]

    @property
    def function_preserved(self) -> bool:
        return self.max_logit_change <= self.logit_tolerance

    exit_code: ClassVar[int] = 0  # a report, not a verdict (cli.CommandResult)

    def to_dict(self) -> dict[str, Any]:
        out = self.original.to_dict()
        out.pop("results")
        out["rescaling"] = {"kind": self.rescaling.kind, "up": self.rescaling.up, "down": self.rescaling.down,
                            "alpha": self.rescaling.alpha}
        out["predictions"] = {"max_relative_logit_change": self.max_logit_change,
                              "tolerance": self.logit_tolerance, "argmax_agreement": self.argmax_agreement,
                              "function_preserved": self.function_preserved}
        out["comparison"] = [{"probe": c.probe, "label": c.label, "original": c.before.value,
                              "original_stderr": c.before.stderr, "rescaled": c.after.value,
                              "rescaled_stderr": c.after.stderr, "ratio": c.ratio, "predicted": c.predicted,
                              "predicted_stderr": c.predicted_stderr,
                              # null: the rescaling changed the predictions, so "not moved" would
                              # claim an invariance it did not test
                              "moved": c.moved if self.function_preserved else None} for c in self.comparisons]
        out["original"] = self.original.to_dict()["results"]
        out["rescaled"] = self.rescaled.to_dict()["results"]
        return out

    def render(self, console: Console) -> None:
        preserved = self.function_preserved
        # when the predictions changed, "same" would read as "invariant" for a rescaling that was
        # not one: the column then says nothing either way
        caption = None if preserved else ("moved?: n/a — the predictions changed, so this rescaling says nothing "
                                          "about which quantities are invariant")
        # a line of its own: a table's title wraps at the table's width, not the console's
        console.print(header(self.original) + f" · rescaling: {self.rescaling.describe()}", style="italic",
                      highlight=False)
        table = Table(caption=caption, caption_justify="left")
        for col in ("probe", "quantity", "original", "rescaled", "ratio", "predicted", "moved?"):
            table.add_column(col, justify="left" if col in ("probe", "quantity") else "right", overflow="fold")
        for c in self.comparisons:
            moved = "n/a" if not preserved else "[bold red]moved[/]" if c.moved else "same"
            table.add_row(c.probe, c.label, fmt_estimate(c.before.value, c.before.stderr),
                          fmt_estimate(c.after.value, c.after.stderr), fmt(c.ratio), fmt_estimate(c.predicted, c.predicted_stderr), moved)
        console.print(table)
        verdict = "unchanged" if self.function_preserved else "CHANGED — not a function-preserving rescaling"
        console.print(f"  predictions: {verdict} (max |Δlogit|/max|logit| = {self.max_logit_change:.2e}, "
                      f"tolerance {self.logit_tolerance:.1e}; argmax agreement {self.argmax_agreement:.4f})",
                      markup=False, highlight=False)


def _logits(backend) -> torch.Tensor:
    return torch.cat([logits.detach().to(torch.float64).cpu() for logits, _, _ in backend.outputs()])


def _predicted_trace(result: ProbeResult, r: Rescaling) -> tuple[float | None, float | None]:
    """The predicted rescaled trace and its standard error (None: exact parts, or no prediction).

    θ' = Dθ gives H' = D⁻¹HD⁻¹ (and G' likewise): each rescaled parameter's diagonal block
    scales by 1/α² (scaled up) or α² (scaled down); the others keep theirs. A sampled trace's
    parts are noisy, and the one scaled by α² carries α² times its error (α = 10: a Hutchinson
    part of 30.7 ± 3.6 made a prediction of 3088 whose ±360 was not shown). The parts share
    their probes, so their covariance is unknown: the stderr is the smaller of two bounds that
    hold whatever it is (sd(Σ X_i) ≤ Σ sd(X_i)), Σ|f_i|·se_i and se_total + Σ|f_i − 1|·se_i.
    A sampled trace whose rescaled parts carry no stderr gives no prediction."""
    parts = result.details.get("per_parameter")
    if result.probe != "trace" or not parts:
        return None, None
    factors = {f"{r.up}.weight": r.alpha**-2, f"{r.up}.bias": r.alpha**-2}
    if r.kind == "relu-pair":
        factors[f"{r.down}.weight"] = r.alpha**2  # its bias is not rescaled
    value = sum(part["value"] * factors.get(name, 1.0) for name, part in parts.items())
    if result.stderr is None:
        return value, None
    se = {name: part.get("stderr") for name, part in parts.items()}
    bounds = []
    if all(x is not None for x in se.values()):
        bounds.append(sum(abs(factors.get(name, 1.0)) * x for name, x in se.items()))
    if all(se[name] is not None for name in factors if name in se):
        bounds.append(result.stderr + sum(abs(f - 1.0) * se[name] for name, f in factors.items() if name in se))
    if not bounds:
        return None, None
    return value, min(bounds)


def _moved(before: ProbeResult, after: ProbeResult, eps: float) -> bool:
    if before.value is None or after.value is None:
        return False
    diff = abs(after.value - before.value)
    if before.stderr is not None or after.stderr is not None:
        return diff > Z * math.hypot(before.stderr or 0.0, after.stderr or 0.0)
    return diff > EXACT_RTOL_ULPS * eps * max(abs(before.value), abs(after.value))


def _relative_change(before: torch.Tensor, after: torch.Tensor) -> float:
    return ((after - before).abs().max() / before.abs().max().clamp_min(1e-300)).item()


def _function_preserving(session, candidates: list[Rescaling], before: torch.Tensor, tolerance: float,
                         layer: str | None) -> Rescaling:
    """The first candidate that leaves the outputs as they were (to `tolerance`), tried on the
    model and undone bit for bit; exit 2 when none does."""
    tried = []
    for r in candidates:
        with trial(session.model, r):
            change = _relative_change(before, _logits(session.backend))
        if change <= tolerance:
            return r
        tried.append(f"{r.up} ×{r.alpha:g} / {r.down} (outputs moved by {change:.1e})")
    where = f"--layer {layer}" if layer else "this model"
    raise ConfigError(f"{where}: no rescaling the modules suggest preserves the model's outputs (tolerance "
                      f"{tolerance:.1e}): tried {'; '.join(tried)}"
                      + ("" if layer else "; name a Linear/Conv followed by ReLU and another Linear/Conv with --layer"))


def check_invariance(config: RunConfig, alpha: float, layer: str | None = None,
                     progress: ProgressFn | None = None) -> InvarianceReport:
    session = open_session(config)
    eps = torch.finfo(config.torch_dtype).eps
    before = _logits(session.backend)
    rescaling = _function_preserving(session, candidate_rescalings(session.model, alpha, layer), before,
                                     EXACT_RTOL_ULPS * eps, layer)
    original = run(config, progress, session=session)

    # the same backend: its kept graphs see the rescaled weights' new versions and are rebuilt
    apply_rescaling(session.model, rescaling)
    after = _logits(session.backend)
    rescaled = run(config, progress, session=session)

    change = _relative_change(before, after)
    comparisons = []
    for name in original.results:
        predicted, predicted_stderr = _predicted_trace(original.results[name], rescaling)
        comparisons.append(Comparison(name, original.results[name].label, original.results[name],
                                      rescaled.results[name], predicted,
                                      _moved(original.results[name], rescaled.results[name], eps), predicted_stderr))
    return InvarianceReport(
        rescaling=rescaling,
        max_logit_change=change,
        logit_tolerance=EXACT_RTOL_ULPS * eps,
        argmax_agreement=(after.argmax(1) == before.argmax(1)).double().mean().item(),
        original=original,
        rescaled=rescaled,
        comparisons=comparisons,
    )
