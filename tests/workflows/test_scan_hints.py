"""A scan's records advise what a scan can do: it has no --spec or --model, and takes each
checkpoint's spec from the files beside it (STEM.yaml, spec.yaml) or a --trust-package."""

from __future__ import annotations

import json
import shutil

from tests.support.cli import ROOT, invoke

BUILD = "import torch\n\ndef build(num_classes=10):\n    return torch.nn.Sequential(torch.nn.Flatten(), " \
        "torch.nn.Linear(64, num_classes))\n"


def spec(arch: str, classes: int = 10) -> str:
    return f"source: python\narch: {arch}\nnum_classes: {classes}\ninput_size: [1, 8, 8]\nloss: cross_entropy\n"


def test_scan_errors_name_no_option_scan_lacks_and_say_how_a_scan_names_a_spec(tmp_path):
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / "localmods.py").write_text(BUILD)
    demo = ROOT / "demo" / "digits_cnn.safetensors"
    shutil.copy(demo, folder / "a_untrusted.safetensors")
    (folder / "a_untrusted.yaml").write_text(spec("localmods:build"))
    shutil.copy(demo, folder / "b_misfit.safetensors")  # the demo CNN's weights, under a 7-class head
    (folder / "b_misfit.yaml").write_text(spec("flatcheck.zoo.demo_cnn:DigitsCNN", classes=7))
    shutil.copy(demo, folder / "c_nospec.safetensors")
    out = tmp_path / "scan.jsonl"
    res = invoke("scan", "--checkpoints", folder, "--probes", "gini", "--data", "digits", "--samples", "8", "-q",
                 "--out", out)
    records = {r["model"]: r for r in map(json.loads, out.read_text().splitlines())}
    untrusted, misfit, nospec = records["a_untrusted"], records["b_misfit"], records["c_nospec"]
    assert untrusted["status"] == "error" and misfit["status"] == "error", res.stderr
    assert nospec["status"] == "skipped"
    for record in (untrusted, misfit, nospec):
        assert "--spec" not in record["error"].replace("embed-spec CKPT --spec", ""), record["error"]
        assert "--model" not in record["error"], record["error"]
    assert "pass --trust-package localmods if you trust it" in untrusted["error"]
    assert "(a b_misfit.yaml beside the checkpoint chooses another)" in misfit["error"]
    assert "c_nospec.yaml or spec.yaml beside it" in nospec["error"]
    # flatcheck scan indeed has no --spec: the hint named an option that does not exist
    assert invoke("scan", "--spec", "x.yaml", "--checkpoints", folder, "--out", out).exit_code == 2


def test_a_scan_record_names_the_settings_as_the_scan_s_flags():
    """A scan is a command: an error naming a setting says its flag, not the keyword measure()
    takes (reviewer19: scan records held str(exc), the Python wording)."""
    from flatcheck.errors import ConfigError, setting
    from flatcheck.workflows.scan import _one_line

    exc = ConfigError(f"{setting('route', 'tangent')} needs {setting('parts', False, flag='--no-layers')}")
    assert _one_line(exc) == "--route tangent needs --no-layers"
    assert _one_line(ValueError("plain")) == "ValueError: plain"
