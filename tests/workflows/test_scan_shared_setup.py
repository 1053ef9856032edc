"""A refusal every model of a scan would meet alike is one exit 2 before any model runs; a
refusal of one model is that model's record, and the scan goes on (stranger21: a folder's
spec.yaml whose module needs --trust-package gave exit 1 and one error record per model, and
the table cut the remedy off each)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch
from rich.console import Console
from safetensors.torch import save_file

from flatcheck.commands import scan as scan_command
from flatcheck.workflows.scan import ScanSummary
from tests.support.cli import ROOT, bad, invoke

BUILD = "import torch\n\ndef build(num_classes=10):\n    return torch.nn.Sequential(torch.nn.Flatten(), " \
        "torch.nn.Linear(64, num_classes))\n"
SPEC = "source: python\narch: localmods:build\nnum_classes: 10\ninput_size: [1, 8, 8]\n"
RUN = ["--probes", "gini", "--data", "digits", "--samples", "8", "-q"]


def folder_of(tmp_path: Path, names: list[str], nan: str | None = None) -> Path:
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "localmods.py").write_text(BUILD)
    (folder / "spec.yaml").write_text(SPEC)
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 10)
    for name in names:
        weight = layer.weight.detach().clone()
        if name == nan:
            weight[0, 0] = float("nan")
        save_file({"1.weight": weight, "1.bias": layer.bias.detach().clone()}, str(folder / f"{name}.safetensors"))
    return folder


def records(out: Path) -> dict[str, dict]:
    return {r["model"]: r for r in map(json.loads, out.read_text().splitlines())}


def test_a_shared_spec_s_missing_trust_is_one_exit_2_before_any_model(tmp_path):
    folder = folder_of(tmp_path, ["a", "b", "c"])
    out = tmp_path / "scan.jsonl"
    err = bad(invoke("scan", "--checkpoints", folder, *RUN, "--out", out), "spec.yaml",
              "pass --trust-package localmods if you trust it", "all 3 models")
    assert "--spec" not in err  # a scan has no --spec to name the spec with
    assert not out.exists()  # no record of a model that never ran


def test_one_bad_model_under_a_shared_spec_is_its_own_record(tmp_path):
    folder = folder_of(tmp_path, ["a", "b_nan", "c"], nan="b_nan")
    out = tmp_path / "scan.jsonl"
    res = invoke("scan", "--checkpoints", folder, "--trust-package", "localmods", *RUN, "--out", out)
    assert res.exit_code == 1, res.stderr
    got = records(out)
    assert [got[m]["status"] for m in ("a", "b_nan", "c")] == ["ok", "error", "ok"]
    assert "non-finite" in got["b_nan"]["error"]


def test_a_spec_serving_some_models_only_stays_per_model(tmp_path):
    """Another model has a spec of its own that runs: the untrusted spec.yaml's models are
    records, and the scan measures the rest."""
    folder = folder_of(tmp_path, ["a", "b"])
    (folder / "z_demo.safetensors").write_bytes((ROOT / "demo" / "digits_cnn.safetensors").read_bytes())
    (folder / "z_demo.yaml").write_text((ROOT / "model_specs" / "demo_digits.yaml").read_text())
    out = tmp_path / "scan.jsonl"
    res = invoke("scan", "--checkpoints", folder, *RUN, "--out", out)
    assert res.exit_code == 1, res.stderr
    got = records(out)
    assert [got[m]["status"] for m in ("a", "b", "z_demo")] == ["error", "error", "ok"]
    assert "pass --trust-package localmods" in got["a"]["error"]


def test_the_summary_shows_each_failure_whole_once_for_the_models_it_shares(monkeypatch):
    """The status cell cut a message at 60 characters, before its remedy."""
    out = Console(file=io.StringIO(), width=100, color_system=None, force_terminal=False)
    monkeypatch.setattr(scan_command, "console", lambda *a, **k: out)
    long = "ck/spec.yaml, the spec found in the checkpoint's folder: field 'arch': refusing to import " \
           "'mymodels' from ck/mymodels.py: pass --trust-package mymodels if you trust it"
    rows = [{"model": m, "status": "error", "error": long, "seconds": 0.0, "results": {}} for m in ("a", "b")]
    rows.append({"model": "c", "status": "ok", "error": None, "seconds": 1.0, "results": {}})
    scan_command._print_summary(ScanSummary(out=Path("scan.jsonl"), total=3, already=0, records=rows))
    text = out.file.getvalue()
    assert f"error (a, b): {long}\n" in text
    assert text.count("--trust-package mymodels") == 1
