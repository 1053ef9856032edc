"""The distributed backend under a real torchrun with 2 gloo processes equals one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flatcheck.cli import app
from tests.support.proc import HANG_GUARD

pytestmark = pytest.mark.realsize

ROOT = Path(__file__).resolve().parents[2]
ARGS = [str(ROOT / "demo" / "digits_cnn.safetensors"), "--spec", str(ROOT / "model_specs" / "demo_digits.yaml"),
        "--samples", "40", "--batch-size", "8", "--dtype", "float64", "--probes", "trace,lmax,gini",
        "-o", "trace.probes_max=6", "-o", "lmax.k=2", "-o", "lmax.max_iter=16", "--quiet"]
EXACT = ["trace", *ARGS[:7], "--estimator", "exact", "--quiet"]


def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _torchrun(args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "flatcheck", *args, "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def _single(args: list[str]) -> dict:
    result = CliRunner().invoke(app, [*args, "--json", "-"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("inner", ["distributed", "distributed:func"])
def test_two_ranks_equal_one_process(tmp_path, inner):
    dist = _torchrun(["probe", *ARGS, "--backend", inner], tmp_path / "d.json")
    # the same backend in one process: the func backend forms each product Hv, and so floors
    # Hutchinson's stderr by their own variance where the autograd backend streams vᵀHv
    single = _single(["probe", *ARGS, *(["--backend", "func"] if inner.endswith(":func") else [])])
    assert dist["backend"] == inner
    for name, r in single["results"].items():
        got = dist["results"][name]
        # 5 batches split 3/2 over the ranks: only the float64 summation order differs
        assert got["value"] == pytest.approx(r["value"], rel=1e-10), name
        assert got["matvecs"] == r["matvecs"]
        if r["stderr"] is not None:
            assert got["stderr"] == pytest.approx(r["stderr"], rel=1e-8)


def test_exact_ggn_trace_is_sharded_and_summed(tmp_path):
    dist = _torchrun([*EXACT, "--backend", "distributed"], tmp_path / "e.json")
    single = _single(EXACT)
    assert dist["results"]["trace"]["value"] == pytest.approx(single["results"]["trace"]["value"], rel=1e-12)
    layers_d, layers_s = dist["results"]["trace"]["details"]["layers"], single["results"]["trace"]["details"]["layers"]
    for name in layers_s:
        assert layers_d[name]["value"] == pytest.approx(layers_s[name]["value"], rel=1e-12, abs=1e-15)


def test_distributed_without_launcher_is_bad_input(monkeypatch):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    result = CliRunner().invoke(app, ["trace", *ARGS[:7], "--backend", "distributed", "--probes-max", "2", "--quiet"])
    assert result.exit_code == 2 and "torchrun" in result.stderr


def test_trace_total_by_forward_tangents_is_sharded_and_summed(tmp_path):
    """`--no-layers` takes vᵀHv by forward tangents on each rank; the sums are all-reduced."""
    args = ["trace", *ARGS[:9], "--probes-max", "6", "--no-layers", "--route", "tangent", "--quiet"]
    dist = _torchrun([*args, "--backend", "distributed"], tmp_path / "t.json")
    single = _single(args)
    got, want = dist["results"]["trace"], single["results"]["trace"]
    assert "forward tangents" in got["notes"] and "forward tangents" in want["notes"]
    assert got["value"] == pytest.approx(want["value"], rel=1e-10)
    assert got["stderr"] == pytest.approx(want["stderr"], rel=1e-8)
