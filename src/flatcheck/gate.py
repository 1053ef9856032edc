"""CI gates: rules on probe results, decided with the estimate's own uncertainty.

A rule bounds a field of a probe's result (a dotted path, e.g. `trace.value`,
`gini.details.accuracy`) from above (`max`), from below (`min`), or relative to the same
field of a baseline report (`max_increase`, `max_decrease`).

Decision. An exact value (stderr None) is compared directly. A stochastic value v with
standard error s has the interval v ± q·s, q = Φ⁻¹(1 − (1 − confidence)/2): the rule fails
only when the whole interval lies beyond the threshold, passes when the whole interval lies
inside it, and is inconclusive when the interval straddles it. An inconclusive rule then
follows its `inconclusive` policy: `pass`, `fail`, or `rerun` — rerun the probe with its
effort option (the probe class's `effort_option`, e.g. trace's probes_max) multiplied by
`effort_factor`, up to `max_reruns` times; still inconclusive after that counts as failed.

Baseline rules. With baseline value b (standard error s_b, 0 when exact) and fraction x,
the threshold is T = b + x·|b| for max_increase and T = b − x·|b| for max_decrease (|b| so
that "20% more" means the same thing for negative values). The interval is v ± q·σ with
σ = √(s² + (∂T/∂b)²·s_b²): the uncertainty of the baseline moves the threshold, and
counting it on the value's side decides the same inequality v − T ≶ 0.
A field absent from the baseline (a probe added since) is skipped, not failed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml
from scipy.stats import norm

from .errors import ConfigError, InputError
from .probes.registry import get_probe_class, parse_options
from .report.result import ProbeResult
from .results_io import FieldMissing, as_number, resolve_field

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
                "inconclusive_policy": b.inconclusive, "reruns": self.reruns, "message": self.message}


def _num(x):
    if x is None:
        return None
    return float(x) if math.isfinite(x) else str(x)


# ---------------------------------------------------------------- configuration


def load_gate_config(path: str | Path) -> GateConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
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
        try:
            parse_options(str(name), dict(opts))  # fail now, not after loading the model
        except ConfigError as exc:
            raise fail(f"probes.{name}", f"is invalid: {exc}") from None
        probes[str(name)] = dict(opts)

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
            raise fail(f"{at}.field", f"names no probe: {exc}") from None
        probes.setdefault(probe, {})
        pol = rule.get("inconclusive", policy)
        if pol not in POLICIES:
            raise fail(f"{at}.inconclusive", f"must be one of {', '.join(POLICIES)}, got {pol!r}")
        kinds = [k for k in BOUNDS if k in rule]
        if not kinds:
            raise fail(at, f"needs at least one of {', '.join(BOUNDS)}")
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
    if "trace" in probes and "parts" not in probes["trace"] and not any(
            b.field.startswith(PART_FIELDS) for b in bounds):
        probes["trace"]["parts"] = False
    return GateConfig(tuple(bounds), probes, confidence, max_reruns, factor, where)


def _number(value: Any, name: str, fail: Callable) -> float:
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


def quantile(confidence: float) -> float:
    return float(norm.ppf(1 - (1 - confidence) / 2))


def evaluate(gate: GateConfig, results: Mapping[str, Any], baseline: Mapping[str, Any] | None = None,
             confidence: float | None = None) -> list[Check]:
    """Decide every bound. `results`/`baseline` map probe → ProbeResult or its to_dict()."""
    q = quantile(confidence if confidence is not None else gate.confidence)
    current = _as_dicts(results)
    base = _as_dicts(baseline) if baseline is not None else None
    return [decide(b, current, base, q) for b in gate.bounds]


def _as_dicts(results: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.to_dict() if isinstance(v, ProbeResult) else v) for k, v in results.items()}


def decide(bound: Bound, results: dict[str, Any], baseline: dict[str, Any] | None, q: float) -> Check:
    check = Check(bound)
    try:
        raw, raw_se = resolve_field(results, bound.field)
    except FieldMissing:
        have = ", ".join(sorted(results.get(bound.probe, {}).get("details", {}) or {})) or "none"
        raise InputError(f"rule {bound.name}: field '{bound.field}' is not in the {bound.probe} result "
                         f"(top-level: value, stderr; details: {have})") from None
    value, se = as_number(raw), as_number(raw_se) or 0.0
    if value is None:
        raise InputError(f"rule {bound.name}: field '{bound.field}' is {raw!r}, not a number")
    check.value = value
    threshold, slope, base_se = bound.limit, 0.0, 0.0
    if bound.relative:
        if baseline is None:
            raise InputError(f"rule {bound.name} compares with a baseline; pass --baseline REPORT.json")
        try:
            b_raw, b_se_raw = resolve_field(baseline, bound.field)
        except FieldMissing:
            check.verdict, check.message = "skipped", f"baseline has no {bound.field}"
            return check
        b = as_number(b_raw)
        if b is None or not math.isfinite(b):
            check.verdict, check.message = "skipped", f"baseline {bound.field} is {b_raw!r}"
            return check
        sign = 1.0 if bound.upper else -1.0
        threshold = b + sign * bound.limit * abs(b)
        slope = 1.0 + sign * bound.limit * (1.0 if b >= 0 else -1.0)
        base_se = as_number(b_se_raw) or 0.0
        check.baseline = b
    check.threshold = threshold
    if not math.isfinite(value):
        check.verdict, check.message = "fail", f"value is {value}"
        return check
    sigma = math.sqrt(se**2 + (slope * base_se) ** 2)
    if sigma > 0:
        check.stderr = sigma
        check.ci = (value - q * sigma, value + q * sigma)
        lo, hi = check.ci
    else:
        lo = hi = value
    beyond = lo > threshold if bound.upper else hi < threshold
    inside = hi <= threshold if bound.upper else lo >= threshold
    check.verdict = "fail" if beyond else "pass" if inside else "inconclusive"
    side = "≤" if bound.upper else "≥"
    if check.verdict == "inconclusive":
        check.message = f"interval straddles {threshold:.6g}; policy {bound.inconclusive}"
    elif check.verdict == "fail":
        check.message = f"needs {side} {threshold:.6g}"
    return check


# ---------------------------------------------------------------- reruns


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
                       ) -> tuple[list[Check], dict[str, ProbeResult]]:
    """Evaluate, and while rules with policy rerun are inconclusive, rerun their probes with
    more effort. `rerun({probe: options})` returns the new results of those probes."""
    results, options = dict(results), dict(options)
    checks = evaluate(gate, results, baseline, confidence)
    reruns: dict[str, int] = {}
    for _ in range(gate.max_reruns):
        wanted = {c.bound.probe for c in checks if c.verdict == "inconclusive" and c.bound.inconclusive == "rerun"}
        more = {p: raise_effort(p, options[p], gate.effort_factor) for p in sorted(wanted)}
        more = {p: o for p, o in more.items() if o is not None}
        if not more:
            break
        results.update(rerun(more))
        options.update(more)
        for p in more:
            reruns[p] = reruns.get(p, 0) + 1
        checks = evaluate(gate, results, baseline, confidence)
    for c in checks:
        c.reruns = reruns.get(c.bound.probe, 0)
        if c.verdict == "inconclusive" and c.bound.inconclusive == "rerun":
            why = "no effort option" if effort_option(c.bound.probe) is None else f"{c.reruns} reruns"
            c.message = f"still inconclusive after {why}; counted as failed"
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
        from .report.gate_formats import rules_table

        console.print(rules_table(self))


def run_gate(config, gate: GateConfig, *, baseline: Mapping[str, Any] | None = None,
             confidence: float | None = None, progress=None) -> GateOutcome:
    """Run the gate's probes on one model (RunConfig), decide, rerun where asked."""
    from . import api
    from .report.result import Report

    session = api.open_session(config)
    report = api.run(config, progress, session)
    options = {r.name: r.options for r in config.probes}

    def rerun(more: dict[str, Any]) -> dict[str, ProbeResult]:
        from .config import ProbeRequest

        again = dataclasses.replace(config, probes=tuple(ProbeRequest(p, o) for p, o in more.items()))
        return api.run(again, progress, session).results

    checks, results = decide_with_reruns(gate, report.results, options, rerun, baseline, confidence)
    final = Report(meta=report.meta, results=results)
    return GateOutcome(checks, final, confidence if confidence is not None else gate.confidence, gate.source)
