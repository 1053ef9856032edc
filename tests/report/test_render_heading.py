"""A result table's heading (model, data, loss, device …) is a line as wide as the console, not
a table title: rich wraps a title at the table's own width (~60 columns for one probe), so a
200-column CI log showed the heading broken over two lines."""

from __future__ import annotations

from rich.console import Console

from flatcheck.report.render import header, render
from flatcheck.report.result import ProbeResult, Report
from tests.report.test_output_text import META, printed

GINI = ProbeResult(probe="gini", value=0.74, stderr=None, matvecs=0, seconds=0.02, seed=0, label="mean 1−‖p‖²")


def heading_text(report: Report) -> str:
    console = Console(width=400, color_system=None)
    with console.capture() as got:
        console.print(header(report), highlight=False)
    return got.get().strip()


def test_the_heading_takes_the_console_s_width_not_the_table_s():
    report = Report(meta=META, results={"gini": GINI})
    wanted = heading_text(report)
    assert len(wanted) > 80  # longer than the one-probe table is wide
    lines = printed(lambda c: render(report, c), width=200).splitlines()
    assert lines[0].strip() == wanted
    assert max(len(line) for line in lines[1:]) < len(wanted)  # the table below stays narrower


def test_the_heading_still_folds_at_a_narrow_console():
    report = Report(meta=META, results={"gini": GINI})
    text = printed(lambda c: render(report, c), width=60)
    assert max(map(len, text.splitlines())) <= 60
    assert "".join(heading_text(report).split()) in "".join(text.split())


def test_a_gate_s_verdict_line_is_one_line_above_its_table():
    from flatcheck.workflows.gate.config import parse_gate_config
    from flatcheck.workflows.gate.run import GateOutcome
    from flatcheck.workflows.gate.verdicts import evaluate

    cfg = parse_gate_config({"rules": [{"field": "gini.value", "max": 0.9},
                                       {"field": "gini.value", "max_increase": "10%"},
                                       {"field": "gini.value", "max_decrease": "10%"}]})
    checks = evaluate(cfg, {"gini": GINI}, None, no_baseline=True)
    outcome = GateOutcome(checks, Report(meta=META, results={"gini": GINI}), 0.95)
    first = printed(outcome.render, width=200).splitlines()[0]
    assert first.startswith("gate PASSED · 2 of 2 relative rules skipped (--no-baseline)") and first.endswith("confidence 0.95")
