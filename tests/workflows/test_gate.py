"""Gate decisions on constructed results with known standard errors, plus the CLI end to end
on the demo checkpoint. Thresholds are placed relative to value ± q·stderr, q = Φ⁻¹(0.975)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from scipy.stats import norm, t as stats_t

from flatcheck.errors import ConfigError, InputError
from flatcheck.workflows.gate.config import parse_gate_config
from flatcheck.workflows.gate.run import decide_with_reruns, GateOutcome
from flatcheck.workflows.gate.verdicts import evaluate
from flatcheck.probes.registry import list_probes
from flatcheck.probes.trace import TraceOptions
from flatcheck.report.gate_formats import junit_xml, markdown
from flatcheck.report.result import ProbeResult, Report
from tests.support.cli import CKPT, SPEC, invoke

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


@pytest.mark.parametrize("route, raised, kept", [("monte-carlo", "noise_draws", "probes_max"),
                                                 ("second-order", "probes_max", "noise_draws")])
def test_a_rerun_raises_the_count_of_the_estimate_the_headline_is(route, raised, kept):
    """adaptive-sharpness' headline is one of two estimators, each with its own count: a rerun
    raises that route's (it had no effort option: an inconclusive rule stayed so)."""
    from flatcheck.probes.adaptive_sharpness import AdaptiveSharpnessOptions

    def se(n):
        return 4.0 / math.sqrt(n)

    def run(n):
        return result(10.0, se(n), probe="adaptive-sharpness", route=f"{route}: S_ρ")

    start = AdaptiveSharpnessOptions(noise_draws=4, probes_max=4)
    cfg = gate({"field": "adaptive-sharpness.value", "max": 10.0 + Q * se(16) + 0.01, "inconclusive": "rerun"},
               max_reruns=5)
    asked = []

    def rerun(more):
        options = more["adaptive-sharpness"]
        assert getattr(options, kept) == 4
        asked.append(getattr(options, raised))
        return {"adaptive-sharpness": run(asked[-1])}

    checks, _ = decide_with_reruns(cfg, {"adaptive-sharpness": run(4)}, {"adaptive-sharpness": start}, rerun)
    assert asked == [8, 16] and checks[0].verdict == "pass"
    assert checks[0].message.startswith(f"adaptive-sharpness rerun 2× ({raised} 16)")


def test_a_rule_on_one_estimator_s_field_is_rerun_by_that_estimator_s_count():
    """A rule on details.second_order.value under a Monte Carlo headline doubled noise_draws,
    which that field does not read (reviewer19): it raises probes_max, the count it is made of."""
    from flatcheck.probes.adaptive_sharpness import AdaptiveSharpnessOptions

    def run(n):
        return result(10.0, 1.0, probe="adaptive-sharpness", route="monte-carlo: S_ρ",
                      second_order={"value": 10.0, "stderr": 4.0 / math.sqrt(n)})

    cfg = gate({"field": "adaptive-sharpness.details.second_order.value", "max": 10.0 + Q * 1.0 + 0.01,
                "inconclusive": "rerun"}, max_reruns=5)
    asked = []

    def rerun(more):
        options = more["adaptive-sharpness"]
        assert options.noise_draws == 4
        asked.append(options.probes_max)
        return {"adaptive-sharpness": run(asked[-1])}

    start = AdaptiveSharpnessOptions(noise_draws=4, probes_max=4)
    checks, _ = decide_with_reruns(cfg, {"adaptive-sharpness": run(4)}, {"adaptive-sharpness": start}, rerun)
    assert asked == [8, 16] and checks[0].verdict == "pass"


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


def test_the_step_summary_heading_tells_appended_runs_apart():
    """Gates appended to one $GITHUB_STEP_SUMMARY had the same heading: each names its
    checkpoint (file, sha256 prefix) and baseline, and each rule the baseline's value."""
    cfg = gate({"field": "trace.value", "max_increase": "20%"})
    res = {"trace": result(10.0, None)}
    meta = {"checkpoint": {"path": "/ci/models/candidate.safetensors", "sha256": "0123456789abcdef" * 4}}
    outcome = GateOutcome(evaluate(cfg, res, {"trace": result(9.0, None).to_dict()}), Report(meta=meta, results=res),
                          0.95, baseline="release.json, of release.safetensors (sha256 fedcba987654)")
    head, *rest = markdown(outcome).splitlines()
    assert head == ("### flatcheck gate: ✅ passed · candidate.safetensors (sha256 0123456789ab) vs release.json, of "
                    "release.safetensors (sha256 fedcba987654)")
    assert "| trace.value max_increase 20% | 10 | — | 10.8 | 9 | ✅ pass |" in rest
    first = GateOutcome([], Report(meta={}, results={}), 0.95)
    assert markdown(first).splitlines()[0].endswith("the model source's own weights (no baseline)")


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
    sha = hashlib.sha256(Path(CKPT).read_bytes()).hexdigest()
    assert summary.read_text().startswith(f"### flatcheck gate: ✅ passed · {Path(CKPT).name} (sha256 {sha[:12]}) "
                                          "(no baseline)")
    data = json.loads(out.read_text())
    assert data["gate"]["passed"] and set(data["results"]) == {"trace", "gini"}
    # no rule reads the trace's per-layer parts: the total alone; 4 products are too few to
    # repay tracing the loss for forward tangents (TANGENT_MIN_PRODUCTS), so by HVPs
    trace = data["results"]["trace"]
    assert trace["details"]["parts"] is False and trace["details"]["route"] == "hvp_sums"


def test_gate_cli_fails_with_exit_1_and_baseline(passing):
    _, folder, _, _, out = passing
    cfg = write_gates(folder, "rules:\n  - {field: gini.details.accuracy, min: 1.01}\n"
                              "  - {field: gini.value, max_increase: 0%}\n")
    summary = folder / "appended.md"
    res = gate_cli(cfg, "--baseline", out, "--summary", summary)  # the passing gate's JSON serves as baseline
    assert res.exit_code == 1, res.stderr
    assert "FAILED" in res.stdout and "Traceback" not in res.stderr
    head = summary.read_text().splitlines()[0]
    assert head.startswith("### flatcheck gate: ❌ failed · ") and f"vs {out.name}, of {Path(CKPT).name} (sha256 " in head


def test_gate_outputs_whose_folder_goes_during_the_run_are_rescued_and_named(tmp_path, monkeypatch):
    """The folder of --junit, --summary and --json exists when the gate starts and is gone when
    the run ends: each output is written to a temporary file and named, the verdict is still
    printed, and the exit is 2 (an output is not where asked), not the run lost."""
    import flatcheck.workflows.gate as gate_pkg
    from tests.support.outputs import lose_folder_after

    folder, spare = lose_folder_after(monkeypatch, gate_pkg, "run_gate", tmp_path)
    cfg = write_gates(tmp_path, "probes:\n  trace: {probes_max: 4}\nrules:\n"
                                "  - {field: gini.details.accuracy, min: 0.5}\n")
    res = gate_cli(cfg, "--junit", folder / "j.xml", "--summary", folder / "s.md", "--json", folder / "g.json")
    assert res.exit_code == 2, res.stderr
    assert "PASSED" in res.stdout  # the verdict
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "exit code: 0" in lines[0], res.stderr
    kept = {p.suffix: p for p in spare.iterdir()}
    assert set(kept) == {".xml", ".md", ".json"}
    for flag, path in (("--junit", folder / "j.xml"), ("--summary", folder / "s.md"), ("--json", folder / "g.json")):
        assert f"{flag} {path}: cannot write" in lines[0] and str(kept[path.suffix]) in lines[0]
    assert json.loads(kept[".json"].read_text())["gate"]["passed"] is True
    assert len(ET.parse(kept[".xml"]).getroot().findall(".//testcase")) == 1
    assert kept[".md"].read_text().startswith("### flatcheck gate: ✅ passed")
    assert not folder.exists()


def test_gate_cli_bad_input_exits_2(tmp_path):
    cfg = write_gates(tmp_path, "rules:\n  - {field: gini.value, mx: 1}\n")
    res = gate_cli(cfg)
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and "rules[0].mx" in res.stderr
    cfg = write_gates(tmp_path, "rules:\n  - {field: gini.value, max_increase: 10%}\n")
    res = gate_cli(cfg)
    assert res.exit_code == 2 and "--baseline" in res.stderr


def _hutchpp_trace() -> dict:
    values = [27.1, 28.4, 27.6, 28.9]
    return ProbeResult(probe="trace", value=sum(values) / 4, stderr=0.4, dof=3, matvecs=12,
                       seconds=0.0, seed=0, label="Tr(H)",
                       details={"matrix": "hessian", "estimator": "hutchpp", "route": "vhv_tangent", "parts": False,
                                "probe_values": values, "offset": 0.0}).to_dict()


def _report(tmp_path: Path, results: dict) -> Path:
    from flatcheck.report.result import SCHEMA_VERSION

    path = tmp_path / "release.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "results": results}), encoding="utf-8")
    return path


def test_a_record_filed_under_another_probes_key_is_refused(tmp_path):
    """results.trace copied over results.gini was gated: `gini.value max_increase 50%` passed
    against 1.5 × the trace (stranger test). A record's own probe field, the options its details
    name (matrix) and its route must be those of the probe it is filed under: exit 2, one line,
    before the model is loaded."""
    from flatcheck.workflows.gate.baseline import load_baseline

    trace = _hutchpp_trace()
    with pytest.raises(InputError, match=r"results.gini is the result of probe 'trace', not of gini"):
        load_baseline(_report(tmp_path, {"trace": trace, "gini": trace}))
    # its probe field edited too: trace's matrix and route are no gini's
    with pytest.raises(InputError, match=r"results.gini: details.matrix is 'hessian', and gini has no matrix option"):
        load_baseline(_report(tmp_path, {"gini": {**trace, "probe": "gini"}}))
    routed = {**trace, "probe": "gini", "details": {**trace["details"], "matrix": None}}
    with pytest.raises(InputError, match=r"results.gini: details.route 'vhv_tangent' is not one of gini's routes"):
        load_baseline(_report(tmp_path, {"gini": routed}))
    lmax = {**trace, "probe": "lmax", "details": {**trace["details"], "matrix": "fisher"}}
    with pytest.raises(InputError, match=r"results.lmax: details.matrix is 'fisher', not one of lmax's"):
        load_baseline(_report(tmp_path, {"lmax": lmax}))
    load_baseline(_report(tmp_path, {"trace": trace}))  # its own key: fine
    cfg = write_gates(tmp_path, "rules:\n  - {field: gini.value, max_increase: 50%}\n")
    res = gate_cli(cfg, "--baseline", _report(tmp_path, {"trace": trace, "gini": trace}))
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "results.gini is the result of probe 'trace'" in res.stderr


@pytest.mark.parametrize("probe", list_probes())
def test_every_probes_key_holds_only_its_own_record(tmp_path, probe):
    from flatcheck.workflows.gate.baseline import load_baseline

    other = "gini" if probe != "gini" else "gap"
    with pytest.raises(InputError, match=rf"results.{probe} is the result of probe '{other}'"):
        load_baseline(_report(tmp_path, {probe: {"probe": other, "value": 1.0, "stderr": None}}))
    own = _hutchpp_trace() if probe == "trace" else {"probe": probe, "value": 1.0, "stderr": None}
    load_baseline(_report(tmp_path, {probe: own}))


def test_trace_parts_only_where_a_rule_reads_them_or_the_file_asks():
    # rtol None: a gate's trace takes its fixed count, not the probe's default 5 % stop
    assert gate({"field": "trace.value", "max": 1}).probes["trace"] == {"parts": False, "rtol": None}
    layered = gate({"field": "trace.details.layers.head.value", "max": 1})
    assert "parts" not in layered.probes["trace"]  # the probe's default: with parts
    kept = gate({"field": "trace.value", "max": 1}, probes={"trace": {"parts": True, "probes_max": 8}})
    assert kept.probes["trace"] == {"parts": True, "probes_max": 8, "rtol": None}
    assert "trace" not in gate({"field": "gini.value", "max": 1}).probes


def test_example_gates_file_is_valid():
    from flatcheck.workflows.gate.config import load_gate_config
    from tests.support.cli import ROOT

    cfg = load_gate_config(ROOT / "examples" / "gates.yaml")
    assert cfg.needs_baseline and {"trace", "gini"} <= set(cfg.probes)
    # both directions of the trace, and a quantity that moves with the logit scale
    kinds = {(b.field, b.kind) for b in cfg.bounds}
    assert {("trace.value", "max_increase"), ("trace.value", "max_decrease"), ("jacobian.value", "max_increase"),
            ("jacobian.value", "max_decrease")} <= kinds


# ---------------------------------------------------------------- baselines and pairing


def traced(values, seed=0, offset=0.0, estimator="hutchinson", **top):
    """A trace result with per-probe values, as schema 2.0 reports hold them."""
    n = len(values)
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    from flatcheck.linalg.random import SIGN_STREAM

    details = {"probe_values": list(values), "offset": offset, "estimator": estimator, "matrix": "hessian",
               "sign_stream": SIGN_STREAM}
    return ProbeResult("trace", offset + mean, se, n, 0.0, seed=seed, details=details, dof=n - 1, **top).to_dict()


def test_paired_comparison_tests_the_per_probe_differences():
    values = [10.0 + 6 * math.sin(3 * i) for i in range(16)]  # spread 4.4: unpaired, 20% is undecidable
    cfg = gate({"field": "trace.value", "max_increase": "20%"})
    same = evaluate(cfg, {"trace": traced(values)}, {"trace": traced(values)})[0]
    # unchanged: v − 1.2·b = −0.2·b̄ with error 0.2·s_b, t with 15 degrees of freedom, widened
    # by the differences' skewness (a Hutchinson record without details.interval is read as
    # today's, whose interval widens; the skewness of −0.2·b_i is the values')
    import torch

    from flatcheck.linalg.trace import skew_widening

    b = sum(values) / 16
    assert same.verdict == "pass" and same.paired == 16 and same.value == pytest.approx(b)
    s_b = traced(values)["stderr"] * skew_widening(torch.tensor(values, dtype=torch.float64))
    assert same.stderr == pytest.approx(0.2 * s_b)
    half = stats_t.ppf(0.975, 15) * 0.2 * s_b
    assert same.ci == pytest.approx((b - half, b + half))
    # every probe value 1.5× larger: decided as a failure, paired
    grown = evaluate(cfg, {"trace": traced([1.5 * v for v in values])}, {"trace": traced(values)})[0]
    assert grown.verdict == "fail"
    # the same values at another seed: unpaired, the interval straddles, and it says why
    other = evaluate(cfg, {"trace": traced(values, seed=1)}, {"trace": traced(values)})[0]
    assert other.verdict == "inconclusive" and other.paired is None and "seeds differ" in other.message


def test_pairing_takes_the_common_first_probes_and_hutchpp_only_at_equal_counts():
    values = [float(v) for v in range(1, 33)]
    cfg = gate({"field": "trace.value", "max_increase": "20%"})
    (c,) = evaluate(cfg, {"trace": traced(values[:8])}, {"trace": traced(values)})
    assert c.paired == 8 and not c.capped and c.baseline == pytest.approx(sum(values[:8]) / 8)
    (c,) = evaluate(cfg, {"trace": traced(values)}, {"trace": traced(values[:8])})
    assert c.paired == 8 and c.capped  # a rerun cannot add pairs: the baseline holds 8
    (c,) = evaluate(cfg, {"trace": traced(values[:8], estimator="hutchpp")},
                    {"trace": traced(values, estimator="hutchpp")})
    assert c.paired is None and "another count" in c.message
    old = {"trace": {k: v for k, v in traced(values).items() if k != "details"}}
    (c,) = evaluate(cfg, {"trace": traced(values)}, old)
    assert c.paired is None and "no per-probe values" in c.message
    # a report of a flatcheck that drew one int8 per sign (no sign_stream) holds other vectors
    # for the same seed: compared unpaired, saying why
    earlier = traced(values)
    del earlier["details"]["sign_stream"]
    (c,) = evaluate(cfg, {"trace": traced(values)}, {"trace": earlier})
    assert c.paired is None and "random stream" in c.message


def test_student_t_for_few_draws_and_welch_for_two_sides():
    from flatcheck.workflows.gate.statistics import quantile

    assert quantile(0.95, 4) == pytest.approx(stats_t.ppf(0.975, 4))
    assert quantile(0.95) == pytest.approx(Q)
    cfg = gate({"field": "trace.value", "max": 100})
    (c,) = evaluate(cfg, {"trace": traced([1.0, 2.0, 4.0])})
    assert c.ci[1] - c.value == pytest.approx(stats_t.ppf(0.975, 2) * c.stderr)


def _baseline(results, **meta):
    from flatcheck.workflows.gate.baseline import Baseline

    return Baseline(results, meta, "--baseline b.json")


META = {"model": {"arch": "a", "source": "python", "parameters": 10, "probed_parameters": 10, "num_classes": 3,
                  "loss": "cross_entropy", "label_smoothing": None, "params_filter": None},
        "bn_mode": "eval", "data": {"name": "digits", "split": "train", "samples": 64, "fingerprint": "f"}}


@pytest.mark.parametrize("value, match", [("nan", "not a finite number"), ("abc", "not a finite number"),
                                          (None, "not a finite number"), ("inf", "not a finite number")])
def test_a_baseline_value_a_rule_needs_must_be_a_finite_number(value, match):
    from flatcheck.workflows.gate.checks import check_baseline

    cfg = gate({"field": "gini.value", "max_increase": "10%"})
    with pytest.raises(InputError, match=match):
        check_baseline(cfg, _baseline({"gini": {"value": value, "stderr": None}}, **META), META, seed=0)


@pytest.mark.parametrize("path, new", [(("model", "arch"), "b"), (("model", "parameters"), 11),
                                       (("data", "name"), "npz:x.npz"), (("data", "split"), "test"),
                                       (("data", "samples"), 65)])
def test_a_baseline_of_another_model_or_data_is_refused_unless_allowed(path, new):
    import copy

    from flatcheck.workflows.gate.checks import check_baseline

    cfg = gate({"field": "gini.value", "max_increase": "10%"})
    base = _baseline({"gini": result(0.1, None, probe="gini").to_dict()}, **META)
    other = copy.deepcopy(META)
    other[path[0]][path[1]] = new
    with pytest.raises(InputError, match=re.escape(".".join(path)) + ".*--allow-foreign-baseline"):
        check_baseline(cfg, base, other, seed=0)
    check_baseline(cfg, base, other, seed=0, allow_foreign=True)
    check_baseline(cfg, base, META, seed=0)  # the same model: fine


def test_data_read_in_another_dtype_names_the_dtype_to_run_at():
    """A float32 gate against a float64 baseline was refused as data.fingerprint alone: the
    samples as read differ, and the dtype is what to change (stranger19)."""
    import copy

    from flatcheck.workflows.gate.checks import check_baseline

    cfg = gate({"field": "gini.value", "max_increase": "10%"})
    base = _baseline({"gini": result(0.1, None, probe="gini").to_dict()}, **META, dtype="float64")
    now = copy.deepcopy(META)
    now["data"]["fingerprint"], now["dtype"] = "g", "float32"
    with pytest.raises(InputError, match=r"data.fingerprint: 'f' → 'g'\); the baseline was made in float64 and this "
                                         r"run is float32: run with --dtype float64; compare anyway"):
        check_baseline(cfg, base, now, seed=0)
    now["dtype"] = "float64"  # the same dtype: other data, and nothing said of a dtype
    with pytest.raises(InputError, match=r"'f' → 'g'\); compare anyway"):
        check_baseline(cfg, base, now, seed=0)
    now["dtype"], now["model"]["arch"] = "float32", "b"  # another model too: the dtype would not mend it
    with pytest.raises(InputError, match=r"'f' → 'g'\); compare anyway"):
        check_baseline(cfg, base, now, seed=0)


def test_a_baseline_made_with_tf32_against_a_run_without_is_refused():
    """TF32 moved the demo's lmax 18 times its certified bound on an H200: a TF32 baseline and an
    exact run measure different numbers, so the gate says which flag to run with (exit 2)."""
    from flatcheck.workflows.gate.checks import check_baseline

    cfg = gate({"field": "gini.value", "max_increase": "10%"})
    base = _baseline({"gini": result(0.1, None, probe="gini").to_dict()}, **META, allow_tf32=True)
    with pytest.raises(InputError, match=r"made with TF32 products and this run is without TF32: run with "
                                         r"--allow-tf32, or compare anyway with --allow-foreign-baseline"):
        check_baseline(cfg, base, {**META, "allow_tf32": False}, seed=0)
    check_baseline(cfg, base, {**META, "allow_tf32": False}, seed=0, allow_foreign=True)
    check_baseline(cfg, base, {**META, "allow_tf32": True}, seed=0)  # both with it: fine
    check_baseline(cfg, base, META, seed=0)  # a run that does not say: not refused on a guess
    older = _baseline({"gini": result(0.1, None, probe="gini").to_dict()}, **META)  # before the field
    check_baseline(cfg, older, {**META, "allow_tf32": True}, seed=0)


@pytest.mark.parametrize("schema, dtype, mean, refused", [
    ("2.6", "float32", 5e-8, True),    # every sample saturated (a stranger's CNN, loss 5e-8): off by ~1
    ("2.6", "float32", 1.7e-4, True),  # loss 1.7e-4: lmax was 1.5–5 times outside its bound
    ("2.6", "float32", 2.75e-3, False),  # the demo CNN: about 4e-5 relative at most
    ("2.6", "float64", 5e-8, False),   # float64 had the digits to spare
    ("2.7", "float32", 5e-8, False),   # made with the stable formulas
])
def test_an_older_float32_baseline_of_a_saturated_softmax_is_refused(schema, dtype, mean, refused):
    """Before schema 2.7 float32 curvature products of cross entropy lost float32's eps of
    absolute precision per sample against an output Hessian the size of 1 − max p: this run's
    data.softmax_saturation says whether an older float32 baseline's values are its model's."""
    import copy

    from flatcheck.workflows.gate.checks import check_baseline

    from flatcheck.workflows.gate.checks import _check_softmax_cancellation

    records = {"gini": result(0.1, None, probe="gini").to_dict(), "trace": traced([10.0, 11.0, 9.0])}
    base = _baseline(records, **META, dtype=dtype, schema_version=schema)
    now = copy.deepcopy(META)
    now["data"]["softmax_saturation"] = {"threshold": 1e-3, "samples": 64, "least": mean / 3, "mean": mean}
    on_trace = gate({"field": "trace.value", "max_increase": "10%"})
    if refused:
        with pytest.raises(InputError, match=r"before schema 2.7.*measure the baseline again with this version, "
                                             r"or compare anyway with --allow-foreign-baseline"):
            _check_softmax_cancellation(on_trace, base, now)
        check_baseline(on_trace, base, now, seed=0, allow_foreign=True)  # the named way past it
    else:
        _check_softmax_cancellation(on_trace, base, now)
    # gini is an average of p, not of the loss's derivatives: its rules never read that error
    check_baseline(gate({"field": "gini.value", "max_increase": "10%"}), base, now, seed=0)
    _check_softmax_cancellation(gate({"field": "trace.value", "max": 50}), base, now)  # no rule reads the baseline
    _check_softmax_cancellation(on_trace, base, META)  # a run that does not say (no softmax loss)


def test_a_baseline_too_wide_for_the_rule_is_refused_with_the_probes_it_needs():
    from flatcheck.workflows.gate.checks import check_baseline

    values = [10.0 + 6 * math.sin(3 * i) for i in range(16)]
    cfg = gate({"field": "trace.value", "max_increase": "20%"})
    base = _baseline({"trace": traced(values)}, **META)
    with pytest.raises(InputError, match=r"cannot pass an unchanged model unpaired.*probes_max ≥ (\d+) "
                                         r"\(the baseline has 16\)") as exc:
        check_baseline(cfg, base, META, seed=1)
    need = int(re.search(r"probes_max ≥ (\d+)", str(exc.value)).group(1))
    # with that many probes of the same spread on both sides, twice an unchanged model's
    # interval z·√(1 + 1.2²)·s_b falls inside the margin
    s_b = traced(values)["stderr"] * math.sqrt(16 / need)
    assert 2 * stats_t.ppf(0.975, need - 1) * math.sqrt(1 + 1.2**2) * s_b < 0.2 * sum(values) / 16
    check_baseline(cfg, base, META, seed=0)  # paired at its own seed: decidable


def test_a_hutchpp_baseline_is_never_asked_for_more_than_its_exact_count():
    """Extrapolated as 1/√m, a 51-parameter Hutch++ baseline was told probes_max ≥ 6837
    (stranger19); from 3·P = 153 on its sketch spans the space and its trace is exact."""
    from flatcheck.workflows.gate.checks import check_baseline

    values = [10.0 + 6 * math.sin(3 * i) for i in range(10)]
    base = traced(values, estimator="hutchpp")
    base["matvecs"], base["details"]["parameters"] = 30, 51
    cfg = gate({"field": "trace.value", "max_increase": "20%"}, probes={"trace": {"estimator": "hutchpp",
                                                                               "probes_max": 30}})
    with pytest.raises(InputError, match=r"probes_max ≥ 153 \(the baseline has 30; Hutch\+\+ is exact from 3 "
                                         r"products a parameter, 51 parameters\)"):
        check_baseline(cfg, _baseline({"trace": base}, **META), META, seed=1)
    base["details"]["parameters"] = 5000  # a larger model: the count from the error's law
    with pytest.raises(InputError, match=r"probes_max ≥ \d+ \(the baseline has 30\)"):
        check_baseline(cfg, _baseline({"trace": base}, **META), META, seed=1)


@pytest.mark.parametrize("probe, details, draws, matvecs, option", [
    ("adaptive-sharpness", {"route": "monte-carlo: S_ρ", "rho": 0.0005, "loss": None}, 16, 108, "noise_draws"),
    ("spectrum", {"interval": "normal_start_variance_floor"}, 2, 200, "starts")])
def test_a_needed_count_is_said_in_the_effort_option_s_own_unit(probe, details, draws, matvecs, option):
    """The count was converted as if the option counted products (reviewer19): 16 Monte Carlo
    draws beside 108 products were said as 'noise_draws ≥ 2707 (the baseline has 108)', and a
    spectrum's 2 starts of 100 steps as 200. The option counts the draws themselves."""
    from flatcheck.workflows.gate.checks import check_baseline

    base = ProbeResult(probe, 10.0, 2.0, matvecs, 0.0, seed=0, details=details, dof=draws - 1).to_dict()
    cfg = gate({"field": f"{probe}.value", "max_increase": "20%"})
    with pytest.raises(InputError, match=rf"{option} ≥ (\d+) \(the baseline has {draws}\)") as exc:
        check_baseline(cfg, _baseline({probe: base}, **META), META, seed=1)
    need = int(re.search(rf"{option} ≥ (\d+)", str(exc.value)).group(1))
    # at that count of draws of the same spread, an unchanged model's interval fits the margin twice
    s = 2.0 * math.sqrt(draws / need)
    assert 2 * stats_t.ppf(0.975, need - 1) * math.sqrt(1 + 1.2**2) * s < 0.2 * 10.0


def _accepted(cfg_for, base_results) -> bool:
    from flatcheck.workflows.gate.checks import check_baseline

    try:
        check_baseline(cfg_for, _baseline(base_results, **META), META, seed=1)
    except InputError:
        return False
    return True


def test_an_unchanged_model_passes_the_tightest_accepted_unpaired_rule_in_97_5_percent_of_runs():
    """The check accepted a margin just over z·σ, where an unchanged model passes about half the
    time (stranger test: jacobian max_decrease 1% exit 1 at seeds 1, 2 and 3 of one model).
    Simulated unchanged models against the tightest 1%-step margin the check accepts: at least
    (1 + 0.95)/2 of them pass; at half that margin (what z·σ alone allowed) far fewer do."""
    import numpy as np

    mu, s = 40.0, 0.13
    base = {"jacobian": result(mu, s, probe="jacobian").to_dict()}
    x = next(p / 100 for p in range(1, 100)
             if _accepted(gate({"field": "jacobian.value", "max_decrease": f"{p / 100:.0%}"}), base))
    assert not _accepted(gate({"field": "jacobian.value", "max_decrease": f"{x - 0.01:.0%}"}), base)
    rng = np.random.default_rng(0)

    def pass_rate(fraction: float, runs: int = 2000) -> float:
        cfg = gate({"field": "jacobian.value", "max_decrease": f"{fraction:.2%}"})
        passed = 0
        for b, v in rng.normal(mu, s, size=(runs, 2)):
            (c,) = evaluate(cfg, {"jacobian": result(float(v), s, probe="jacobian")},
                            {"jacobian": result(float(b), s, probe="jacobian").to_dict()})
            passed += c.verdict == "pass"
        return passed / runs

    assert pass_rate(x) >= 0.975 - 3 * math.sqrt(0.975 * 0.025 / 2000)
    assert pass_rate(x / 2) < 0.8  # the old acceptance: a gate that flips on an unchanged model


def test_hutchpp_at_another_count_is_planned_unpaired_at_the_same_seed():
    """A Hutch++ baseline of 6 products gated at 48 with the same seed was taken as paired and
    accepted; the run then could not pair (other vectors at another count) and failed an
    unchanged model (exit 1). Refused up front now, and at its own count still paired."""
    from flatcheck.workflows.gate.checks import check_baseline

    values = [12.0, 16.3]  # ±2.15 over 1 degree of freedom, as the stranger's 6-product baseline
    base = {"trace": {**traced(values, estimator="hutchpp", offset=14.3), "matvecs": 6}}
    cfg = gate({"field": "trace.value", "max_increase": "50%"}, probes={"trace": {"estimator": "hutchpp",
                                                                                  "probes_max": 48}})
    with pytest.raises(InputError, match=r"unpaired \(hutchpp draws other vectors at another count \(baseline 6 "
                                         r"products, now 48\)\)"):
        check_baseline(cfg, _baseline(base, **META), META, seed=0)
    for count in (6, 7, 8):  # 7 and 8 take the same 6 products: k = 2 sketch columns, paired
        same = gate({"field": "trace.value", "max_increase": "50%"}, probes={"trace": {"estimator": "hutchpp",
                                                                                       "probes_max": count}})
        check_baseline(same, _baseline(base, **META), META, seed=0)


def test_a_run_at_fewer_probes_than_the_baseline_is_planned_with_its_own_error():
    """The check assumed the run as precise as the baseline: a Hutchinson baseline of 64
    probes gated at 8 (seed 1, unpaired) has σ = √(8·s_b² + slope²·s_b²), not √(1 + slope²)·s_b."""
    values = [10.0 + 0.3 * math.sin(3 * i) for i in range(64)]
    base = {"trace": {**traced(values), "matvecs": 64}}
    rule = {"field": "trace.value", "max_increase": "3%"}
    assert _accepted(gate(rule, probes={"trace": {"probes_max": 64}}), base)
    assert not _accepted(gate(rule, probes={"trace": {"probes_max": 8}}), base)


@pytest.mark.parametrize("probe, key, then, now", [("mls", "output", "softmax", "logits"),
                                                   ("jacobian", "output", "softmax", "logits"),
                                                   ("adaptive-sharpness", "rho", 0.05, 0.0005),
                                                   ("adaptive-sharpness", "loss", "sigmoid_mse", None)])
def test_a_baseline_of_another_quantity_of_the_probe_is_refused(probe, key, then, now):
    """mls and jacobian of the softmax against the logits' gave exit 1, '26.92 needs ≤ 0.0907'
    (stranger test): the options that define the quantity are compared as trace's matrix is."""
    from flatcheck.workflows.gate.checks import check_baseline

    base = {probe: result(0.09, None, probe=probe, **{key: then}).to_dict()}
    options = {} if now is None else {key: now}
    cfg = gate({"field": f"{probe}.value", "max_increase": "10%"}, probes={probe: options})
    with pytest.raises(InputError, match=rf"measured with {key} {then!r}, this gate's will be with .*not the same "
                                         rf"quantity \(set probes.{probe}.{key}: {then}\)"):
        check_baseline(cfg, _baseline(base, **META), META, seed=0)
    same = gate({"field": f"{probe}.value", "max_increase": "10%"}, probes={probe: {key: then}})
    check_baseline(same, _baseline(base, **META), META, seed=0)


def test_another_probes_result_under_the_trace_key_is_refused():
    """lmax's result copied into results.trace of a 2.4 report was compared unpaired "as schema
    < 2.0" and gave exit 1 (stranger test)."""
    from flatcheck.workflows.gate.baseline import Baseline
    from flatcheck.workflows.gate.checks import check_baseline

    lmax = {**result(13.6, None, probe="lmax", matrix="hessian", eigenvalues=[13.6]).to_dict(), "probe": "trace"}
    cfg = gate({"field": "trace.value", "max_increase": "10%"})
    for schema, refused in (("2.4", True), ("1.0", False)):
        base = Baseline({"trace": lmax}, {**META, "schema_version": schema}, "--baseline b.json")
        if refused:
            with pytest.raises(InputError, match="estimator None and no per-probe values.*another probe's result"):
                check_baseline(cfg, base, META, seed=0)
        else:
            check_baseline(cfg, base, META, seed=0)  # a 1.0 trace had no per-probe values


def test_rules_reach_layers_whose_names_hold_dots():
    """`trace.details.layers.features.0.value` was "not in the trace result": the path was split at
    every dot, so no nn.Sequential child (features.0, layer1.0.conv1) could be named (stranger test)."""
    layers = {"features.0": {"value": 3.0, "stderr": 0.1, "parameters": 10},
              "layer1.0.conv1": {"value": 5.0, "stderr": 0.2, "parameters": 20}, "head": {"value": 1.0, "stderr": 0.0}}
    res = {"trace": result(9.0, 0.3, layers=layers, per_parameter={"features.0.weight": {"value": 2.5}})}
    cfg = gate({"field": "trace.details.layers.features.0.value", "max": 4},
               {"field": "trace.details.layers.layer1.0.conv1", "min": 4},
               {"field": "trace.details.per_parameter.features.0.weight.value", "max": 3})
    checks = evaluate(cfg, res)
    assert [c.value for c in checks] == [3.0, 5.0, 2.5] and [c.verdict for c in checks] == ["pass"] * 3
    # a misspelt layer names the layers there are
    with pytest.raises(InputError, match=r"'trace.details.layers.features.1.value' is not in the trace result "
                                         r"\(trace.details.layers holds features.0, head, layer1.0.conv1\)"):
        evaluate(gate({"field": "trace.details.layers.features.1.value", "max": 4}), res)


def test_a_zero_margin_is_met_paired_and_refused_unpaired():
    from flatcheck.workflows.gate.checks import check_baseline

    values = [10.0 + 6 * math.sin(3 * i) for i in range(16)]
    cfg = gate({"field": "trace.value", "max_increase": 0})
    base = _baseline({"trace": traced(values)}, **META)
    check_baseline(cfg, base, META, seed=0)
    (c,) = evaluate(cfg, {"trace": traced(values)}, {"trace": traced(values)})
    assert c.verdict == "pass" and c.stderr is None  # every per-probe difference is 0
    with pytest.raises(InputError, match=r"cannot pass an unchanged model unpaired.*margin 0"):
        check_baseline(cfg, base, META, seed=1)
    zero = _baseline({"trace": result(0.0, 0.5).to_dict()}, **META)
    with pytest.raises(InputError, match="margin 0"):
        check_baseline(cfg, zero, META, seed=0)


def test_a_layer_rule_at_the_same_seed_is_refused_when_an_unchanged_model_could_not_pass():
    """Parts are compared unpaired: a rule an unchanged model could fail is refused up front."""
    from flatcheck.workflows.gate.checks import check_baseline

    layers = {"head": {"value": 2.1587, "stderr": 0.1535}}
    cfg = gate({"field": "trace.details.layers.head.value", "max_increase": "20%"})
    base = _baseline({"trace": {**traced([1.0, 2.0, 3.0]), "details": {**traced([1.0, 2.0, 3.0])["details"],
                                                                        "layers": layers}}}, **META)
    with pytest.raises(InputError, match="only a headline value is paired"):
        check_baseline(cfg, base, META, seed=0)


@pytest.mark.parametrize("edit, match", [
    (lambda r: r["details"].pop("offset"), "probe_values/offset"),
    (lambda r: r.update(value=r["value"] * 10), "edited or corrupted"),
    (lambda r: r["details"].update(probe_values=[2 * v for v in r["details"]["probe_values"]]), "edited or corrupted"),
    (lambda r: r["details"].update(probe_values=[1.0]), "probe_values/offset"),
])
def test_a_baseline_whose_probe_values_do_not_give_its_value_is_refused(edit, match):
    from flatcheck.workflows.gate.checks import check_baseline

    res = traced([10.0 + 6 * math.sin(3 * i) for i in range(16)])
    check_baseline(gate({"field": "trace.value", "max_increase": "20%"}), _baseline({"trace": res}, **META), META,
                   seed=0)
    edit(res)
    with pytest.raises(InputError, match=match):
        check_baseline(gate({"field": "trace.value", "max_increase": "20%"}), _baseline({"trace": res}, **META),
                       META, seed=0)


def test_a_paired_rule_is_planned_on_the_interval_its_verdict_takes():
    """Paired, an unchanged model's per-probe differences are −0.2·b_i, and the verdict's
    interval is their spread widened for their skewness (Gating.paired_stderr): a rule that
    interval cannot decide is refused before the run, as the run would straddle it. A products'
    variance floor is the value's alone: a floored baseline is planned on its values' spread.
    Unpaired, the widened stderr is what the comparison reads, and a too tight rule is refused."""
    import torch

    from flatcheck.linalg.trace import INTERVAL_FLOOR, INTERVAL_SKEW, skew_widening
    from flatcheck.workflows.gate.checks import check_baseline

    values = [40.0, 41.0, 42.0, 43.0, 44.0, 140.0]  # one long tail: skewed
    res = traced(values)
    spread = res["stderr"]
    widen = skew_widening(torch.tensor(values, dtype=torch.float64))
    assert widen > 1.2
    res["stderr"] = spread * widen
    res["details"].update(interval=INTERVAL_SKEW, spread_stderr=spread)
    b, z = res["value"], stats_t.ppf(0.975, len(values) - 1)
    # a 20 % rule: paired it needs z·0.2·s < 0.2·|b|, i.e. s < |b|/z; choose b between the two
    assert spread < abs(b) / z < spread * widen
    cfg = gate({"field": "trace.value", "max_increase": "20%"})
    with pytest.raises(InputError, match="cannot pass an unchanged model paired"):
        check_baseline(cfg, _baseline({"trace": res}, **META), META, seed=0)
    (same,) = evaluate(cfg, {"trace": res}, {"trace": res})
    assert same.verdict == "inconclusive" and same.stderr == pytest.approx(0.2 * spread * widen, rel=1e-12)
    with pytest.raises(InputError, match="cannot pass an unchanged model unpaired"):
        check_baseline(cfg, _baseline({"trace": res}, **META), META, seed=1)
    tight = [v / 3 + 28 for v in values]  # the same skewness, a third of the spread
    floored = traced(tight)
    b = floored["value"]
    known = 2 * abs(b) / Q  # the products' own stderr: an unchanged model's interval on it straddles
    floored["details"].update(interval=INTERVAL_FLOOR, known_stderr=known, spread_stderr=floored["stderr"])
    floored["stderr"], floored["dof"] = known, None
    check_baseline(cfg, _baseline({"trace": floored}, **META), META, seed=0)
    (same,) = evaluate(cfg, {"trace": floored}, {"trace": floored})
    assert same.verdict == "pass" and same.stderr == pytest.approx(0.2 * spread / 3 * widen, rel=1e-12)


@pytest.mark.parametrize("route", ["hvp", "tangent"])
def test_a_widened_trace_interval_is_read_from_its_values_and_an_edit_of_it_refused(route):
    """Where only vᵀHv exists the trace's stderr is its values' spread widened for their
    skewness: a baseline holding it is checked against that widening, not the bare spread."""
    from flatcheck.linalg.trace import INTERVAL_SKEW
    from flatcheck.probes.registry import ProbeContext, get_probe_class
    from flatcheck.workflows.gate.checks import check_baseline
    from tests.support.dense import make_case

    case = make_case("mlp")
    res = get_probe_class("trace")().run(ProbeContext(backend=case.backend("autograd"), seed=0),
                                         TraceOptions(probes_max=12, rtol=None, parts=False, route=route)).to_dict()
    details = res["details"]
    assert details["interval"] == INTERVAL_SKEW and res["stderr"] > details["spread_stderr"]
    cfg = gate({"field": "trace.value", "max_increase": "20%"})
    check_baseline(cfg, _baseline({"trace": res}, **META), META, seed=0)
    res["stderr"] = details["spread_stderr"]
    with pytest.raises(InputError, match="edited or corrupted"):
        check_baseline(cfg, _baseline({"trace": res}, **META), META, seed=0)


def test_a_baseline_of_another_matrix_is_refused():
    from flatcheck.workflows.gate.checks import check_baseline

    res = traced([1.0, 2.0, 3.0])
    cfg = gate({"field": "trace.value", "max_increase": "20%"}, probes={"trace": {"estimator": "exact"}})
    with pytest.raises(InputError, match="hessian matrix, this gate's of the ggn"):
        check_baseline(cfg, _baseline({"trace": res}, **META), META, seed=0)


def _next_minor() -> str:
    from flatcheck.report.result import SCHEMA_VERSION

    major, minor = SCHEMA_VERSION.split(".")
    return f"{major}.{int(minor) + 1}"


# None and a newer minor ("2.5" under 2.4, "2.10") passed silently (stranger test): every flatcheck
# report says its schema, and a newer minor may mean other things by the same keys
@pytest.mark.parametrize("version, ok", [("2.1", True), ("1.0", True), ("2.4", True), (None, False), ("9.9", False),
                                         (_next_minor(), False), ("2.10", False), (2.1, False), ("two", False)])
def test_baseline_schema_version(tmp_path, version, ok):
    from flatcheck.workflows.gate.baseline import load_baseline

    data = {"results": {"gini": {"value": 0.1}}}
    if version is not None:
        data["schema_version"] = version
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    if ok:
        load_baseline(path)
    else:
        with pytest.raises(ConfigError, match="schema_version"):
            load_baseline(path)


def test_min_above_max_and_rtol_are_refused_in_gate_files():
    with pytest.raises(ConfigError, match=r"rules\[0\]' has min 2 above max 1"):
        gate({"field": "trace.value", "min": 2, "max": 1})
    with pytest.raises(ConfigError, match="probes.trace.rtol"):
        gate({"field": "trace.value", "max": 1}, probes={"trace": {"rtol": 0.1}})
    # with Hutch++, the default's own value too (stranger19: the gate dropped it and passed)
    with pytest.raises(ConfigError, match="probes.trace' is invalid: rtol needs estimator hutchinson"):
        gate({"field": "trace.value", "max": 1}, probes={"trace": {"estimator": "hutchpp", "rtol": 0.05}})


def test_gate_file_with_a_duplicate_key_is_refused(tmp_path):
    from flatcheck.workflows.gate.config import load_gate_config

    path = write_gates(tmp_path, "rules:\n  - {field: gini.value, max: 1}\nrules:\n  - {field: gini.value, max: 2}\n")
    with pytest.raises(ConfigError, match="duplicate key 'rules'"):
        load_gate_config(path)


def test_summary_counts_one_outcome_per_rule():
    cfg = gate({"field": "trace.value", "max": 100}, {"field": "trace.value", "max": 11})
    res = {"trace": result(10.0, 1.0)}
    outcome = GateOutcome(evaluate(cfg, res), Report(meta={}, results=res), 0.95)
    assert "1 passed · 0 failed · 1 inconclusive (1 counted as failed) · 0 skipped" in markdown(outcome)
    assert sum(outcome.counts().values()) == 2


def test_non_finite_numbers_in_a_check_are_null_in_json():
    cfg = gate({"field": "trace.value", "max": 1})
    (c,) = evaluate(cfg, {"trace": {"value": "nan", "stderr": None}})
    assert c.verdict == "fail" and c.to_dict()["value"] is None
    json.dumps(c.to_dict(), allow_nan=False)


def test_rules_table_folds_long_names_instead_of_cutting_them():
    from rich.console import Console

    cfg = gate({"field": "gini.details.accuracy", "min": 0.9, "name": "a_rather_long_rule_name_for_accuracy"})
    res = {"gini": result(0.1, None, probe="gini", accuracy=0.95)}
    console = Console(width=80, record=True, file=io.StringIO())
    GateOutcome(evaluate(cfg, res), Report(meta={}, results=res), 0.95).render(console)
    text = console.export_text()
    first_column = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│"))
    assert "…" not in text and "a_rather_long_rule_name_for_accuracymin0.9" in first_column.replace(" ", "")


def test_a_paired_rerun_remeasures_the_baseline_when_it_can():
    """Paired over all 4 values the baseline holds, a 20% rule is inconclusive (t₃ is wide);
    doubling both sides decides it. Without the baseline's checkpoint, no rerun is spent."""
    import itertools

    stream = [10.0 + 20 * math.sin(1.7 * i) for i in range(64)]  # the i-th probe value of one seed
    cfg = gate({"field": "trace.value", "max_increase": "20%", "inconclusive": "rerun"}, max_reruns=4)
    grown = [1.05 * v for v in stream]  # 5% more: passes once decided

    def run(values, options):
        return {"trace": ProbeResult(**{k: v for k, v in traced(values[:options["trace"].probes_max]).items()
                                        if k in ("value", "stderr", "details", "dof", "seed", "probe")},
                                     matvecs=0, seconds=0.0)}

    calls = []

    def rerun_baseline(more):
        calls.append(more["trace"].probes_max)
        return run(stream, more)

    start = {"trace": TraceOptions(probes_max=4)}
    base = {"trace": traced(stream[:4])}
    (c,), _ = decide_with_reruns(cfg, run(grown, start), start, lambda more: run(grown, more), base,
                                 rerun_baseline=rerun_baseline)
    assert evaluate(cfg, run(grown, start), base)[0].verdict == "inconclusive"
    assert c.verdict == "pass" and c.paired == calls[-1] > 4 and "re-measured" in c.message
    spent = []
    (c,), _ = decide_with_reruns(cfg, run(grown, start), start, lambda more: spent.append(1) or run(grown, more),
                                 base, rerun_baseline=lambda more: None)
    assert c.verdict == "inconclusive" and c.failed and spent == [] and c.capped


def test_an_adaptive_sharpness_headline_follows_the_baselines_estimator():
    """Adaptive sharpness takes its headline from the Monte Carlo mean or the second-order form,
    whichever resolves it; a gate runs the baseline's estimator (method pinned where the gate file
    leaves it open) and refuses to compare two different estimators."""
    import dataclasses

    from flatcheck.config import RunConfig, probe_requests
    from flatcheck.errors import InputError
    from flatcheck.workflows.gate.run import follow_baseline

    rule = {"field": "adaptive-sharpness.value", "max_increase": "20%"}
    cfg = gate(rule, probes={"adaptive-sharpness": {"rho": 0.001}})
    run = RunConfig(checkpoint=CKPT, spec=SPEC, probes=probe_requests("adaptive-sharpness", {
        "adaptive-sharpness": dict(cfg.probes["adaptive-sharpness"])}))
    for route, method in (("monte-carlo", "mc"), ("second-order", "second-order")):
        base = _baseline({"adaptive-sharpness": {"value": 1.0, "stderr": 0.01, "details": {"route": route}}}, **META)
        (req,) = follow_baseline(run, cfg, base).probes
        assert req.options.method == method and req.options.rho == 0.001
    # the gate file's own choice stands
    fixed = gate(rule, probes={"adaptive-sharpness": {"method": "both"}})
    run_both = dataclasses.replace(run, probes=probe_requests("adaptive-sharpness", {"adaptive-sharpness": {}}))
    (req,) = follow_baseline(run_both, fixed, base).probes
    assert req.options.method == "both"
    now = {"adaptive-sharpness": result(1.0, 0.01, "adaptive-sharpness", route="second-order")}
    then = {"adaptive-sharpness": result(1.0, 0.01, "adaptive-sharpness", route="monte-carlo")}
    with pytest.raises(InputError, match="not the same estimate"):
        evaluate(fixed, now, then)
    assert verdicts(fixed, now, {"adaptive-sharpness": result(1.0, 0.01, "adaptive-sharpness",
                                                              route="second-order")}) == ["pass"]


def test_a_threshold_in_e_notation_without_a_dot_is_a_number():
    """PyYAML reads `max: 1e9` as the string '1e9' (YAML 1.1 wants 1.0e9); a threshold written
    so is still the number, and text that is not one is still refused."""
    import yaml

    from flatcheck.errors import InputError
    from flatcheck.workflows.gate.config import parse_gate_config

    raw = yaml.safe_load("rules:\n  - {field: trace.value, max: 1e9, min: -2e-3}\n")
    assert raw["rules"][0]["max"] == "1e9"  # what PyYAML gives
    limits = {b.kind: b.limit for b in parse_gate_config(raw).bounds}
    assert limits == {"max": 1e9, "min": -2e-3}
    for bad in ("abc", "nan", "inf"):
        with pytest.raises(InputError, match="finite number"):
            parse_gate_config({"rules": [{"field": "trace.value", "max": bad}]})


# ---------------------------------------------------------------- values good to a stated bound


def _lmax(value, residual, seed=0):
    """A converged lmax result: its Ritz value lies within `residual` of an eigenvalue."""
    return {"probe": "lmax", "value": value, "stderr": None, "resolved": True, "seed": seed, "matvecs": 40,
            "details": {"eigenvalues": [value], "residuals": [residual], "converged": [True], "tol": 1e-3}}


def test_an_lmax_that_moves_within_its_residual_does_not_fail_an_unchanged_model():
    """At another seed (another start vector) an unchanged model's λmax moves within its
    residual; a rule decided as if the value were exact failed it (13.664832 vs 13.664819)."""
    cfg = gate({"field": "lmax.value", "max_increase": "1%"})
    base = {"lmax": _lmax(13.664819, 0.004)}
    [check] = evaluate(cfg, {"lmax": _lmax(13.664832, 0.004, seed=1)}, base)
    assert check.verdict == "pass"
    lo, hi = check.ci
    assert math.isclose(hi - 13.664832, 0.004 + 1.01 * 0.004) and check.stderr is None
    assert "stated error bound ±0.00804" in check.message
    # a rise past the margin and both bounds fails, a rise inside them is inconclusive
    assert verdicts(cfg, {"lmax": _lmax(13.664819 * 1.01 + 0.02, 0.004)}, base) == ["fail"]
    assert verdicts(cfg, {"lmax": _lmax(13.664819 * 1.01 + 0.004, 0.004)}, base) == ["inconclusive"]


def test_a_rule_tighter_than_lmax_is_good_to_is_refused_before_the_run():
    from flatcheck.workflows.gate.checks import check_baseline

    base = _baseline({"lmax": _lmax(13.664819, 0.004)}, **META)
    with pytest.raises(InputError, match=r"rule .* cannot pass an unchanged model: the baseline's lmax.value = "
                                         r"13.6648 is good to ±0.004 .*margin 0; .*probes.lmax.tol"):
        check_baseline(gate({"field": "lmax.value", "max_increase": "0%"}), base, META, seed=0)
    # 2.01 · 0.004 = 0.00804 fits a 0.1 % margin (0.0137)
    check_baseline(gate({"field": "lmax.value", "max_increase": "0.1%"}), base, META, seed=0)


def test_a_fail_message_prints_value_and_threshold_apart():
    cfg = gate({"field": "gini.value", "max": 13.664819})
    [check] = evaluate(cfg, {"gini": {"probe": "gini", "value": 13.664832, "stderr": None, "details": {}}})
    assert check.verdict == "fail" and "13.664832 needs ≤ 13.664819" in check.message


def test_an_mls_estimate_is_compared_within_its_error_bound():
    cfg = gate({"field": "mls.value", "max": 1.0})
    mls = {"probe": "mls", "value": 0.999, "stderr": None, "details": {"mls": 0.999, "mls_error_bound": 0.01}}
    assert verdicts(cfg, {"mls": mls}) == ["inconclusive"]
    assert verdicts(cfg, {"mls": {**mls, "details": {"mls": 0.999, "mls_error_bound": 1e-4}}}) == ["pass"]
    # a detail's sibling bound, written with or without "details" (jacobian's spectral max)
    jac = {"probe": "jacobian", "value": 2.0, "stderr": 0.1,
           "details": {"spectral": {"max": 0.999, "max_error_bound": 0.01}}}
    for field in ("jacobian.spectral.max", "jacobian.details.spectral.max"):
        assert verdicts(gate({"field": field, "max": 1.0}), {"jacobian": jac}) == ["inconclusive"]


def test_a_decomposition_baseline_of_an_older_meaning_is_refused(tmp_path):
    """Before schema 2.5 decomposition's details.ggn_trace was the GGN trace over layer weights
    only (14.15 against Tr(G) 17.77 on a tanh MLP): a gate comparing it with today's Tr(G) would
    call the difference a change of the model. Exit 2, naming what changed."""
    from flatcheck.workflows.gate.baseline import check_superseded, load_baseline

    record = {"probe": "decomposition", "value": 14.15, "stderr": None,
              "details": {"route": "exact", "ggn_trace": 14.15}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": "2.4", "results": {"decomposition": record}}), encoding="utf-8")
    reads = {"decomposition": ["details.ggn_trace"]}
    with pytest.raises(InputError, match=r"results.decomposition: measured with schema 2.4, whose details.ggn_trace "
                                         r"is the GGN trace over layer weights only.*measure the baseline again"):
        check_superseded(load_baseline(path), reads)
    check_superseded(load_baseline(path), {"lmax": ["value"]})  # no rule reads it: left alone
    check_superseded(load_baseline(_report(tmp_path, {"decomposition": record})), reads)  # its own meaning


def test_a_hutchpp_baseline_with_the_biased_parts_of_before_is_refused(tmp_path):
    """Until schema 2.6 each of a Hutch++ trace's per-layer parts carried a cross term that
    cancelled in the total only (a stranger's MLP: the head 2.8 % high, the first layer 10 %
    low): a gate reading them against today's unbiased parts would call the fix a change of the
    model. Such a record is refused by name where a rule reads its parts; its total, a record
    without parts, and one of 2.6 are not (the cross term sums to zero over a probe's entries)."""
    from flatcheck.workflows.gate.baseline import check_superseded, load_baseline

    def report(extra, schema):
        out = tmp_path / "r.json"
        res = invoke("trace", CKPT, "--spec", SPEC, "--data", "digits", "--samples", "16", "--estimator", "hutchpp",
                     "--probes-max", "6", "--json", str(out), "-q", *extra)
        assert res.exit_code == 0, res.stderr
        doc = json.loads(out.read_text(encoding="utf-8"))
        out.write_text(json.dumps({**doc, "schema_version": schema}), encoding="utf-8")
        return out

    parts, total = {"trace": ["value", "details.layers.1.value"]}, {"trace": ["value"]}
    with pytest.raises(InputError, match=r"results.trace: measured with schema 2.5, whose Hutch\+\+ per-layer parts "
                                         r"were biased.*measure the baseline again"):
        check_superseded(load_baseline(report([], "2.5")), parts)
    check_superseded(load_baseline(report([], "2.5")), total)
    check_superseded(load_baseline(report([], "2.6")), parts)
    check_superseded(load_baseline(report(["--no-layers"], "2.5")), total)
    # without parts there is nothing biased: a part rule meets the partless-baseline message instead
    check_superseded(load_baseline(report(["--no-layers"], "2.5")), parts)


def test_a_spectrum_baseline_with_the_bare_spread_of_before_is_refused(tmp_path):
    """Until schema 2.6 spectrum's standard errors were the spread of its few starts (a
    stranger's MLP: Tr(H) 0.55 ± 0.3 against the truth 3.69); from 2.6 each is floored by a
    start's known variance. A gate weighing an old record's error beside a new one mixes the two
    intervals: refused by name where a rule reads it (by its details.interval, not the schema
    alone); a record of the floor is not."""
    from flatcheck.workflows.gate.baseline import check_superseded, load_baseline

    out = tmp_path / "r.json"
    res = invoke("spectrum", CKPT, "--spec", SPEC, "--data", "digits", "--samples", "16", "--starts", "2",
                 "--lanczos-steps", "5", "--json", str(out), "-q")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    reads = {"spectrum": ["details.trace.value"]}
    check_superseded(load_baseline(out), reads)
    old = {**doc["results"]["spectrum"], "details": {k: v for k, v in doc["results"]["spectrum"]["details"].items()
                                                       if k != "interval"}}
    out.write_text(json.dumps({**doc, "schema_version": "2.5", "results": {"spectrum": old}}), encoding="utf-8")
    with pytest.raises(InputError, match=r"results.spectrum: its standard errors are the spread of its starts alone, "
                                         r"measured before.*measure the baseline again"):
        check_superseded(load_baseline(out), reads)
    check_superseded(load_baseline(out), {"trace": ["value"]})  # no rule reads it: left alone


def test_a_bare_relative_bound_of_one_or_more_is_said_on_stderr(tmp_path):
    # a bare number is a fraction: 20 is 2000 %, which may be meant (150 %) but usually is not
    with pytest.warns(UserWarning, match=r"rules\[0\]\.max_increase 20 is read as 2000 %; write 20% for 20 percent"):
        cfg = parse_gate_config({"rules": [{"field": "trace.value", "max_increase": 20}]}, where="g.yaml")
    assert cfg.bounds[0].limit == 20
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fraction below 1, or a percentage, is said as meant
        parse_gate_config({"rules": [{"field": "trace.value", "max_increase": 0.2, "max_decrease": "150%"}]})
    # the gate's run says it (kit's warning line on stderr; in process pytest records it)
    path = write_gates(tmp_path, "rules:\n  - {field: gini.value, max_decrease: 1.5}\n")
    with pytest.warns(UserWarning) as said:
        res = invoke("gate", CKPT, "--spec", SPEC, "--data", "digits", "--config", path)
    assert res.exit_code == 2 and "--baseline" in res.stderr
    assert [str(w.message) for w in said if "is read as" in str(w.message)] == [
        f"{path}: rules[0].max_decrease 1.5 is read as 150 %; write 1.5% for 1.5 percent"]


@pytest.mark.parametrize("margin", ["20%", "2000%"])
def test_the_value_shown_carries_its_own_stderr_whatever_the_rules_margin(margin):
    from rich.console import Console

    from flatcheck.report.render import fmt, fmt_pm

    values = [6.5 + 3 * math.sin(3 * i) for i in range(16)]
    res, base = {"trace": traced(values)}, {"trace": traced(values)}
    cfg = gate({"field": "trace.value", "max_increase": margin})
    (c,) = evaluate(cfg, res, base)
    own = res["trace"]["stderr"]
    # paired, the comparison's error is margin·s of the baseline: not the value's
    assert c.paired == 16 and c.value_stderr == pytest.approx(own) and c.stderr != pytest.approx(own)
    console = Console(width=240, record=True, file=io.StringIO())
    outcome = GateOutcome([c], Report(meta={}, results=res), 0.95)
    outcome.render(console)
    text, md, xml = console.export_text(), markdown(outcome), junit_xml(outcome)
    shown = fmt_pm(c.value, own)
    lo, hi = c.ci[0] - c.threshold, c.ci[1] - c.threshold
    interval = f"value − threshold ∈ [{fmt(lo)}, {fmt(hi)}]"
    for out in (text, md, xml):
        assert shown in out and interval in out, out
    assert hi <= 0 and c.verdict == "pass"  # an unchanged model: the difference's interval lies below 0
    assert c.to_dict()["value_stderr"] == pytest.approx(own)


def test_a_paired_value_carries_its_results_widened_stderr_not_the_bare_spread():
    """A skewed Hutchinson trace states a stderr wider than its values' spread/√n (stranger20:
    4.303 ± 0.864, spread 0.695): paired or not, the value shown carries the stderr its result
    states, and a pairing over fewer draws than the run took the probe's rule on those draws."""
    import torch

    from flatcheck.linalg.trace import INTERVAL_SKEW, interval_stderr

    def skewed(values):
        res = traced(values)
        spread = res["stderr"]
        res["details"].update(interval=INTERVAL_SKEW, spread_stderr=spread)
        res["stderr"] = interval_stderr(spread, torch.tensor(values, dtype=torch.float64))
        return res, spread

    values = [0.5 + 0.2 * i + (6.0 if i % 7 == 0 else 0.0) for i in range(20)]
    res, spread = skewed(values)
    assert res["stderr"] > 1.1 * spread  # widened for its skewness
    cfg = gate({"field": "trace.value", "max_increase": "20%"})
    (c,) = evaluate(cfg, {"trace": res}, {"trace": skewed(values)[0]})
    assert c.paired == 20 and c.value_stderr == pytest.approx(res["stderr"], rel=1e-12)
    # the comparison's own error: the differences −0.2·b_i, their spread widened as the value's
    assert c.stderr == pytest.approx(0.2 * res["stderr"], rel=1e-12)
    (absolute,) = evaluate(gate({"field": "trace.value", "max": 100}), {"trace": res})
    assert absolute.value_stderr == pytest.approx(c.value_stderr, rel=1e-12)
    # a baseline of 12 draws pairs over the run's first 12: the value and its stderr are theirs
    (c12,) = evaluate(cfg, {"trace": res}, {"trace": skewed(values[:12])[0]})
    first, first_spread = skewed(values[:12])
    assert c12.paired == 12 and c12.value == pytest.approx(first["value"])
    assert c12.value_stderr == pytest.approx(first["stderr"], rel=1e-12) and first["stderr"] > 1.1 * first_spread
