"""A preset's figure column in the scan's table is there only when its probe ran: `--preset
mls-vs-sharpness --probes gini` showed an `mls.normalized_mls` column of dashes, which reads as
a measurement that failed."""

from __future__ import annotations

import shutil

from tests.support.cli import SPEC, copy_demo, invoke


def _scan(tmp_path, probes: str):
    ckpts = tmp_path / "ck"
    copy_demo(ckpts, "a.safetensors")
    shutil.copy(SPEC, ckpts / "spec.yaml")
    res = invoke("scan", "--checkpoints", ckpts, "--data", "digits", "--samples", "32", "--preset",
                 "mls-vs-sharpness", "--probes", probes, "--out", tmp_path / "scan.jsonl", "-q")
    assert res.exit_code == 0, res.stderr
    return res.stdout


def test_no_figure_column_for_a_probe_the_scan_did_not_run(tmp_path):
    out = _scan(tmp_path, "gini")
    assert "gini" in out and "mls.normalized_mls" not in out


def test_the_figure_column_stays_when_its_probe_ran(tmp_path):
    lines = _scan(tmp_path, "mls").splitlines()
    row = [line for line in lines if line.startswith("│ a ")]
    assert any("mls.normalized_mls" in line for line in lines)
    assert len(row) == 1 and "—" not in row[0]  # the column holds the measured value
