"""A baseline that holds none of the probes the relative rules compare is refused before the
run; one that lacks some of them skips those rules, says so on stderr, and every output's
verdict counts them. The baselines are made the way a user makes them: a CLI run's --json on
the demo checkpoint."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from flatcheck.errors import InputError
from flatcheck.report.result import ProbeResult, Report
from flatcheck.workflows.gate import GateOutcome, check_baseline, evaluate, load_baseline, parse_gate_config
from tests.support.cli import CKPT, SPEC, invoke

SAME = ("--spec", SPEC, "--data", "digits", "--samples", "64", "--batch-size", "64")


def report_of(command: str, path: Path, *extra) -> Path:
    res = invoke(command, CKPT, *SAME, "-q", "--json", path, *extra)
    assert res.exit_code == 0, res.stderr
    return path


def gate_run(folder: Path, rules: str, *extra):
    config = folder / "gates.yaml"
    config.write_text("rules:\n" + rules)
    return invoke("gate", CKPT, *SAME, "--config", config, *extra)


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def gini_report(tmp_path_factory) -> Path:
    return report_of("gini", tmp_path_factory.mktemp("gini") / "gini.json")


def test_a_spectrum_report_as_baseline_is_refused_before_the_run(tmp_path):
    """stranger17 D2: `--baseline` pointed at a spectrum report of the same model and data
    skipped every relative rule and the gate passed (exit 0, nothing on stderr)."""
    spectrum = report_of("spectrum", tmp_path / "sp.json", "--starts", "2", "--lanczos-steps", "6")
    rules = ("  - {field: gini.details.accuracy, min: 0.5}\n"
             "  - {field: trace.value, max_increase: 20%}\n  - {field: trace.value, max_decrease: 20%}\n"
             "  - {field: gini.value, max_increase: 20%}\n")
    res = gate_run(tmp_path, rules, "--baseline", spectrum)
    assert res.exit_code == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    *before, last = res.stderr.strip().splitlines()
    assert last == (f"error: --baseline {spectrum}: a report of spectrum only, with no trace or gini result: it "
                    "decides no relative rule (the gate file has 3); give the --json of a run of those probes "
                    "(the last release's gate run with this file), or --no-baseline to skip them")
    assert not any("done ·" in line for line in before), res.stderr  # refused before any probe ran
    # the workflow refuses it too (a caller of run_gate, not only the CLI)
    base = load_baseline(spectrum)
    gate = parse_gate_config({"rules": [{"field": "trace.value", "max_increase": "20%"}]})
    with pytest.raises(InputError, match="a report of spectrum only, with no trace result"):
        check_baseline(gate, base, base.meta, seed=0)


def test_a_baseline_lacking_some_probes_skips_their_rules_and_says_so(tmp_path, gini_report):
    """A probe added since the baseline (here jacobian, the baseline a gini run's report):
    its rules are skipped, a warning each on stderr, and the verdict of the table, the JSON,
    the JUnit suite and the Markdown heading counts them; the exit code stays 0."""
    rules = ("  - {field: gini.value, max_increase: 50%}\n"
             "  - {field: jacobian.value, max_increase: 20%}\n  - {field: jacobian.value, max_decrease: 20%}\n")
    out, junit, summary = tmp_path / "g.json", tmp_path / "g.xml", tmp_path / "g.md"
    # in process, a warning goes to pytest's recorder; on the command line it is a `flatcheck:
    # warning:` line on stderr, as every warning is (kit._warning_line)
    with pytest.warns(UserWarning) as said:
        res = gate_run(tmp_path, rules, "--baseline", gini_report, "--json", out, "--junit", junit,
                       "--summary", summary)
    assert res.exit_code == 0, res.stderr
    words = "PASSED · 2 of 3 relative rules skipped (baseline has no jacobian result)"
    assert f"gate {words} · confidence 0.95" in one_line(res.stdout)
    warned = [str(w.message) for w in said if str(w.message).startswith("rule ")]
    assert warned == [f"rule jacobian.value {kind} 20% is skipped: --baseline {gini_report} has no jacobian "
                      "result (a probe added since it was made); remake the baseline to decide it"
                      for kind in ("max_increase", "max_decrease")]
    gate = json.loads(out.read_text())["gate"]
    assert gate["passed"] is True and gate["verdict"] == words
    assert gate["skipped_relative"] == ["jacobian.value max_increase 20%", "jacobian.value max_decrease 20%"]
    assert [c["verdict"] for c in gate["checks"]] == ["pass", "skipped", "skipped"]
    root = ET.parse(junit).getroot()
    assert root.find(".//testsuite/properties/property[@name='verdict']").get("value") == words
    assert summary.read_text().startswith("### flatcheck gate: ⚠️ passed, 2 of 3 relative rules skipped "
                                          "(baseline has no jacobian result) · ")


def test_a_failing_gate_with_skipped_rules_still_exits_1(tmp_path, gini_report):
    rules = ("  - {field: gini.details.accuracy, min: 1.01}\n  - {field: gini.value, max_increase: 50%}\n"
             "  - {field: jacobian.value, max_increase: 20%}\n")
    res = gate_run(tmp_path, rules, "--baseline", gini_report, "-q")
    assert res.exit_code == 1, res.stderr
    assert "gate FAILED · 1 of 2 relative rules skipped (baseline has no jacobian result)" in one_line(res.stdout)


def test_a_baseline_holding_every_probe_gives_a_plain_verdict(tmp_path, gini_report):
    res = gate_run(tmp_path, "  - {field: gini.value, max_increase: 50%}\n", "--baseline", gini_report,
                   "--json", tmp_path / "g.json")
    assert res.exit_code == 0, res.stderr
    assert "gate PASSED · confidence 0.95" in one_line(res.stdout)
    gate = json.loads((tmp_path / "g.json").read_text())["gate"]
    assert gate["verdict"] == "PASSED" and gate["skipped_relative"] == []


def test_no_baseline_counts_the_relative_rules_it_skips():
    gate = parse_gate_config({"rules": [{"field": "gini.value", "max": 1}, {"field": "gini.value",
                                                                           "max_increase": "5%"}]})
    res = {"gini": ProbeResult(probe="gini", value=0.1, stderr=None, matvecs=0, seconds=0.0)}
    outcome = GateOutcome(evaluate(gate, res, no_baseline=True), Report(meta={}, results=res), 0.95)
    assert outcome.verdict == "PASSED · 1 of 1 relative rule skipped (--no-baseline)" and outcome.exit_code == 0
