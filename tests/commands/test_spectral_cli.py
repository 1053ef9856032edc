"""`flatcheck lmax / spectrum / rank` end to end on the demo checkpoint, through CliRunner.

Runs are kept small (64 samples in one batch, a handful of Lanczos steps); every bad flag
must exit 2 with a single "error:" line on stderr and nothing on stdout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from typer.testing import CliRunner

from flatcheck.cli import app

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "demo" / "digits_cnn.safetensors"
SPEC = ROOT / "model_specs" / "demo_digits.yaml"
DEMO = [str(CKPT), "--spec", str(SPEC), "--data", "digits", "--samples", "64", "--batch-size", "64"]
ENV = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "COLUMNS": "200", "FLATCHECK_DATA_ROOT": None}
try:  # click < 8.2 mixes stdout and stderr unless told not to; 8.2 dropped the argument
    RUNNER = CliRunner(mix_stderr=False, env=ENV)  # type: ignore[call-arg]
except TypeError:
    RUNNER = CliRunner(env=ENV)


def invoke(command: str, *args: str):
    return RUNNER.invoke(app, [command, *DEMO, *[str(a) for a in args]])


def as_json(result) -> dict:
    assert result.exit_code == 0, f"exit {result.exit_code}\nstderr: {result.stderr}\nstdout: {result.stdout}"
    return json.loads(result.stdout)


def test_lmax_json():
    d = as_json(invoke("lmax", "--k", "2", "--dtype", "float64", "--json", "-"))
    r = d["results"]["lmax"]
    det = r["details"]
    assert r["label"] == "λmax(H)" and r["value"] == det["eigenvalues"][0] and r["stderr"] is None
    # a Ritz value is good to its certified bound (r²/δ, or its residual), not exact
    assert r["exact"] is False and r["error_bound"] == det["error_bounds"][0] > 0
    assert det["eigenvalues"][0] >= det["eigenvalues"][1] and det["converged"] == [True, True]
    assert all(b <= 1e-6 * abs(v) for b, v in zip(det["error_bounds"], det["eigenvalues"]))
    assert det["bn_mode"] == "eval"
    # --k 2: a block of k + 1 = 3 starts, three products a step, or one where a step is likely the last
    assert det["starts"] == 3
    assert det["iterations"] < r["matvecs"] <= 3 * det["iterations"]


def test_lmax_power_ggn_train_mode_table():
    result = invoke("lmax", "--k", "1", "--method", "power", "--matrix", "ggn", "--bn-mode", "train",
                    "--max-iter", "30", "--tol", "1e-3")
    assert result.exit_code == 0, result.stderr
    assert "λmax(G)" in result.stdout and "bn train" in result.stdout


@pytest.mark.workflow
def test_spectrum_json_and_plot(tmp_path):
    png = tmp_path / "esd.png"
    d = as_json(invoke("spectrum", "--lanczos-steps", "6", "--starts", "2", "--plot", png, "--json", "-", "-q"))
    r = d["results"]["spectrum"]["details"]
    assert len(r["per_start"]) == 2 and all(len(p["nodes"]) == len(p["weights"]) == 6 for p in r["per_start"])
    assert len(r["density"]["grid"]) == len(r["density"]["values"]) >= 1024
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and r["plot"] == str(png)


def test_spectrum_sigma_and_ggn():
    d = as_json(invoke("spectrum", "--matrix", "ggn", "--lanczos-steps", "4", "--starts", "2", "--sigma", "0.05",
                       "--json", "-"))
    r = d["results"]["spectrum"]
    assert r["details"]["density"]["sigma"] == 0.05 and r["label"] == "‖G‖_F (SLQ)" and r["stderr"] > 0


def test_rank_json_warns_on_small_sample():
    d = as_json(invoke("rank", "--lanczos-steps", "6", "--starts", "2", "--json", "-"))
    r = d["results"]["rank"]
    det = r["details"]
    assert 0 <= r["value"] <= 1 and r["stderr"] is not None
    # demo: 64 samples × 9 < P, so the samples force D ≥ 1 − 576/P
    assert det["batch_bound"]["rank"] == 64 * 9 and any("samples alone" in w for w in det["warnings"])
    assert det["paper_bound"]["neurons"] == 16 + 32 + 32 + 10 and det["paper_bound"]["d_x"] == 64


@pytest.mark.parametrize("command,args,flag", [
    ("lmax", ["--k", "0"], "--k"),
    ("lmax", ["--method", "foo"], "method"),
    ("lmax", ["--tol", "0"], "--tol"),
    ("lmax", ["--matrix", "fisher"], "matrix"),
    ("spectrum", ["--lanczos-steps", "1"], "--lanczos-steps"),
    ("spectrum", ["--starts", "1"], "--starts"),
    ("spectrum", ["--sigma", "wide"], "--sigma"),
    ("spectrum", ["--plot", "esd.pdf"], "--plot"),
    ("rank", ["--lanczos-steps", "1"], "--lanczos-steps"),
])
def test_bad_flags_exit_2_with_one_line(command, args, flag):
    result = invoke(command, *args)
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and flag in err
    assert result.stdout == ""
