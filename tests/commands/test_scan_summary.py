"""The scan's summary table shows each headline the way a probe's own table does: a ± on few
degrees of freedom is marked rough there too (report.render.fmt_result decides it)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from flatcheck.commands import scan as scan_command
from flatcheck.report.render import ROUGH_DOF
from flatcheck.workflows.scan import ScanSummary


def summary_text(monkeypatch, results: dict) -> str:
    out = Console(file=io.StringIO(), width=200, color_system=None, force_terminal=False)
    monkeypatch.setattr(scan_command, "console", lambda *a, **k: out)
    record = {"model": "test_vit", "status": "ok", "error": None, "seconds": 1.0, "results": results}
    scan_command._print_summary(ScanSummary(out=Path("scan.jsonl"), total=1, already=0, records=[record]))
    return " ".join(out.file.getvalue().split())


@pytest.mark.parametrize("dof, rough", [(1, True), (ROUGH_DOF - 1, True), (ROUGH_DOF, False), (None, False)])
def test_a_stderr_on_few_degrees_of_freedom_is_marked_rough_in_the_scan_summary(monkeypatch, dof, rough):
    """spectrum's default 2 starts give a ± on dof 1; the scan's table printed it as plainly as
    one on dof 100, while the probe's own table marked it."""
    spectrum = {"value": 1.187, "stderr": 0.19, "dof": dof, "resolved": True, "error_bound": None}
    text = summary_text(monkeypatch, {"spectrum": spectrum})
    assert "1.187 ± 0.19" in text
    assert (f"(rough ±: dof {dof})" in text) == rough, text
