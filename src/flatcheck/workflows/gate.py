"""CI gates: rules on probe results, decided with the estimate's own uncertainty.

A rule bounds a field of a probe's result (a dotted path, e.g. `trace.value`,
`gini.details.accuracy`) from above (`max`), from below (`min`), or relative to the same
field of a baseline report (`max_increase`, `max_decrease`).

Decision. An exact value (stderr None) is compared directly. A stochastic value v with
standard error s has the interval v ± q·s: q is Student's t quantile where the result says
how many draws its stderr came from (`dof`), else the normal one. The rule fails only when
the whole interval lies beyond the threshold, passes when the whole interval lies inside it,
and is inconclusive when the interval straddles it. An inconclusive rule then follows its
`inconclusive` policy: `pass`, `fail`, or `rerun` — rerun the probe with its effort option
(the probe class's `effort_option`, e.g. trace's probes_max) multiplied by `effort_factor`,
up to `max_reruns` times; still inconclusive after that counts as failed.

Baseline rules. With baseline value b and fraction x the threshold is T = slope·b with
slope = 1 ± x·sign(b) (b + x·|b| for max_increase, b − x·|b| for max_decrease, so that "20%
more" means the same thing for negative values); the test is on v − T.
- Paired, when both runs drew the same probe vectors (same seed and estimator, the per-probe
  values stored in both reports; see `pairing`): with per-probe values c_i and b_i and the
  parts known without sampling error o_c, o_b, v − T = (o_c − slope·o_b) + mean_i(c_i − slope·b_i),
  and its standard error is that of the per-probe differences, t with n − 1 degrees of
  freedom. The probe-to-probe spread that both runs share cancels: an unchanged model
  gives c_i = b_i, so v − T = −x·|b| with error x·s_b, and the rule passes.
- Unpaired otherwise: σ = √(s² + slope²·s_b²) (the baseline's uncertainty moves the
  threshold), degrees of freedom by Welch–Satterthwaite.
A baseline is checked before any probe runs (`check_baseline`): it must hold results, every
value a rule reads must be a finite number, it must come from the same model and data
(unless allowed), and its own error must leave the rule decidable at all.
A rule on a probe the baseline does not hold (a probe added since) is skipped, not failed; a
field the baseline's result of that probe lacks is a misspelt rule (exit 2, before any probe
runs). A value its probe does not stand behind (an iteration short of its own tolerance,
`unresolved`) gets no verdict: exit 2, in the baseline or in the current run.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from scipy.stats import norm, t as student_t

from ..errors import ConfigError, InputError
from ..linalg.random import SIGN_STREAM
from ..probes.registry import get_probe_class, list_probes, parse_options
from ..report.result import ProbeResult
from .results_io import FieldMissing, as_number, field_sibling, keys_near, resolve_field

POLICIES = ("fail", "pass", "rerun")
BOUNDS = ("max", "min", "max_increase", "max_decrease")
_TOP = ("confidence", "inconclusive", "max_reruns", "effort_factor", "probes", "rules")
_RULE = ("field", "name", "inconclusive", *BOUNDS)


@dataclass(frozen=True)
class Bound:
    name: str  # shown in tables and as the JUnit testcase name
    field: str  # dotted path, first part the probe
    kind: str  # one of BOUNDS
    limit: float  # the absolute threshold, or the fraction for baseline rules
    inconclusive: str

    @property
    def probe(self) -> str:
        return self.field.split(".", 1)[0]

    @property
    def upper(self) -> bool:
        return self.kind in ("max", "max_increase")

    @property
    def relative(self) -> bool:
        return self.kind in ("max_increase", "max_decrease")


@dataclass(frozen=True)
class GateConfig:
    bounds: tuple[Bound, ...]
    probes: dict[str, dict[str, Any]]  # probe → raw options, validated by the probe's Options
    confidence: float = 0.95
    max_reruns: int = 3
    effort_factor: float = 2.0
    source: str = "gates"
    # "probe.option" values the gate chose itself (not the file), which a paired baseline's may replace
    defaulted: frozenset[str] = frozenset()

    @property
    def needs_baseline(self) -> bool:
        return any(b.relative for b in self.bounds)


@dataclass
class Check:
    bound: Bound
    verdict: str = "inconclusive"  # pass | fail | inconclusive | skipped
    value: float | None = None
    stderr: float | None = None  # of the comparison (baseline's included)
    ci: tuple[float, float] | None = None
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
                "value": _num(self.value), "stderr": _num(self.stderr),
                "ci": None if self.ci is None else [_num(self.ci[0]), _num(self.ci[1])],
                "baseline": _num(self.baseline), "verdict": self.verdict, "failed": self.failed,
                "inconclusive_policy": b.inconclusive, "reruns": self.reruns, "paired": self.paired,
                "message": self.message}


def _num(x):
    # JSON has no NaN: a non-finite number is written as null (the verdict says why)
    return None if x is None or not math.isfinite(x) else float(x)


# ---------------------------------------------------------------- configuration


def load_gate_config(path: str | Path) -> GateConfig:
    from ..models.yamlfile import load_yaml

    data = load_yaml(Path(path), f"--config {path}", error=ConfigError)
    return parse_gate_config(data, where=str(path))


PART_FIELDS = ("trace.details.layers", "trace.details.per_parameter")


def parse_gate_config(data: Any, where: str = "gates") -> GateConfig:
    def fail(field_: str, msg: str) -> ConfigError:
        return ConfigError(f"{where}: field '{field_}' {msg}")

    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: top level must be a mapping with 'rules' (and optionally 'probes')")
    for key in data:
        if key not in _TOP:
            raise fail(key, f"is unknown; allowed: {', '.join(_TOP)}")
    confidence = _number(data.get("confidence", 0.95), "confidence", fail)
    if not 0 < confidence < 1:
        raise fail("confidence", f"must be between 0 and 1 (exclusive), got {confidence}")
    policy = data.get("inconclusive", "fail")
    if policy not in POLICIES:
        raise fail("inconclusive", f"must be one of {', '.join(POLICIES)}, got {policy!r}")
    max_reruns = data.get("max_reruns", 3)
    if isinstance(max_reruns, bool) or not isinstance(max_reruns, int) or max_reruns < 0:
        raise fail("max_reruns", f"must be a non-negative integer, got {max_reruns!r}")
    factor = _number(data.get("effort_factor", 2), "effort_factor", fail)
    if not factor > 1:
        raise fail("effort_factor", f"must be greater than 1, got {factor}")

    probes_raw = data.get("probes") or {}
    if not isinstance(probes_raw, Mapping):
        raise fail("probes", "must map probe names to their options")
    probes: dict[str, dict[str, Any]] = {}
    for name, opts in probes_raw.items():
        opts = opts or {}
        if not isinstance(opts, Mapping):
            raise fail(f"probes.{name}", "must be a mapping of options")
        opts = _fixed_count(str(name), dict(opts))
        try:
            parsed = parse_options(str(name), opts)  # fail now, not after loading the model
        except ConfigError as exc:
            raise fail(f"probes.{name}", f"is invalid: {exc}") from None
        if getattr(parsed, "rtol", None) is not None:
            # a stop on the running error makes the probe count depend on the draws, so two runs
            # of a gate would not draw the same probes and could not be paired
            raise fail(f"probes.{name}.rtol", "is not allowed in a gate: gates take a fixed probe count "
                                              "(raise it, or let `inconclusive: rerun` double it)")
        probes[str(name)] = opts

    rules = data.get("rules")
    if not isinstance(rules, list) or not rules:
        raise fail("rules", "must be a non-empty list of rules")
    bounds: list[Bound] = []
    for i, rule in enumerate(rules):
        at = f"rules[{i}]"
        if not isinstance(rule, Mapping):
            raise fail(at, "must be a mapping with 'field' and a bound")
        for key in rule:
            if key not in _RULE:
                raise fail(f"{at}.{key}", f"is unknown; allowed: {', '.join(_RULE)}")
        fld = rule.get("field")
        if not isinstance(fld, str) or not fld.strip() or fld.startswith("."):
            raise fail(f"{at}.field", f"must be a dotted path like trace.value, got {fld!r}")
        probe = fld.split(".", 1)[0]
        try:
            get_probe_class(probe)
        except ConfigError as exc:
            raise fail(f"{at}.field", f"names no probe {probe!r} (its first part); probes: "
                                      f"{', '.join(list_probes())}") from None
        probes.setdefault(probe, _fixed_count(probe, {}))
        pol = rule.get("inconclusive", policy)
        if pol not in POLICIES:
            raise fail(f"{at}.inconclusive", f"must be one of {', '.join(POLICIES)}, got {pol!r}")
        kinds = [k for k in BOUNDS if k in rule]
        if not kinds:
            raise fail(at, f"needs at least one of {', '.join(BOUNDS)}")
        if "min" in rule and "max" in rule and _number(rule["min"], f"{at}.min", fail) > _number(
                rule["max"], f"{at}.max", fail):
            raise fail(at, f"has min {rule['min']} above max {rule['max']}: no value can pass")
        for kind in kinds:
            if kind in ("max", "min"):
                limit = _number(rule[kind], f"{at}.{kind}", fail)
            else:
                limit = _fraction(rule[kind], f"{at}.{kind}", fail)
            shown = f"{limit:.4g}" if kind in ("max", "min") else f"{100 * limit:g}%"
            label = rule.get("name") or fld
            name = f"{label} {kind} {shown}"
            bounds.append(Bound(name, fld.strip(), kind, limit, pol))
    # A gate reads a trace's per-layer parts only where a rule names them; without them the
    # total is the same number from the same probes, by vᵀHv (forward tangents) at about half
    # an HVP's cost. `parts: true` under probes.trace keeps them in the report.
    defaulted = set()
    if "trace" in probes and "parts" not in probes["trace"] and not any(
            b.field.startswith(PART_FIELDS) for b in bounds):
        probes["trace"]["parts"] = False
        defaulted.add("trace.parts")
    # the total's route (forward tangents or HVPs) follows the baseline's too: a short
    # baseline may have taken HVPs where this gate's count takes tangents (follow_baseline)
    if "trace" in probes and "route" not in probes["trace"]:
        defaulted.add("trace.route")
    # adaptive sharpness picks its headline's estimator from the data (method both); a gate
    # follows the baseline's pick (follow_baseline), so both sides are the same estimate
    if "adaptive-sharpness" in probes and "method" not in probes["adaptive-sharpness"]:
        defaulted.add("adaptive-sharpness.method")
    return GateConfig(tuple(bounds), probes, confidence, max_reruns, factor, where, frozenset(defaulted))


def _number(value: Any, name: str, fail: Callable) -> float:
    if isinstance(value, str):
        # YAML 1.1 (PyYAML) reads 1e9 — no dot — as a string; a threshold written so is still a number
        try:
            value = float(value.strip())
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(name, f"must be a finite number, got {value!r}")
    return float(value)


def _fraction(value: Any, name: str, fail: Callable) -> float:
    """'20%' or 0.2 (a bare number is a fraction)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            x = float(value.strip()[:-1]) / 100
        except ValueError:
            raise fail(name, f"must be a percentage like 20% or a fraction like 0.2, got {value!r}") from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        x = float(value)
    else:
        raise fail(name, f"must be a percentage like 20% or a fraction like 0.2, got {value!r}")
    if not (math.isfinite(x) and x >= 0):
        raise fail(name, f"must be non-negative, got {value!r}")
    return x


# ---------------------------------------------------------------- decisions


def quantile(confidence: float, dof: float | None = None) -> float:
    """Two-sided quantile of a `confidence` interval: Student's t with `dof` degrees of freedom
    (a standard error from few draws), else normal."""
    p = 1 - (1 - confidence) / 2
    return float(norm.ppf(p) if dof is None or not math.isfinite(dof) else student_t.ppf(p, dof))


def evaluate(gate: GateConfig, results: Mapping[str, Any], baseline: Mapping[str, Any] | None = None,
             confidence: float | None = None, *, no_baseline: bool = False) -> list[Check]:
    """Decide every bound. `results`/`baseline` map probe → ProbeResult or its to_dict().
    no_baseline: relative rules are skipped (a first release), not bad input."""
    level = confidence if confidence is not None else gate.confidence
    current = _as_dicts(results)
    base = _as_dicts(baseline) if baseline is not None else None
    return [decide(b, current, base, level, no_baseline, where=gate.source) for b in gate.bounds]


def _as_dicts(results: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.to_dict() if isinstance(v, ProbeResult) else v) for k, v in results.items()}


@dataclass(frozen=True)
class Pairing:
    """Per-probe values of the same probe vectors in two runs (see `pairing`)."""

    current: tuple[float, ...]
    baseline: tuple[float, ...]
    current_offset: float
    baseline_offset: float
    baseline_count: int  # probe values the baseline holds (≥ n)

    @property
    def n(self) -> int:
        return len(self.current)

    def baseline_value(self) -> float:
        return self.baseline_offset + sum(self.baseline) / self.n

    def current_value(self) -> float:
        return self.current_offset + sum(self.current) / self.n

    def excess(self, slope: float) -> tuple[float, float]:
        """v − slope·b and its standard error from the per-probe differences c_i − slope·b_i."""
        d = [c - slope * b for c, b in zip(self.current, self.baseline)]
        mean = sum(d) / self.n
        var = sum((x - mean) ** 2 for x in d) / (self.n - 1)
        return self.current_offset - slope * self.baseline_offset + mean, math.sqrt(var / self.n)


def pairing(bound: Bound, current: Mapping[str, Any], baseline: Mapping[str, Any]) -> tuple[Pairing | None, str]:
    """The paired per-probe values of `bound`'s probe in both reports, or None and why not.

    Pairs only a probe's headline value, and only when both results say which probe vectors
    made it: the same seed and estimator (and matrix), per-probe values stored (schema ≥ 2).
    Hutchinson's i-th vector depends only on the seed (signs are drawn row by row from one
    generator), so runs with different counts pair over their common first n; Hutch++'s
    vectors depend on its count (a sketch of k = count/3 columns), so it pairs only at equal
    counts.
    """
    if not _headline(bound):
        return None, ""
    cur, base = current.get(bound.probe) or {}, baseline.get(bound.probe) or {}
    cd, bd = cur.get("details") or {}, base.get("details") or {}
    if not isinstance(cd.get("probe_values"), list):
        return None, "unpaired: this run kept no per-probe values"
    why = _other_probes(base, cur.get("seed"), cd.get("estimator"), cd.get("matrix"))
    if why:
        return None, f"unpaired: {why}"
    c_vals, b_vals = cd["probe_values"], bd["probe_values"]
    if cd.get("estimator") != "hutchinson" and len(c_vals) != len(b_vals):
        return None, (f"unpaired: {cd.get('estimator')} draws other vectors at another count "
                      f"(baseline {len(b_vals)}, now {len(c_vals)})")
    n = min(len(c_vals), len(b_vals))
    values = [as_number(x) for x in (*c_vals[:n], *b_vals[:n], cd.get("offset", 0.0), bd.get("offset", 0.0))]
    if n < 2 or any(v is None or not math.isfinite(v) for v in values):
        return None, "unpaired: fewer than two finite per-probe values"
    return Pairing(tuple(values[:n]), tuple(values[n:2 * n]), values[-2], values[-1], len(b_vals)), ""


def decide(bound: Bound, results: dict[str, Any], baseline: dict[str, Any] | None, confidence: float,
           no_baseline: bool = False, where: str = "") -> Check:
    """`where`: the gate file, named when a rule's field is not in the result (a misspelt key)."""
    check = Check(bound)
    try:
        raw, raw_se = resolve_field(results, bound.field)
    except FieldMissing:
        raise InputError(f"{where + ': ' if where else ''}rule {bound.name}: field '{bound.field}' is not in the "
                         f"{bound.probe} result ({keys_near(results, bound.field)})") from None
    value, se = as_number(raw), as_number(raw_se) or 0.0
    if value is None:
        raise InputError(f"{where + ': ' if where else ''}rule {bound.name}: field '{bound.field}' is {raw!r}, "
                         "not a number")
    why = unresolved(results.get(bound.probe) or {})
    if why:
        raise InputError(f"rule {bound.name}: {why}; no verdict on an unfinished value")
    check.value = value
    dof = _dof(results, bound)
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
        b, base_se = _baseline_number(bound, b_raw, b_se_raw)
        _check_same_route(bound, results, baseline)
        paired, why = pairing(bound, results, baseline)
        if paired is not None:
            b = paired.baseline_value()
            value = check.value = paired.current_value()
        slope = _slope(bound, b)
        threshold = slope * b
        check.baseline = b
        if paired is not None:
            excess, sigma = paired.excess(slope)
            # the interval of v given the threshold: T + (v − T) ± q·σ
            value, dof = threshold + excess, paired.n - 1
            check.paired = paired.n
            check.capped = paired.n >= paired.baseline_count
            check.message = f"paired over {paired.n} probes"
        else:
            sigma = math.sqrt(se**2 + (slope * base_se) ** 2)
            dof = _welch(se, dof, slope * base_se, _dof(baseline, bound))
            check.message = why if sigma > 0 and _headline(bound) else ""
    else:
        threshold, sigma = bound.limit, se
    # a value good to ±h (an iteration's tolerance) widens the interval by h, the baseline's
    # scaled with the threshold it sets
    hard = error_bound(results, bound) + (abs(_slope(bound, check.baseline)) * error_bound(baseline, bound)
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
    shown_value, shown_threshold = _distinct(value, threshold)
    if check.verdict == "inconclusive":
        said = f"interval straddles {shown_threshold}; policy {bound.inconclusive}"
    elif check.verdict == "fail":
        said = f"{shown_value} needs {side} {shown_threshold}"
    else:
        said = ""
    bounded = f"the interval counts the stated error bound ±{hard:.3g}" if hard > 0 else ""
    check.message = "; ".join(m for m in (said, check.message, bounded) if m)
    return check


def _distinct(a: float, b: float) -> tuple[str, str]:
    """a and b to as many digits as tell them apart (6 at least), so that a verdict never reads
    as a value compared with itself."""
    for digits in (6, 8, 10, 12, 17):
        sa, sb = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if sa != sb:
            break
    return sa, sb


def unresolved(result: Mapping[str, Any]) -> str | None:
    """Why a result's value is not one its probe stands behind, or None. An iteration stopped
    short of its own tolerance (lmax not converged: a Ritz value below λmax by an unknown
    amount) has neither an exact value nor an error bar, so any rule on it could flip. Reports
    from before `resolved` existed say it in lmax's details."""
    d = result.get("details") or {}
    converged = d.get("converged")
    if result.get("resolved") is False and isinstance(d.get("unresolved_reason"), str):
        return f"{result.get('probe', 'the probe')} {d['unresolved_reason']}"
    if result.get("resolved") is False or (
            result.get("probe") == "lmax" and isinstance(converged, list) and not all(converged)
            and not d.get("converged_to_noise")):
        worst = max((r for r in d.get("relative_residuals") or [] if isinstance(r, (int, float))), default=None)
        shown = f" (relative residual {worst:.2g} > tol {d.get('tol')})" if worst is not None else ""
        return (f"{result.get('probe', 'the probe')} did not converge{shown} after {result.get('matvecs')} "
                f"products; raise probes.{result.get('probe')}.max_iter or tol in the gate file")
    return None


def _slope(bound: Bound, b: float) -> float:
    """T = slope·b: 1 + x·sign(b) for max_increase, 1 − x·sign(b) for max_decrease."""
    sign = 1.0 if bound.upper else -1.0
    return 1.0 + sign * bound.limit * (1.0 if b >= 0 else -1.0)


def _baseline_number(bound: Bound, raw: Any, raw_se: Any, where: str = "--baseline") -> tuple[float, float]:
    """The baseline's value and stderr (0 when exact) as finite numbers, or bad input."""
    b, se = as_number(raw), (0.0 if raw_se is None else as_number(raw_se))
    if b is None or not math.isfinite(b):
        raise InputError(f"{where}: rule {bound.name} needs {bound.field}, which is {raw!r}, "
                         "not a finite number")
    if se is None or not math.isfinite(se) or se < 0:
        raise InputError(f"{where}: the standard error of {bound.field} is {raw_se!r}, "
                         "not a finite non-negative number")
    return b, se


# fields whose stderr comes from the same draws as the headline's (a trace's parts)
_SAME_DRAWS = ("trace.details.layers.", "trace.details.per_parameter.")
# probes whose every standard error is a spread over the same few start vectors (SLQ)
_SAME_DRAWS_PROBES = ("spectrum", "rank")


def _headline(bound: Bound) -> bool:
    return bound.field in (bound.probe, f"{bound.probe}.value")


def error_bound(results: Mapping[str, Any], bound: Bound) -> float:
    """A hard bound on the error of the rule's value (0 where the result states none): an
    iterative value is good to its tolerance, not to the last digit — lmax's Ritz value lies
    within its residual ‖Hv − θv‖ of an eigenvalue, so at another seed (another start vector)
    an unchanged model's λmax moves within it. Matrix-free norms state theirs as the sibling
    `<name>_error_bound` (mls's estimate route)."""
    result = results.get(bound.probe) or {}
    details = result.get("details") or {}
    if _headline(bound):
        if bound.probe == "lmax":
            residuals = details.get("residuals")
            found = residuals[0] if isinstance(residuals, list) and residuals else None
        else:
            found = details.get(f"{bound.probe}_error_bound")
    else:
        try:
            found = field_sibling(dict(results), bound.field, "_error_bound")
        except FieldMissing:
            found = None
    value = as_number(found)
    return abs(value) if value is not None and math.isfinite(value) else 0.0


def _dof(results: Mapping[str, Any], bound: Bound) -> float | None:
    """Degrees of freedom of a headline value's stderr (and of a trace's parts, and of any
    field of an SLQ probe: averages over the same draws); None (normal) for other fields."""
    if not (_headline(bound) or bound.field.startswith(_SAME_DRAWS) or bound.probe in _SAME_DRAWS_PROBES):
        return None
    dof = (results.get(bound.probe) or {}).get("dof")
    return float(dof) if isinstance(dof, (int, float)) and not isinstance(dof, bool) and dof >= 1 else None


def _welch(s1: float, dof1: float | None, s2: float, dof2: float | None) -> float | None:
    """Welch–Satterthwaite degrees of freedom of √(s1² + s2²); None (normal) when either side's
    are unknown, inf when both sides are exact."""
    if s1 == 0 and s2 == 0:
        return None
    parts = [(s, d) for s, d in ((s1, dof1), (s2, dof2)) if s > 0]
    if any(d is None for _, d in parts):
        return None
    return (s1**2 + s2**2) ** 2 / sum(s**4 / d for s, d in parts)


# ---------------------------------------------------------------- the baseline, checked up front


@dataclass(frozen=True)
class Baseline:
    """A report an earlier run wrote (`--json`), whose results relative rules compare with."""

    results: dict[str, Any]
    meta: dict[str, Any]
    where: str  # for messages: the file

    @property
    def schema(self) -> str | None:
        return self.meta.get("schema_version")


def load_baseline(path: str | Path) -> Baseline:
    import json

    where = f"--baseline {path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{where}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a folder; give a JSON report") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{where}: not a JSON report ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise ConfigError(f"{where}: not a flatcheck JSON report (no 'results')")
    if not data["results"]:
        raise ConfigError(f"{where}: the report holds no results; make it with the probes the rules name")
    bad = [k for k, v in data["results"].items() if not isinstance(v, dict)]
    if bad:
        raise ConfigError(f"{where}: results.{bad[0]} is not a probe result (a mapping)")
    meta = {k: v for k, v in data.items() if k not in ("results", "gate")}
    _check_schema(meta.get("schema_version"), where)
    return Baseline(data["results"], meta, where)


def _schema_tuple(version: Any) -> tuple[int, int] | None:
    """"2.4" → (2, 4); None for anything that is not MAJOR.MINOR."""
    parts = version.split(".") if isinstance(version, str) else []
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 and all(p.isdigit() for p in parts) else None


def _schema_at_least(version: Any, least: tuple[int, int]) -> bool:
    found = _schema_tuple(version)
    return found is not None and found >= least


def _check_schema(version: Any, where: str) -> None:
    """Every report flatcheck writes says its schema (from the first, 1.0): one without is not
    its report, or an edited one. A newer one, minor included, may mean other things by the
    same keys (2.3 changed rank's stderr, 2.4 what is exact): compared by the flatcheck that
    wrote it, not guessed at."""
    from ..report.result import SCHEMA_VERSION

    if version is None:
        raise ConfigError(f"{where}: no schema_version: not a report flatcheck wrote, or an edited one")
    found = _schema_tuple(version)
    if found is None:
        raise ConfigError(f"{where}: schema_version {version!r} is not MAJOR.MINOR")
    if found > _schema_tuple(SCHEMA_VERSION):
        raise ConfigError(f"{where}: schema_version {version} is newer than this flatcheck's "
                          f"{SCHEMA_VERSION}; compare with the flatcheck that wrote it")


# What makes two reports measure the same quantity: the function (architecture, parameters,
# loss, BatchNorm mode, which parameters are probed) and the samples. The checkpoint's hash is
# not among them: a release gate compares new weights with the last release's report, and a
# changed hash is the point; it is shown, so an unchanged model is recognisable.
IDENTITY = (("model", "source"), ("model", "arch"), ("model", "parameters"), ("model", "probed_parameters"),
            ("model", "num_classes"), ("model", "loss"), ("model", "label_smoothing"), ("model", "params_filter"),
            ("bn_mode",), ("data", "name"), ("data", "split"), ("data", "samples"), ("data", "fingerprint"))
_ABSENT = object()


def _lookup(meta: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = meta
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return _ABSENT
        node = node[key]
    return node


def foreign_fields(baseline_meta: Mapping[str, Any], current_meta: Mapping[str, Any]) -> list[str]:
    """'field: baseline → now' for every identity field in which the two reports differ
    (a field the baseline does not hold counts: it cannot be shown to be the same)."""
    out = []
    for path in IDENTITY:
        b, c = _lookup(baseline_meta, path), _lookup(current_meta, path)
        if b is not c and b != c:
            shown = "absent" if b is _ABSENT else repr(b)
            out.append(f"{'.'.join(path)}: {shown} → {c!r}")
    return out


def check_baseline(gate: GateConfig, baseline: Baseline, current_meta: Mapping[str, Any], *, seed: int,
                   confidence: float | None = None, allow_foreign: bool = False) -> None:
    """Everything about the baseline that would make a verdict indefensible, before any probe
    runs: another model or data set, a value a rule needs that is not a finite number, and an
    error so wide that no run could decide the rule."""
    if not allow_foreign:
        diff = foreign_fields(baseline.meta, current_meta)
        if diff:
            raise InputError(f"{baseline.where}: made on another model or data set ({'; '.join(diff[:3])}"
                             f"{'; …' if len(diff) > 3 else ''}); compare anyway with --allow-foreign-baseline")
    level = confidence if confidence is not None else gate.confidence
    for bound in gate.bounds:
        if not bound.relative:
            continue
        try:
            raw, raw_se = resolve_field(baseline.results, bound.field)
        except FieldMissing:
            if bound.probe not in baseline.results:
                continue  # a probe added since: skipped, and said so
            # the probe is there and the field is not: a misspelt field, caught before any probe runs
            raise InputError(f"{baseline.where}: rule {bound.name}: field '{bound.field}' is not in the baseline's "
                             f"{bound.probe} result ({keys_near(baseline.results, bound.field)})") from None
        b, s_b = _baseline_number(bound, raw, raw_se, baseline.where)
        result = baseline.results.get(bound.probe) or {}
        why = unresolved(result)
        if why:
            raise InputError(f"{baseline.where}: rule {bound.name}: the baseline's {why}")
        _check_same_quantity(bound, result, gate, baseline.where, current_meta)
        if _headline(bound):
            _check_probe_values(bound, result, b, s_b, baseline)
        _check_decidable(bound, b, s_b, baseline, seed, level, gate)
        _check_bounded(bound, b, baseline)


def _planned(gate: GateConfig, probe: str) -> tuple[Any, Any]:
    """(estimator, matrix) of `probe` as this gate will run it (None where it has no such option)."""
    options = parse_options(probe, gate.probes.get(probe, {}))
    return getattr(options, "estimator", None), getattr(options, "resolved_matrix", getattr(options, "matrix", None))


def _check_same_quantity(bound: Bound, result: Mapping[str, Any], gate: GateConfig, where: str,
                         current_meta: Mapping[str, Any] | None = None) -> None:
    """A Tr(G) baseline does not bound a Tr(H), nor an MLS of the softmax one of the logits:
    refuse when the baseline says it measured with another value of an option that defines
    the quantity (`matrix`, and the probe's `quantity_options`) than this gate's run will."""
    details = result.get("details") or {}
    now = _planned(gate, bound.probe)[1]
    then = details.get("matrix")
    if now is not None and then is not None and now != then:
        raise InputError(f"{where}: rule {bound.name}: the baseline's {bound.probe} is of the {then} matrix, "
                         f"this gate's of the {now}: not the same quantity (set probes.{bound.probe}.matrix)")
    try:
        cls = get_probe_class(bound.probe)
    except ConfigError:
        return
    options = parse_options(bound.probe, gate.probes.get(bound.probe, {}))
    for key in getattr(cls, "quantity_options", ()):
        planned, then = getattr(options, key, None), details.get(key)
        if planned is None and key == "loss":  # the model's own loss
            planned = ((current_meta or {}).get("model") or {}).get("loss")
        if planned is not None and then is not None and planned != then:
            raise InputError(f"{where}: rule {bound.name}: the baseline's {bound.probe} was measured with {key} "
                             f"{then!r}, this gate's will be with {planned!r}: not the same quantity (set "
                             f"probes.{bound.probe}.{key}: {then})")


# Routes that are different estimators of a headline (adaptive sharpness: the Monte Carlo mean
# or the second-order form), unlike a trace's routes, which are one estimator's arithmetic.
ESTIMATOR_ROUTES = frozenset({"monte-carlo", "second-order"})
_METHOD_OF_ROUTE = {"monte-carlo": "mc", "second-order": "second-order"}
# a trace total's route in a report → the trace option that takes it again
_TOTAL_ROUTES = {"vhv_tangent": "tangent", "hvp_sums": "hvp", "vhv_fallback": "hvp"}


def _check_same_route(bound: Bound, results: Mapping[str, Any], baseline: Mapping[str, Any]) -> None:
    """A headline taken by another estimator than the baseline's is not comparable with it."""
    if not _headline(bound):
        return
    now = ((results.get(bound.probe) or {}).get("details") or {}).get("route")
    then = ((baseline.get(bound.probe) or {}).get("details") or {}).get("route")
    if now != then and now in ESTIMATOR_ROUTES and then in ESTIMATOR_ROUTES:
        raise InputError(f"rule {bound.name}: the baseline's {bound.probe} headline is its {then} value, this "
                         f"run's its {now} value: not the same estimate (set probes.{bound.probe}.method: "
                         f"{_METHOD_OF_ROUTE[then]} in the gate file, or remake the baseline)")


def _check_probe_values(bound: Bound, result: Mapping[str, Any], b: float, s_b: float, baseline: Baseline) -> None:
    """Per-probe values a comparison would pair on must give the value and stderr the report
    shows (value = offset + mean, stderr = sd/√n): otherwise the verdict would follow numbers
    the report does not show — an edited or corrupted baseline. A sampled trace of schema 2.0
    or later always holds them, and a trace always says its estimator."""
    where = baseline.where
    details = result.get("details") or {}
    values = details.get("probe_values")
    if bound.probe == "trace" and _schema_at_least(baseline.schema, (2, 0)):
        estimator = details.get("estimator")
        if estimator not in ("hutchinson", "hutchpp", "exact") or (estimator != "exact" and values is None):
            raise InputError(f"{where}: the trace result has estimator {estimator!r} and "
                             f"{'no' if values is None else 'its'} per-probe values, which a trace of schema "
                             f"{baseline.schema} always has: another probe's result, or an edited report")
    if values is None:
        return
    nums = [as_number(v) for v in values] if isinstance(values, list) else [None]
    offset = as_number(details.get("offset"))
    if len(nums) < 2 or any(v is None or not math.isfinite(v) for v in nums) or offset is None \
            or not math.isfinite(offset):
        raise InputError(f"{where}: {bound.probe}.details.probe_values/offset are not two or more finite numbers "
                         "and a number: the report was edited or cut")
    n = len(nums)
    mean = sum(nums) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in nums) / (n - 1))
    scale = max(abs(offset), max(abs(v) for v in nums), 1e-300)
    # both sides are sums of the same float64 numbers in another order: agree to round-off
    if abs(offset + mean - b) > 1e-9 * scale or abs(sd / math.sqrt(n) - s_b) > 1e-9 * max(sd, 1e-300):
        raise InputError(f"{where}: {bound.field} is {b:.6g} ± {s_b:.3g}, but its probe_values and offset give "
                         f"{offset + mean:.6g} ± {sd / math.sqrt(n):.3g}: the report was edited or corrupted")


def _check_decidable(bound: Bound, b: float, s_b: float, baseline: Baseline, seed: int, level: float,
                     gate: GateConfig) -> None:
    """Refuse a rule that an unchanged model would not pass reliably, before the run.

    Paired, the per-probe statistic of an unchanged model is (1 − slope)·b_i = ∓x·b_i: v − T is
    x·|b| exactly, with error x·s_b, so it passes when z·x·s_b < x·|b| (a 0 % margin too: an
    unchanged model differs by 0).
    Unpaired, an unchanged model's v − T is x·|b| plus noise of σ = √(s_c² + slope²·s_b²), s_c
    the run's own error (s_b rescaled to the gate's count where the estimator's count is known),
    and it passes when v − T > z·σ: only about half the time if x·|b| is just above z·σ, which a
    gate must not do to an unchanged model. The rule is kept when x·|b| ≥ 2z·σ: the unchanged
    model then passes with probability at least (1 + confidence)/2 (97.5 % at 0.95)."""
    if s_b == 0:
        return
    margin = bound.limit * abs(b)
    dof = _dof(baseline.results, bound)
    unpaired = _planned_unpaired(bound, gate, baseline, seed)
    z = quantile(level, dof)
    if not unpaired:
        if margin == 0 or z * bound.limit * s_b < margin:
            return
        factor, times = bound.limit, 1
    else:
        scale = _planned_precision(bound, gate, baseline)
        factor, times = math.sqrt(scale**2 + _slope(bound, b) ** 2), 2
        if margin > 0 and times * z * factor * s_b <= margin:
            return
    how = f"unpaired ({unpaired})" if unpaired else "paired (same seed and estimator)"
    need_margin = ("twice that, for an unchanged model to pass in 97.5 % of runs rather than about half"
                   if unpaired else "more than that")
    msg = (f"{baseline.where}: rule {bound.name} cannot pass an unchanged model {how}: the baseline's "
           f"{bound.field} = {b:.6g} ± {s_b:.3g} gives an interval of ±{z * factor * s_b:.3g}, and the rule's "
           f"margin {margin:.3g} must be {need_margin}")
    if dof is not None and margin > 0:
        m = int(dof) + 1
        # both runs at the new count: the run's error is then the baseline's (scale 1)
        both = math.sqrt(1 + _slope(bound, b) ** 2) if unpaired else factor
        need = math.ceil(m * (times * z * both * s_b / margin) ** 2) + 1
        # in the unit of the probe's effort option: Hutch++ spends 3 products per residual probe
        result = baseline.results.get(bound.probe) or {}
        per = result.get("matvecs", m) / m if isinstance(result.get("matvecs"), int) and result["matvecs"] else 1
        option = effort_option(bound.probe) or "probes"
        msg += (f"; make the baseline, and run the gate, with {option} ≥ {math.ceil(need * per)} "
                f"(the baseline has {round(m * per)})")
    if unpaired and _headline(bound):
        msg += ", or with this gate file at this seed (flatcheck gate … --no-baseline --json) to compare paired"
    raise InputError(msg)


def _planned_precision(bound: Bound, gate: GateConfig, baseline: Baseline) -> float:
    """The gate run's standard error over the baseline's, from their counts where the estimator
    says how its error falls with them (a trace's headline: Hutchinson as 1/√m; Hutch++ as 1/m
    when it takes fewer products than the baseline, and as 1/√m, conservatively, when more);
    1 otherwise (the run as precise as the baseline)."""
    result = baseline.results.get(bound.probe) or {}
    had = result.get("matvecs")
    if bound.probe != "trace" or not _headline(bound) or not isinstance(had, int) or had <= 0:
        return 1.0
    options = parse_options("trace", gate.probes.get("trace", {}))
    now = getattr(options, "probes_max", None)
    if isinstance(now, int) and getattr(options, "estimator", None) == "hutchpp":
        now = 3 * (now // 3)  # the products Hutch++ takes of it
    estimator = (result.get("details") or {}).get("estimator")
    if not isinstance(now, int) or now <= 0 or estimator not in ("hutchinson", "hutchpp") \
            or getattr(options, "estimator", None) != estimator:
        return 1.0
    ratio = had / now
    return ratio if estimator == "hutchpp" and ratio > 1 else math.sqrt(ratio)


def _check_bounded(bound: Bound, b: float, baseline: Baseline) -> None:
    """Refuse a rule whose margin an iterative value's own error bound fills: an unchanged model
    measured as tightly as the baseline is decided on an interval of ±(1 + slope)·h_b around a
    value x·|b| inside the threshold, so it can pass only if that is less than x·|b|."""
    h = error_bound(baseline.results, bound)
    if h == 0:
        return
    margin = bound.limit * abs(b)
    spread = (1 + abs(_slope(bound, b))) * h
    if spread < margin:
        return
    raise InputError(f"{baseline.where}: rule {bound.name} cannot pass an unchanged model: the baseline's "
                     f"{bound.field} = {b:.6g} is good to ±{h:.3g} (its stated error bound), so the comparison "
                     f"is good to ±{spread:.3g}, not inside the rule's margin {margin:.3g}; widen the rule, or "
                     f"remake the baseline with a smaller probes.{bound.probe}."
                     f"{'tol' if bound.probe == 'lmax' else 'lanczos_tol'} (or --dtype float64)")


def _planned_unpaired(bound: Bound, gate: GateConfig, baseline: Baseline, seed: int) -> str:
    """Why this gate's run of `bound`'s probe will not pair with the baseline ("" when it will),
    from the options it is about to run with; `pairing` decides again on the results."""
    if not _headline(bound):
        return "only a headline value is paired"
    estimator, matrix = _planned(gate, bound.probe)
    base = baseline.results.get(bound.probe) or {}
    why = _other_probes(base, seed, estimator, matrix)
    if why or estimator != "hutchpp":
        return why
    # Hutch++'s vectors depend on its count (a sketch of k = products // 3 columns): it pairs only
    # at equal k, as `pairing` decides on the results' k per-probe values
    values = (base.get("details") or {}).get("probe_values")
    now = getattr(parse_options(bound.probe, gate.probes.get(bound.probe, {})), "probes_max", None)
    if isinstance(values, list) and isinstance(now, int) and len(values) != now // 3:
        return (f"hutchpp draws other vectors at another count (baseline {3 * len(values)} products, "
                f"now {3 * (now // 3)})")
    return ""


def _other_probes(base: Mapping[str, Any], seed: Any, estimator: Any, matrix: Any) -> str:
    """Why a run at `seed` with `estimator` on `matrix` draws other probe vectors than the
    baseline result `base` did, or cannot be matched to them ("" when it draws the same)."""
    details = base.get("details") or {}
    if not isinstance(details.get("probe_values"), list):
        return "the baseline has no per-probe values (schema < 2.0 or not a sampled estimate)"
    for key, now in (("estimator", estimator), ("matrix", matrix)):
        if details.get(key) != now:
            return f"{key} differs (baseline {details.get(key)}, now {now})"
    if base.get("seed") != seed:
        return f"seeds differ (baseline {base.get('seed')}, now {seed})"
    if details.get("sign_stream", 1) != SIGN_STREAM:
        return (f"the baseline's probe vectors come from another flatcheck's random stream (sign stream "
                f"{details.get('sign_stream', 1)}, now {SIGN_STREAM}): the same seed gave other vectors")
    return ""


# ---------------------------------------------------------------- reruns


def _fixed_count(probe: str, opts: dict[str, Any]) -> dict[str, Any]:
    """A gate's probe runs its fixed count, not the probe's default stop on its own running
    error (trace's rtol): two runs are paired only if they draw the same probes."""
    try:
        has_rtol = any(f.name == "rtol" for f in dataclasses.fields(get_probe_class(probe).Options))
    except ConfigError:
        return opts  # an unknown probe: parse_options says so, with the names it knows
    if has_rtol and opts.get("rtol") is None:
        opts["rtol"] = None
    return opts


def effort_option(probe: str) -> str | None:
    """The option that buys a probe more samples, if the probe declares one."""
    return getattr(get_probe_class(probe), "effort_option", None)


def raise_effort(probe: str, options: Any, factor: float) -> Any:
    name = effort_option(probe)
    if name is None:
        return None
    old = getattr(options, name)
    new = type(old)(math.ceil(old * factor)) if isinstance(old, int) else old * factor
    return dataclasses.replace(options, **{name: new})


def decide_with_reruns(gate: GateConfig, results: dict[str, ProbeResult], options: dict[str, Any],
                       rerun: Callable[[dict[str, Any]], dict[str, ProbeResult]],
                       baseline: Mapping[str, Any] | None = None, confidence: float | None = None,
                       no_baseline: bool = False,
                       rerun_baseline: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
                       ) -> tuple[list[Check], dict[str, ProbeResult]]:
    """Evaluate, and while rules with policy rerun are inconclusive, rerun their probes with
    more effort. `rerun({probe: options})` returns the new results of those probes.

    A paired comparison gains from a rerun only if both sides draw the new probes:
    `rerun_baseline({probe: options})` re-measures the baseline's model with the same options
    (None when its checkpoint is not at hand). Without it, pairing extends only over the
    probe values the baseline report holds, and a check paired over all of them is not rerun.
    """
    results, options = dict(results), dict(options)
    baseline = dict(baseline) if baseline is not None else None
    checks = evaluate(gate, results, baseline, confidence, no_baseline=no_baseline)
    reruns: dict[str, int] = {}
    remeasured: set[str] = set()

    def wanted() -> dict[str, Any]:
        probes = {c.bound.probe for c in checks if c.verdict == "inconclusive" and c.bound.inconclusive == "rerun"
                  and not (c.capped and rerun_baseline is None)}
        more = {p: raise_effort(p, options[p], gate.effort_factor) for p in sorted(probes)}
        return {p: o for p, o in more.items() if o is not None}

    for _ in range(gate.max_reruns):
        more = wanted()
        paired = {c.bound.probe for c in checks if c.paired is not None and c.bound.probe in more}
        if paired and rerun_baseline is not None and baseline is not None:
            again = rerun_baseline({p: more[p] for p in sorted(paired)})
            if again is None:  # its checkpoint is not at hand: pairing stays within its values
                rerun_baseline = None
                more = wanted()
            else:
                baseline.update(_as_dicts(again))
                remeasured |= paired
        if not more:
            break
        results.update(rerun(more))
        options.update(more)
        for p in more:
            reruns[p] = reruns.get(p, 0) + 1
        checks = evaluate(gate, results, baseline, confidence, no_baseline=no_baseline)
    for c in checks:
        if c.bound.probe in remeasured and c.paired is not None:
            c.message = f"{c.message}; baseline re-measured from its checkpoint"
    for c in checks:
        c.reruns = reruns.get(c.bound.probe, 0)
        if c.verdict == "inconclusive" and c.bound.inconclusive == "rerun":
            why = ("no effort option" if effort_option(c.bound.probe) is None
                   else "the baseline's last probe value was paired" if c.capped else f"{c.reruns} reruns")
            c.message = f"still inconclusive after {why}; counted as failed; {c.message}"
    return checks, results


@dataclass
class GateOutcome:
    """What `flatcheck gate` prints and writes: the checks and the (final) report."""

    checks: list[Check]
    report: Any  # report.result.Report with the results after reruns
    confidence: float
    source: str = ""
    files: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "inconclusive": 0, "skipped": 0}
        for c in self.checks:
            out[c.verdict] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        # the report's own keys stay at the top, so a gate's JSON can be the next --baseline
        return {**self.report.to_dict(),
                "gate": {"passed": self.passed, "confidence": self.confidence, "config": self.source,
                         "counts": self.counts(), "checks": [c.to_dict() for c in self.checks]}}

    def render(self, console) -> None:
        from ..report.gate_formats import rules_table

        console.print(rules_table(self))


def follow_baseline(config, gate: GateConfig, baseline: Baseline):
    """The run config with the baseline's route where the gate chose its own and the two runs
    draw the same probes (same seed): then an unchanged model reproduces the baseline's
    per-probe values exactly, not only to the round-off between two routes."""
    from ..config import ProbeRequest

    requests = []
    for req in config.probes:
        base = baseline.results.get(req.name) or {}
        parts = (base.get("details") or {}).get("parts")
        if (f"{req.name}.parts" in gate.defaulted and base.get("seed") == config.seed
                and isinstance(parts, bool) and hasattr(req.options, "parts")):
            req = ProbeRequest(req.name, dataclasses.replace(req.options, parts=parts))
        route = (base.get("details") or {}).get("route")
        pinned = _TOTAL_ROUTES.get(route.partition(":")[0]) if isinstance(route, str) else None
        if (f"{req.name}.route" in gate.defaulted and base.get("seed") == config.seed and pinned is not None
                and getattr(req.options, "parts", None) is False and hasattr(req.options, "route")):
            req = ProbeRequest(req.name, dataclasses.replace(req.options, route=pinned))
        if f"{req.name}.method" in gate.defaulted and route in ESTIMATOR_ROUTES and hasattr(req.options, "method"):
            req = ProbeRequest(req.name, dataclasses.replace(req.options, method=_METHOD_OF_ROUTE[route]))
        requests.append(req)
    return dataclasses.replace(config, probes=tuple(requests))


def _baseline_rerun(config, baseline: Baseline, progress) -> Callable[[dict[str, Any]], dict | None]:
    """Re-measure the baseline's model with more probes (for a paired rerun): its checkpoint,
    if the file its report names is still there with the same sha256, under this run's spec,
    data and seed (check_baseline has made sure they describe the same model and samples).
    Opened on first use; None from the callable when the checkpoint is not at hand."""
    from .. import api
    from ..config import ProbeRequest
    from ..models.checkpoint import file_sha256

    state: dict[str, Any] = {}

    def rerun(more: dict[str, Any]) -> dict | None:
        if "session" not in state:
            ck = baseline.meta.get("checkpoint") or {}
            path = Path(ck["path"]) if isinstance(ck, dict) and isinstance(ck.get("path"), str) else None
            same = path is not None and path.is_file() and file_sha256(path) == ck.get("sha256")
            state["config"] = dataclasses.replace(config, checkpoint=path) if same else None
            state["session"] = api.open_session(state["config"]) if same else None
        if state["session"] is None:
            return None
        again = dataclasses.replace(state["config"], probes=tuple(ProbeRequest(p, o) for p, o in more.items()))
        return api.run(again, progress, state["session"]).results

    return rerun


def run_gate(config, gate: GateConfig, *, baseline: Baseline | None = None, confidence: float | None = None,
             progress=None, allow_foreign: bool = False) -> GateOutcome:
    """Run the gate's probes on one model (RunConfig), decide, rerun where asked. Without a
    baseline, relative rules are skipped (the caller asked for that: --no-baseline)."""
    import datetime

    from .. import api
    from ..report.result import Report

    if baseline is not None:
        config = follow_baseline(config, gate, baseline)
    session = api.open_session(config)
    if baseline is not None:
        now = datetime.datetime.now(datetime.timezone.utc)
        check_baseline(gate, baseline, api._meta(session, now, 0.0), seed=config.seed, confidence=confidence,
                       allow_foreign=allow_foreign)
    report = api.run(config, progress, session)
    options = {r.name: r.options for r in config.probes}

    def rerun(more: dict[str, Any]) -> dict[str, ProbeResult]:
        from ..config import ProbeRequest

        again = dataclasses.replace(config, probes=tuple(ProbeRequest(p, o) for p, o in more.items()))
        return api.run(again, progress, session).results

    checks, results = decide_with_reruns(gate, report.results, options, rerun,
                                         None if baseline is None else baseline.results, confidence,
                                         no_baseline=baseline is None,
                                         rerun_baseline=None if baseline is None else
                                         _baseline_rerun(config, baseline, progress))
    final = Report(meta=report.meta, results=results)
    return GateOutcome(checks, final, confidence if confidence is not None else gate.confidence, gate.source)
