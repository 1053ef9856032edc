"""The gate reads every probe through the probe's own gating declaration (probes/gating.py):
the gate package names no probe, its modules stay small, every shipped probe declares its
gating, and a probe that declares none is gated on exact values only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from flatcheck.errors import InputError
from flatcheck.probes import registry
from flatcheck.probes.gating import UNDECLARED, Gating, gating_of
from flatcheck.probes.registry import list_probes
from flatcheck.report.result import ProbeResult
from flatcheck.workflows.gate import evaluate, parse_gate_config
from flatcheck.workflows.gate.statistics import error_bound

GATE = Path(__file__).resolve().parents[2] / "src" / "flatcheck" / "workflows" / "gate"
MAX_LINES = 400


def test_the_gate_package_names_no_probe_and_each_module_is_small():
    files = sorted(GATE.glob("*.py"))
    assert {f.stem for f in files} >= {"__init__", "config", "statistics", "checks", "run"}
    names = list_probes()
    for f in files:
        text = f.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= MAX_LINES, f"{f.name}: {len(text.splitlines())} lines"
        for name in names:
            # as a word: `trace` in "trace.value" or "a trace's", not inside "retrace"
            hit = re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text)
            assert hit is None, f"{f.name} names the probe {name!r}: {text[max(0, hit.start() - 40):hit.end() + 40]!r}"


@pytest.mark.parametrize("probe", list_probes())
def test_every_probe_declares_its_gating(probe):
    declared = getattr(registry.get_probe_class(probe), "gating", None)
    assert isinstance(declared, Gating) and declared.declared and gating_of(probe) is declared
    options = {f for f in registry.get_probe_class(probe).Options.__dataclass_fields__}
    named = [declared.effort_option, declared.adaptive_stop, declared.tolerance_option, declared.route_option,
             *declared.quantity_options, *declared.route_efforts.values(), *declared.field_efforts.values()]
    assert {n for n in named if n is not None} <= options, "a declared option the probe's Options lack"


def _lmax(value: float, **extra) -> dict:
    return {"probe": "lmax", "value": value, "stderr": None, "resolved": True, "seed": 0, "matvecs": 40,
            "details": {"eigenvalues": [value], "residuals": [0.004], "converged": [True], "tol": 1e-3}, **extra}


def test_lmax_is_bounded_by_its_own_error_bound():
    """lmax's declaration reads the result's error_bound; a report from before the field (schema
    < 2.4) is bounded by its residual, as a Ritz value lies within it of an eigenvalue."""
    cfg = parse_gate_config({"rules": [{"field": "lmax.value", "max": 20}]})
    (bound,) = cfg.bounds
    assert error_bound({"lmax": _lmax(13.6, error_bound=1.2e-6)}, bound) == 1.2e-6
    assert error_bound({"lmax": _lmax(13.6)}, bound) == 0.004
    (check,) = evaluate(cfg, {"lmax": _lmax(13.6, error_bound=1.2e-6)})
    assert check.verdict == "pass" and check.ci == pytest.approx((13.6 - 1.2e-6, 13.6 + 1.2e-6))


@dataclass(frozen=True)
class _Options:
    steps: int = 10


class _Bare:
    """A probe that declares no gating (as a third party's might)."""

    name: ClassVar[str] = "bare-probe"
    summary: ClassVar[str] = "a test probe"
    Options: ClassVar[type] = _Options
    requires: ClassVar[frozenset] = frozenset()


def test_a_probe_without_a_declaration_is_gated_on_exact_values_only(monkeypatch):
    """An iterative or sampled value of an undeclared probe is refused, not read as a plain
    normal value: nothing says how many draws made its error or what bounds it."""
    monkeypatch.setitem(registry._PROBES, "bare-probe", _Bare)
    assert gating_of("bare-probe") is UNDECLARED and UNDECLARED.effort_option is None
    cfg = parse_gate_config({"rules": [{"field": "bare-probe.value", "max": 2}]})

    def run(**kw):
        return {"bare-probe": ProbeResult(probe="bare-probe", value=1.0, matvecs=0, seconds=0.0, **kw)}

    assert [c.verdict for c in evaluate(cfg, run(stderr=None))] == ["pass"]
    with pytest.raises(InputError, match="has a standard error and bare-probe declares no gating"):
        evaluate(cfg, run(stderr=0.1))
    with pytest.raises(InputError, match="has an error bound and bare-probe declares no gating"):
        evaluate(cfg, run(stderr=None, error_bound=0.01))
    with pytest.raises(InputError, match="bare-probe stopped short of its own stopping rule"):
        evaluate(cfg, run(stderr=None, resolved=False))
