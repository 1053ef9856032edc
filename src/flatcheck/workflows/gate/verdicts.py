"""One rule decided on one run (and a baseline): pass, fail, inconclusive or skipped.

An exact value is compared directly. A value with standard error s has the interval v ± q·s
(q: Student's t where the probe says how many draws made s, else normal), widened by any hard
error bound the value states; the rule fails when the whole interval lies beyond the
threshold, passes when it lies inside, and is inconclusive when it straddles it. Baseline
rules compare paired (same probe vectors: statistics.pairing) or unpaired (Welch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import InputError
from ...probes.gating import gating_of
from ...report.result import ProbeResult
from ..results_io import FieldMissing, as_number, keys_near, resolve_field
from .config import Bound, GateConfig
from .statistics import Pairing, distinct, dof as dof_of, error_bound, pairing, quantile, slope as slope_of, welch


@dataclass
class Check:
    bound: Bound
    verdict: str = "inconclusive"  # pass | fail | inconclusive | skipped
    value: float | None = None
    stderr: float | None = None  # of the comparison (baseline's included, scaled by a relative rule's margin)
    value_stderr: float | None = None  # of the value itself, as its probe reported it
    ci: tuple[float, float] | None = None  # the verdict's interval: value ± q·stderr (a relative rule: T + (v − T) ± q·stderr)
    threshold: float | None = None
    baseline: float | None = None
    message: str = ""
    reruns: int = 0
    paired: int | None = None  # probes the comparison was paired over, None when unpaired
    capped: bool = False  # paired over every probe value the baseline holds: a rerun adds no pair

    @property
    def failed(self) -> bool:
        """Counts against the gate: a failure, or an inconclusive result whose policy is not pass."""
        return self.verdict == "fail" or (self.verdict == "inconclusive" and self.bound.inconclusive != "pass")

    def to_dict(self) -> dict[str, Any]:
        b = self.bound
        return {"rule": b.name, "field": b.field, "kind": b.kind, "limit": b.limit, "threshold": _num(self.threshold),
                "value": _num(self.value), "value_stderr": _num(self.value_stderr), "stderr": _num(self.stderr),
                "ci": None if self.ci is None else [_num(self.ci[0]), _num(self.ci[1])],
                # what `ci` bounds: under a relative rule its error is the comparison's, not the value's
                "ci_of": "threshold + (value - threshold)" if b.relative else "value",
                "baseline": _num(self.baseline), "verdict": self.verdict, "failed": self.failed,
                "inconclusive_policy": b.inconclusive, "reruns": self.reruns, "paired": self.paired,
                "message": self.message}


def _num(x):
    # JSON has no NaN: a non-finite number is written as null (the verdict says why)
    return None if x is None or not math.isfinite(x) else float(x)


def unresolved(result: Mapping[str, Any], probe: str | None = None) -> str | None:
    """Why a result's value is not one its probe stands behind (an iteration stopped short of
    its own stopping rule, a budget-cut mean), or None; the probe's declaration decides.
    `probe`: the key the result is filed under (default: its own `probe` field)."""
    name = probe or result.get("probe")
    return gating_of(name if isinstance(name, str) else "").unresolved(name or "the probe", result)


def evaluate(gate: GateConfig, results: Mapping[str, Any], baseline: Mapping[str, Any] | None = None,
             confidence: float | None = None, *, no_baseline: bool = False) -> list[Check]:
    """Decide every bound. `results`/`baseline` map probe → ProbeResult or its to_dict().
    no_baseline: relative rules are skipped (a first release), not bad input."""
    level = confidence if confidence is not None else gate.confidence
    current = as_dicts(results)
    base = as_dicts(baseline) if baseline is not None else None
    return [decide(b, current, base, level, no_baseline, where=gate.source) for b in gate.bounds]


def as_dicts(results: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.to_dict() if isinstance(v, ProbeResult) else v) for k, v in results.items()}


def baseline_number(bound: Bound, raw: Any, raw_se: Any, where: str = "--baseline") -> tuple[float, float]:
    """The baseline's value and stderr (0 when exact) as finite numbers, or bad input."""
    b, se = as_number(raw), (0.0 if raw_se is None else as_number(raw_se))
    if b is None or not math.isfinite(b):
        raise InputError(f"{where}: rule {bound.name} needs {bound.field}, which is {raw!r}, "
                         "not a finite number")
    if se is None or not math.isfinite(se) or se < 0:
        raise InputError(f"{where}: the standard error of {bound.field} is {raw_se!r}, "
                         "not a finite non-negative number")
    return b, se


def check_same_route(bound: Bound, results: Mapping[str, Any], baseline: Mapping[str, Any]) -> None:
    """A headline taken by another estimator than the baseline's is not comparable with it
    (the probe declares which of its routes are estimators of their own)."""
    if not bound.headline:
        return
    gating = gating_of(bound.probe)
    now = ((results.get(bound.probe) or {}).get("details") or {}).get("route")
    then = ((baseline.get(bound.probe) or {}).get("details") or {}).get("route")
    if now != then and now in gating.estimator_routes and then in gating.estimator_routes:
        raise InputError(f"rule {bound.name}: the baseline's {bound.probe} headline is its {then} value, this "
                         f"run's its {now} value: not the same estimate (set probes.{bound.probe}."
                         f"{gating.route_option}: {gating.estimator_routes[then]} in the gate file, or remake the "
                         f"baseline)")


def _paired_value_stderr(bound: Bound, results: Mapping[str, Any], paired: Pairing, se: float) -> float:
    """The standard error of the paired value as its probe states one: the result's own where the
    pairing spans all its draws, else the probe's rule applied to the draws it spans. Not their
    bare spread: a probe may widen it (for the values' skewness), and the table shows this one."""
    details = (results.get(bound.probe) or {}).get("details") or {}
    values = details.get("probe_values")
    if isinstance(values, list) and paired.n == len(values):
        return se
    return gating_of(bound.probe).values_stderr(details, paired.current)


def decide(bound: Bound, results: dict[str, Any], baseline: dict[str, Any] | None, confidence: float,
           no_baseline: bool = False, where: str = "") -> Check:
    """`where`: the gate file, named when a rule's field is not in the result (a misspelt key)."""
    check = Check(bound)
    at = f"{where + ': ' if where else ''}rule {bound.name}"
    try:
        raw, raw_se = resolve_field(results, bound.field)
    except FieldMissing:
        raise InputError(f"{at}: field '{bound.field}' is not in the {bound.probe} result "
                         f"({keys_near(results, bound.field)})") from None
    value, se = as_number(raw), as_number(raw_se) or 0.0
    if value is None:
        raise InputError(f"{at}: field '{bound.field}' is {raw!r}, not a number")
    result = results.get(bound.probe) or {}
    why = unresolved(result, bound.probe)
    if why:
        raise InputError(f"rule {bound.name}: {why}; no verdict on an unfinished value")
    refused = gating_of(bound.probe).admits(bound.probe, result, bound.path, se, error_bound(results, bound))
    if refused:
        raise InputError(f"{at}: {refused}")
    check.value = value
    check.value_stderr = se if se > 0 else None
    dof = dof_of(results, bound)
    if bound.relative:
        if baseline is None and no_baseline:
            check.verdict, check.message = "skipped", "no baseline (--no-baseline)"
            return check
        if baseline is None:
            raise InputError(f"rule {bound.name} compares with a baseline; pass --baseline REPORT.json")
        try:
            b_raw, b_se_raw = resolve_field(baseline, bound.field)
        except FieldMissing:
            if bound.probe in baseline:
                raise InputError(f"rule {bound.name}: field '{bound.field}' is not in the baseline's {bound.probe} "
                                 "result, which the current run has: a misspelt field?") from None
            check.verdict, check.message = "skipped", f"baseline has no {bound.probe} result"
            return check
        b, base_se = baseline_number(bound, b_raw, b_se_raw)
        check_same_route(bound, results, baseline)
        paired, why = pairing(bound, results, baseline)
        if paired is not None:
            b = paired.baseline_value()
            value = check.value = paired.current_value()
            own = _paired_value_stderr(bound, results, paired, se)
            check.value_stderr = own if own > 0 else None
        slope = slope_of(bound, b)
        threshold = slope * b
        check.baseline = b
        if paired is not None:
            details = (results.get(bound.probe) or {}).get("details") or {}
            sigma, interval = gating_of(bound.probe).paired_stderr(details, paired.differences(slope))
            # the interval of v given the threshold: T + (v − T) ± q·σ
            value, dof = threshold + paired.excess(slope), paired.n - 1
            check.paired = paired.n
            check.capped = paired.n >= paired.baseline_count
            check.message = f"paired over {paired.n} probes, interval {interval} of the differences"
        else:
            sigma = math.sqrt(se**2 + (slope * base_se) ** 2)
            dof = welch(se, dof, slope * base_se, dof_of(baseline, bound))
            check.message = why if sigma > 0 and bound.headline else ""
    else:
        threshold, sigma = bound.limit, se
    # a value good to ±h (an iteration's tolerance) widens the interval by h, the baseline's
    # scaled with the threshold it sets
    hard = error_bound(results, bound) + (abs(slope_of(bound, check.baseline)) * error_bound(baseline, bound)
                                          if bound.relative and baseline is not None else 0.0)
    check.threshold = threshold
    if not math.isfinite(value):
        check.verdict, check.message = "fail", f"value is {value}"
        return check
    if sigma > 0 or hard > 0:
        half = (quantile(confidence, dof) * sigma if sigma > 0 else 0.0) + hard
        check.stderr = sigma if sigma > 0 else None
        check.ci = (value - half, value + half)
        lo, hi = check.ci
    else:
        lo = hi = value
    beyond = lo > threshold if bound.upper else hi < threshold
    inside = hi <= threshold if bound.upper else lo >= threshold
    check.verdict = "fail" if beyond else "pass" if inside else "inconclusive"
    side = "≤" if bound.upper else "≥"
    shown_value, shown_threshold = distinct(value, threshold)
    if check.verdict == "inconclusive":
        said = f"interval straddles {shown_threshold}; policy {bound.inconclusive}"
    elif check.verdict == "fail":
        said = f"{shown_value} needs {side} {shown_threshold}"
    else:
        said = ""
    bounded = f"the interval counts the stated error bound ±{hard:.3g}" if hard > 0 else ""
    check.message = "; ".join(m for m in (said, check.message, bounded) if m)
    return check
