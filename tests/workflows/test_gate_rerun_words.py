"""A rule decided after `inconclusive: rerun` says so where a reader looks: the table's note and
the Markdown summary, not only the JSON's `reruns`."""

from __future__ import annotations

import math

from rich.console import Console

from flatcheck.probes.trace import TraceOptions
from flatcheck.report.gate_formats import markdown, rules_table
from flatcheck.report.result import ProbeResult, Report
from flatcheck.workflows.gate.config import parse_gate_config
from flatcheck.workflows.gate.run import GateOutcome, decide_with_reruns


def test_a_rule_decided_after_a_rerun_says_so_in_the_table_and_the_summary():
    """The JSON had reruns: 1, but the table's note and the Markdown summary read as a first
    run's verdict, and the summary counted 0 inconclusive (stranger18)."""
    def traced(n):  # stderr ∝ 1/√probes: inconclusive at 4, decided at 8
        return {"trace": ProbeResult(probe="trace", value=10.0, stderr=4.0 / math.sqrt(n), matvecs=n, seconds=0.0)}

    cfg = parse_gate_config({"rules": [{"field": "trace.value", "max": 13.0, "inconclusive": "rerun"},
                                       {"field": "trace.value", "max": 100.0}]})
    checks, results = decide_with_reruns(cfg, traced(4), {"trace": TraceOptions(probes_max=4)},
                                         lambda more: traced(more["trace"].probes_max))
    assert [c.verdict for c in checks] == ["pass", "pass"] and checks[0].reruns == 1
    assert all("trace rerun 1× (probes_max 8) after an inconclusive rule" in c.message for c in checks)
    outcome = GateOutcome(checks, Report(results=results, meta={}), 0.95)
    console = Console(width=300, record=True)
    console.print(rules_table(outcome))
    assert "rerun 1× (probes_max 8)" in console.export_text()
    assert "rerun 1× (probes_max 8)" in markdown(outcome)
