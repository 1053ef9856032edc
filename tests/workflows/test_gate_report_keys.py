"""Every key a gate writes under `gate` in its JSON report is named in the JSON guide: a CI
step that reads the report has the page to tell it what each key holds."""

from __future__ import annotations

import re
from pathlib import Path

from flatcheck.report.result import ProbeResult, Report
from flatcheck.workflows.gate import GateOutcome, evaluate, parse_gate_config

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "json.md"


def _gate_section() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    match = re.search(r"^## A gate's report\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"{GUIDE.name} has no section '## A gate's report'"
    return match.group(1)


def test_every_gate_key_is_documented():
    gate = parse_gate_config({"rules": [{"field": "gini.value", "max": 1},
                                        {"field": "gini.value", "max_increase": "5%"}]})
    res = {"gini": ProbeResult(probe="gini", value=0.1, stderr=None, matvecs=0, seconds=0.0)}
    outcome = GateOutcome(evaluate(gate, res, no_baseline=True), Report(meta={}, results=res), 0.95)
    written = outcome.to_dict()["gate"]
    assert written["skipped_relative"] == ["gini.value max_increase 5%"]  # the keys hold something to document
    section = _gate_section()
    named = set(re.findall(r"`([a-z_]+)`", section)) | set(re.findall(r"`gate\.([a-z_]+)`", section))
    missing = sorted(set(written) - named)
    assert not missing, f"{GUIDE.name} does not document gate keys {missing}"
    check_keys = {k for c in written["checks"] for k in c}
    missing = sorted(check_keys - named)
    assert not missing, f"{GUIDE.name} does not document the checks' keys {missing}"
