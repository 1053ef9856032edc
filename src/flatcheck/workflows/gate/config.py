"""The gate file: rules on probe results and the probes' options, validated once, before any run."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ...errors import ConfigError
from ...probes.gating import gating_of
from ...probes.registry import get_probe_class, list_probes, parse_options

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

    @property
    def headline(self) -> bool:
        return self.field in (self.probe, f"{self.probe}.value")

    @property
    def path(self) -> str:
        """The field spelt out, as a probe's declaration reads it ("PROBE.layers.x.value" is
        "PROBE.details.layers.x.value"): its parts' degrees of freedom and effort option."""
        below = _below_probe(self.field)
        return f"{self.probe}.{below}" if below else self.probe


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

    def options(self, probe: str) -> Any:
        """`probe`'s Options as this gate will run it."""
        return parse_options(probe, self.probes.get(probe, {}))


def load_gate_config(path: str | Path) -> GateConfig:
    from ...models.yamlfile import load_yaml

    data = load_yaml(Path(path), f"--config {path}", error=ConfigError)
    return parse_gate_config(data, where=str(path))


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
        gating = gating_of(str(name))
        opts = gating.fixed_count(dict(opts))
        try:
            parsed = parse_options(str(name), opts)  # fail now, not after loading the model
        except ConfigError as exc:
            raise fail(f"probes.{name}", f"is invalid: {exc}") from None
        refused = gating.refuse_options(parsed)
        if refused:
            raise fail(f"probes.{name}.{refused[0]}", refused[1])
        probes[str(name)] = opts

    rules = data.get("rules")
    if not isinstance(rules, list) or not rules:
        raise fail("rules", "must be a non-empty list of rules")
    bounds: list[Bound] = []
    for i, rule in enumerate(rules):
        bounds.extend(_parse_rule(rule, f"rules[{i}]", policy, probes, fail, where))
    # options the gate chooses itself where the file leaves them out (a total alone, when
    # no rule reads its parts), which a paired baseline's may replace (run.follow_baseline)
    defaulted: set[str] = set()
    for name in probes:
        fields = [b.path.partition(".")[2] for b in bounds if b.probe == name]
        probes[name], chosen = gating_of(name).gate_options(probes[name], fields)
        defaulted |= {f"{name}.{key}" for key in chosen}
    return GateConfig(tuple(bounds), probes, confidence, max_reruns, factor, where, frozenset(defaulted))


def _below_probe(field: str) -> str:
    """A rule's path below its probe, spelt out as results_io reads the shorthand: a name that is
    not the value or its stderr is a detail ("PROBE.layers.x.value" is "details.layers.x.value"),
    so a probe's declaration sees the parts a rule reads however the rule writes them."""
    rest = field.partition(".")[2]
    first = rest.partition(".")[0]
    return rest if first in ("", "details", "value", "stderr") else f"details.{rest}"


def _parse_rule(rule: Any, at: str, policy: str, probes: dict[str, dict[str, Any]], fail: Callable,
                where: str = "gates") -> list[Bound]:
    """The bounds of one rule (one per bound kind it names); adds its probe to `probes`."""
    if not isinstance(rule, Mapping):
        raise fail(at, "must be a mapping with 'field' and a bound")
    for key in rule:
        if key not in _RULE:
            raise fail(f"{at}.{key}", f"is unknown; allowed: {', '.join(_RULE)}")
    fld = rule.get("field")
    if not isinstance(fld, str) or not fld.strip() or fld.startswith("."):
        raise fail(f"{at}.field", f"must be a dotted path like PROBE.value, got {fld!r}")
    probe = fld.split(".", 1)[0]
    try:
        get_probe_class(probe)
    except ConfigError:
        raise fail(f"{at}.field", f"names no probe {probe!r} (its first part); probes: "
                                  f"{', '.join(list_probes())}") from None
    probes.setdefault(probe, gating_of(probe).fixed_count({}))
    pol = rule.get("inconclusive", policy)
    if pol not in POLICIES:
        raise fail(f"{at}.inconclusive", f"must be one of {', '.join(POLICIES)}, got {pol!r}")
    kinds = [k for k in BOUNDS if k in rule]
    if not kinds:
        raise fail(at, f"needs at least one of {', '.join(BOUNDS)}")
    if "min" in rule and "max" in rule and _number(rule["min"], f"{at}.min", fail) > _number(
            rule["max"], f"{at}.max", fail):
        raise fail(at, f"has min {rule['min']} above max {rule['max']}: no value can pass")
    bounds = []
    for kind in kinds:
        if kind in ("max", "min"):
            limit = _number(rule[kind], f"{at}.{kind}", fail)
        else:
            limit = _fraction(rule[kind], f"{at}.{kind}", fail)
            if limit >= 1 and not isinstance(rule[kind], str):
                # a bare number is a fraction, so 20 meant as 20% would allow 2000%: a bound this
                # wide may be intended (150%), so it is said, not refused
                warnings.warn(f"{where}: {at}.{kind} {rule[kind]} is read as {100 * limit:g} %; "
                              f"write {rule[kind]}% for {rule[kind]} percent", stacklevel=2)
        shown = f"{limit:.4g}" if kind in ("max", "min") else f"{100 * limit:g}%"
        label = rule.get("name") or fld
        bounds.append(Bound(f"{label} {kind} {shown}", fld.strip(), kind, limit, pol))
    return bounds


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
