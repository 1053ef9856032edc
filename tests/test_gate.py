"""Gate decisions on constructed results with known standard errors, plus the CLI end to end
on the demo checkpoint. Thresholds are placed relative to value ± q·stderr, q = Φ⁻¹(0.975)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from scipy.stats import norm

from flatcheck.errors import ConfigError, InputError
from flatcheck.gate import GateOutcome, decide_with_reruns, evaluate, parse_gate_config
from flatcheck.probes.trace import TraceOptions
from flatcheck.report.gate_formats import junit_xml, markdown
from flatcheck.report.result import ProbeResult, Report
from test_cli import CKPT, SPEC, invoke

Q = norm.ppf(0.975)


def result(value, stderr, probe="trace", **details):
    return ProbeResult(probe=probe, value=value, stderr=stderr, matvecs=0, seconds=0.0, details=details)


def gate(*rules, **top):
    return parse_gate_config({"rules": list(rules), **top})


def verdicts(cfg, results, baseline=None):
    return [c.verdict for c in evaluate(cfg, results, baseline)]


# ---------------------------------------------------------------- decisions


def test_stochastic_value_passes_fails_or_is_inconclusive_by_its_interval():
    v, se = 10.0, 1.0
    half = Q * se
    cfg = gate({"field": "trace.value", "max": v + half + 0.01},   # interval wholly below
               {"field": "trace.value", "max": v - half - 0.01},   # wholly above
               {"field": "trace.value", "max": v + half - 0.01},   # straddles
               {"field": "trace.value", "min": v - half + 0.01},   # straddles from below
               {"field": "trace.value", "min": v + half + 0.01})   # wholly below the minimum
    checks = evaluate(cfg, {"trace": result(v, se)})
    assert [c.verdict for c in checks] == ["pass", "fail", "inconclusive", "inconclusive", "fail"]
    assert checks[0].ci == pytest.approx((v - half, v + half))
    assert checks[2].failed  # default policy: inconclusive counts as failed


def test_confidence_level_moves_the_interval():
    cfg = gate({"field": "trace.value", "max": 11.5})  # 1.5 standard errors away
    assert verdicts(cfg, {"trace": result(10.0, 1.0)}) == ["inconclusive"]  # 95%: 1.96 se
    assert [c.verdict for c in evaluate(cfg, {"trace": result(10.0, 1.0)}, confidence=0.8)] == ["pass"]  # 1.28 se


def test_exact_values_compare_directly_and_details_are_reachable():
    cfg = gate({"field": "gini.details.accuracy", "min": 0.9}, {"field": "gini.value", "max": 0.1})
    res = {"gini": result(0.1, None, probe="gini", accuracy=0.89)}
    assert verdicts(cfg, res) == ["fail", "pass"]  # 0.1 ≤ 0.1 passes


def test_inconclusive_policy_pass_does_not_fail_the_gate():
    cfg = gate({"field": "trace.value", "max": 11.0, "inconclusive": "pass"})
    (c,) = evaluate(cfg, {"trace": result(10.0, 1.0)})
    assert c.verdict == "inconclusive" and not c.failed


def test_baseline_rule_threshold_and_baseline_stderr():
    cfg = gate({"field": "trace.value", "max_increase": "20%"}, {"field": "trace.value", "max_decrease": 0.5})
    base = {"trace": result(10.0, None).to_dict()}
    checks = evaluate(cfg, {"trace": result(12.0, None)}, base)
    assert [c.threshold for c in checks] == [pytest.approx(12.0), pytest.approx(5.0)]
    assert [c.verdict for c in checks] == ["pass", "pass"]
    assert verdicts(cfg, {"trace": result(12.5, None)}, base)[0] == "fail"
    # baseline stderr 1 moves T = 1.2·b by 1.2 standard errors: interval 13 ± Q·1.2 straddles 12
    (c, _) = evaluate(cfg, {"trace": result(13.0, None)}, {"trace": result(10.0, 1.0).to_dict()})
    assert c.verdict == "inconclusive" and c.stderr == pytest.approx(1.2)
    # negative baseline: "20% more" is b + 0.2·|b|
    (c, _) = evaluate(cfg, {"trace": result(-7.0, None)}, {"trace": result(-10.0, None).to_dict()})
    assert c.threshold == pytest.approx(-8.0) and c.verdict == "fail"


def test_baseline_without_the_field_is_skipped_and_missing_baseline_is_bad_input():
    cfg = gate({"field": "gini.value", "max_increase": "10%"})
    (c,) = evaluate(cfg, {"gini": result(0.1, None, probe="gini")}, {"trace": result(1.0, None).to_dict()})
    assert c.verdict == "skipped" and not c.failed
    with pytest.raises(InputError, match="baseline"):
        evaluate(cfg, {"gini": result(0.1, None, probe="gini")})


def test_rerun_raises_the_effort_option_until_decided():
    # stderr ∝ 1/√probes_max: 4 → 2.0, 8 → 1.41, 16 → 1.0, 32 → 0.71, 64 → 0.5
    def se(n):
        return 4.0 / math.sqrt(n)

    threshold = 10.0 + Q * se(64) + 0.01  # decided only at 64 probes
    cfg = gate({"field": "trace.value", "max": threshold, "inconclusive": "rerun"}, max_reruns=5)
    asked = []

    def rerun(more):
        n = more["trace"].probes_max
        asked.append(n)
        return {"trace": result(10.0, se(n))}

    checks, final = decide_with_reruns(cfg, {"trace": result(10.0, se(4))}, {"trace": TraceOptions(probes_max=4)},
                                       rerun)
    assert asked == [8, 16, 32, 64]
    assert checks[0].verdict == "pass" and checks[0].reruns == 4
    assert final["trace"].stderr == pytest.approx(se(64))

    capped = dataclasses.replace(cfg, max_reruns=2)
    asked.clear()
    checks, _ = decide_with_reruns(capped, {"trace": result(10.0, se(4))}, {"trace": TraceOptions(probes_max=4)},
                                   rerun)
    assert asked == [8, 16] and checks[0].verdict == "inconclusive" and checks[0].failed


def test_probes_without_an_effort_option_are_not_rerun():
    cfg = gate({"field": "gini.value", "max": 0.5, "inconclusive": "rerun"})
    calls = []
    checks, _ = decide_with_reruns(cfg, {"gini": result(0.5, 0.1, probe="gini")}, {"gini": None},
                                   lambda more: calls.append(more) or {})
    assert calls == [] and checks[0].verdict == "inconclusive" and checks[0].failed


@pytest.mark.parametrize("data, where", [
    ({"rules": [{"field": "trace.value", "maxx": 1}]}, "rules[0].maxx"),
    ({"rules": [{"field": "trace.value"}]}, "rules[0]"),
    ({"rules": [{"field": "nosuchprobe.value", "max": 1}]}, "rules[0].field"),
    ({"rules": [{"field": "trace.value", "max": "big"}]}, "rules[0].max"),
    ({"rules": [{"field": "trace.value", "max_increase": "lots"}]}, "rules[0].max_increase"),
    ({"rules": [{"field": "trace.value", "max": 1, "inconclusive": "maybe"}]}, "rules[0].inconclusive"),
    ({"rules": [{"field": "trace.value", "max": 1}], "probes": {"trace": {"probes_max": 1}}}, "probes.trace"),
    ({"rules": []}, "rules"),
    ({"rules": [{"field": "trace.value", "max": 1}], "confidence": 1.5}, "confidence"),
])
def test_bad_gate_files_name_the_field(data, where):
    with pytest.raises(ConfigError, match=re.escape(f"gates.yaml: field '{where}'")):
        parse_gate_config(data, where="gates.yaml")


def test_junit_counts_and_markdown():
    cfg = gate({"field": "trace.value", "max": 100},                       # pass
               {"field": "trace.value", "max": 1},                         # fail
               {"field": "trace.value", "max": 11, "inconclusive": "pass"},  # tolerated → skipped
               {"field": "trace.value", "max": 11},                        # inconclusive → failure
               {"field": "gini.value", "max_increase": "5%"})              # baseline lacks it → skipped
    res = {"trace": result(10.0, 1.0), "gini": result(0.2, None, probe="gini")}
    checks = evaluate(cfg, res, {"trace": result(10.0, None).to_dict()})
    outcome = GateOutcome(checks, Report(meta={"seconds": 1.5}, results=res), 0.95)
    root = ET.fromstring(junit_xml(outcome))
    cases = root.findall(".//testcase")
    assert len(cases) == 5
    assert len(root.findall(".//testcase/failure")) == 2 == int(root.get("failures"))
    assert len(root.findall(".//testcase/skipped")) == 2 == int(root.get("skipped"))
    assert outcome.exit_code == 1
    md = markdown(outcome)
    assert md.startswith("### flatcheck gate: ❌ failed") and md.count("\n| ") == 6  # header + 5 rules


# ---------------------------------------------------------------- end to end (demo checkpoint)


def write_gates(folder: Path, text: str) -> Path:
    path = folder / "gates.yaml"
    path.write_text(text)
    return path


def gate_cli(config: Path, *extra):
    return invoke("gate", CKPT, "--spec", SPEC, "--data", "digits", "--samples", "64", "--batch-size", "64",
                  "--config", config, "-q", *extra)


@pytest.fixture(scope="module")
def passing(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gate")
    cfg = write_gates(folder, "probes:\n  trace: {probes_max: 4}\nrules:\n"
                              "  - {field: gini.details.accuracy, min: 0.5}\n"
                              "  - {field: trace.value, max: 1.0e+6}\n")
    junit, summary, out = folder / "r.xml", folder / "s.md", folder / "gate.json"
    res = gate_cli(cfg, "--junit", junit, "--summary", summary, "--json", out)
    return res, folder, junit, summary, out


def test_gate_cli_passes_and_writes_junit_summary_json(passing):
    res, _, junit, summary, out = passing
    assert res.exit_code == 0, res.stderr
    root = ET.parse(junit).getroot()
    assert len(root.findall(".//testcase")) == 2 and root.get("failures") == "0"
    assert "✅ passed" in summary.read_text()
    data = json.loads(out.read_text())
    assert data["gate"]["passed"] and set(data["results"]) == {"trace", "gini"}
    # no rule reads the trace's per-layer parts: the total alone, by vᵀHv
    trace = data["results"]["trace"]
    assert trace["details"]["parts"] is False and "forward tangents" in trace["notes"]


def test_gate_cli_fails_with_exit_1_and_baseline(passing):
    _, folder, _, _, out = passing
    cfg = write_gates(folder, "rules:\n  - {field: gini.details.accuracy, min: 1.01}\n"
                              "  - {field: gini.value, max_increase: 0%}\n")
    res = gate_cli(cfg, "--baseline", out)  # the passing gate's JSON serves as baseline
    assert res.exit_code == 1, res.stderr
    assert "FAILED" in res.stdout and "Traceback" not in res.stderr


def test_gate_cli_bad_input_exits_2(tmp_path):
    cfg = write_gates(tmp_path, "rules:\n  - {field: gini.value, mx: 1}\n")
    res = gate_cli(cfg)
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and "rules[0].mx" in res.stderr
    cfg = write_gates(tmp_path, "rules:\n  - {field: gini.value, max_increase: 10%}\n")
    res = gate_cli(cfg)
    assert res.exit_code == 2 and "--baseline" in res.stderr


def test_trace_parts_only_where_a_rule_reads_them_or_the_file_asks():
    assert gate({"field": "trace.value", "max": 1}).probes["trace"] == {"parts": False}
    layered = gate({"field": "trace.details.layers.head.value", "max": 1})
    assert "parts" not in layered.probes["trace"]  # the probe's default: with parts
    kept = gate({"field": "trace.value", "max": 1}, probes={"trace": {"parts": True, "probes_max": 8}})
    assert kept.probes["trace"] == {"parts": True, "probes_max": 8}
    assert "trace" not in gate({"field": "gini.value", "max": 1}).probes


def test_example_gates_file_is_valid():
    from flatcheck.gate import load_gate_config
    from test_cli import ROOT

    cfg = load_gate_config(ROOT / "examples" / "gates.yaml")
    assert cfg.needs_baseline and {"trace", "gini"} <= set(cfg.probes)
