"""The command line, end to end on the demo checkpoint, through Typer's CliRunner.

Every probe run is kept small (64 samples, batches of 32, at most 8 Hutchinson probes);
the expensive runs are shared through module-scoped fixtures.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from flatcheck import __version__
from tests.support.cli import CKPT, ROOT, SMALL, SPEC, as_json, assert_only_tables, invoke, ok, strip_volatile
from tests.support.proc import HANG_GUARD

HEAD_PARAMS = 32 * 10 + 10  # DigitsCNN.head = Linear(32, 10)


def trace(*extra: str, ckpt: Path = CKPT, spec: Path = SPEC):
    return invoke("trace", ckpt, "--spec", spec, "--data", "digits", *SMALL, *extra)


# ---------------------------------------------------------------- shared runs


@pytest.fixture(scope="module")
def exact_eval() -> dict:
    return as_json(trace("--estimator", "exact", "--json", "-"))


@pytest.fixture(scope="module")
def hutch_seed0() -> dict:
    return as_json(trace("--probes-max", "8", "--seed", "0", "--json", "-"))


@pytest.fixture(scope="module")
def exact_head_eval() -> dict:
    return as_json(trace("--estimator", "exact", "--params", "head.*", "--json", "-"))


@pytest.fixture(scope="module")
def hutch_to_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("json_out")
    out = folder / "out.json"
    result = trace("--probes-max", "8", "--seed", "0", "--json", out)
    return result, folder, out


# ---------------------------------------------------------------- table output


def test_trace_prints_table_to_stdout_only():
    result = trace("--probes-max", "8", "--params", "head.*")
    ok(result)
    assert "Tr(H)" in result.stdout
    assert "trace" in result.stdout and "head" in result.stdout  # summary row and per-layer table
    assert_only_tables(result.stdout)
    assert "error" not in result.stderr.lower()
    assert "{" not in result.stdout  # no JSON unless asked for


def test_no_layers_prints_one_table():
    result = trace("--probes-max", "8", "--params", "head.*", "--no-layers", "--quiet")
    ok(result)
    assert "Tr(H)" in result.stdout and "per layer" not in result.stdout
    assert_only_tables(result.stdout)
    assert result.stderr == ""


# ---------------------------------------------------------------- JSON schema


def test_json_schema(exact_eval):
    d = exact_eval
    for key in ("schema_version", "flatcheck_version", "torch_version", "device", "dtype", "seed", "bn_mode",
                "model", "checkpoint", "data", "results"):
        assert key in d, key
    assert d["flatcheck_version"] == __version__
    import torch

    assert d["torch_version"] == torch.__version__
    assert d["device"] == "cpu"
    assert d["dtype"] == "float32"
    assert d["seed"] == 0
    assert d["bn_mode"] == "eval"
    assert d["model"]["spec_sha256"] == hashlib.sha256(SPEC.read_bytes()).hexdigest()
    assert d["checkpoint"]["sha256"] == hashlib.sha256(CKPT.read_bytes()).hexdigest()
    assert d["checkpoint"]["format"] == "safetensors"
    assert d["data"]["name"] == "digits"
    assert d["data"]["split"] == "train"
    assert d["data"]["samples"] == 64
    assert d["data"]["batch_size"] == 32
    assert d["model"]["probed_parameters"] == d["model"]["parameters"] == 14410
    assert list(d["results"]) == ["trace"]
    r = d["results"]["trace"]
    for key in ("value", "stderr", "matvecs", "seconds", "seed"):
        assert key in r, key
    assert isinstance(r["value"], float) and math.isfinite(r["value"])
    assert r["seconds"] >= 0


def test_exact_defaults_to_ggn_with_no_stderr(exact_eval):
    r = exact_eval["results"]["trace"]
    assert r["label"] == "Tr(G)"
    assert r["details"]["matrix"] == "ggn"
    assert r["details"]["estimator"] == "exact"
    assert r["stderr"] is None
    assert r["exact"] is True
    assert r["matvecs"] == 0
    assert r["seed"] is None
    assert r["value"] > 0  # a GGN is positive semi-definite, and the demo is not at zero loss


def test_exact_layers_sum_to_total(exact_eval):
    r = exact_eval["results"]["trace"]
    layers = r["details"]["layers"]
    assert set(layers) == {"features.0", "features.1", "features.3", "features.6", "head"}
    assert math.isclose(sum(p["value"] for p in layers.values()), r["value"], rel_tol=1e-9)
    assert sum(p["parameters"] for p in layers.values()) == 14410
    assert layers["head"]["parameters"] == HEAD_PARAMS


def test_hutchinson_json(hutch_seed0):
    r = hutch_seed0["results"]["trace"]
    assert r["label"] == "Tr(H)"
    assert r["details"]["estimator"] == "hutchinson"
    assert r["details"]["matrix"] == "hessian"
    assert r["exact"] is False
    assert r["stderr"] is not None and r["stderr"] > 0
    assert r["matvecs"] == r["details"]["probes"] == 8
    assert r["seed"] == 0
    layers = r["details"]["layers"]
    assert len(layers) == 5
    assert all(p["stderr"] is not None and p["stderr"] >= 0 for p in layers.values())
    # float32 run: see test_hutchinson_layers_sum_to_total_float32 for the 1e-9 contract
    assert math.isclose(sum(p["value"] for p in layers.values()), r["value"], rel_tol=1e-6)


def test_hutchinson_layers_sum_to_total_float32(hutch_seed0):
    r = hutch_seed0["results"]["trace"]
    parts = sum(p["value"] for p in r["details"]["layers"].values())
    assert math.isclose(parts, r["value"], rel_tol=1e-9)


@pytest.mark.parametrize("estimator", ["hutchinson", "hutchpp"])
def test_stochastic_layers_sum_to_total_float64(estimator):
    d = as_json(trace("--estimator", estimator, "--probes-max", "8", "--dtype", "float64",
                      "--params", "head.*,features.6.*", "--json", "-"))
    assert d["dtype"] == "float64"
    r = d["results"]["trace"]
    assert r["stderr"] is not None and r["stderr"] > 0
    assert r["matvecs"] == (8 if estimator == "hutchinson" else 6)
    layers = r["details"]["layers"]
    assert list(layers) == ["features.6", "head"]
    assert math.isclose(sum(p["value"] for p in layers.values()), r["value"], rel_tol=1e-9)


def test_json_dash_puts_nothing_else_on_stdout(hutch_seed0):
    # json.loads in the fixture already failed if a table or progress had been printed
    assert "results" in hutch_seed0


# ---------------------------------------------------------------- JSON to a file


def test_json_file_is_written_atomically_and_table_still_printed(hutch_to_file):
    result, folder, out = hutch_to_file
    ok(result)
    assert "Tr(H)" in result.stdout
    assert_only_tables(result.stdout)
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["results"]["trace"]["matvecs"] == 8
    assert sorted(p.name for p in folder.iterdir()) == ["out.json"]  # no temp file left behind


# ---------------------------------------------------------------- seeds


def test_same_seed_gives_identical_report(hutch_seed0, hutch_to_file):
    _, _, out = hutch_to_file
    from_file = json.loads(out.read_text(encoding="utf-8"))
    assert strip_volatile(from_file) == strip_volatile(hutch_seed0)
    assert from_file["results"]["trace"]["value"] == hutch_seed0["results"]["trace"]["value"]


def test_different_seed_gives_different_hutchinson_value(hutch_seed0):
    other = as_json(trace("--probes-max", "8", "--seed", "1", "--json", "-"))
    assert other["seed"] == 1 and other["results"]["trace"]["seed"] == 1
    assert other["results"]["trace"]["value"] != hutch_seed0["results"]["trace"]["value"]
    # the data and the model are the same; only the random probes differ
    assert other["data"]["fingerprint"] == hutch_seed0["data"]["fingerprint"]


# ---------------------------------------------------------------- estimator / matrix


def test_exact_with_hessian_is_refused():
    result = trace("--estimator", "exact", "--matrix", "hessian")
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert err.startswith("error:") and "\n" not in err
    assert "--matrix" in err


def test_exact_with_explicit_ggn_matches_default(exact_eval):
    d = as_json(trace("--estimator", "exact", "--matrix", "ggn", "--json", "-"))
    assert d["results"]["trace"]["value"] == exact_eval["results"]["trace"]["value"]


# ---------------------------------------------------------------- BatchNorm mode


def test_bn_mode_train_changes_exact_ggn(exact_head_eval):
    # head only: with batch statistics every logit of a batch depends on every sample, which
    # makes the exact GGN of the whole network ~10x slower in train mode; the head's inputs
    # still pass through the BatchNorm, so its GGN trace changes with the mode
    d = as_json(trace("--estimator", "exact", "--bn-mode", "train", "--params", "head.*", "--json", "-"))
    assert d["bn_mode"] == "train"
    assert exact_head_eval["bn_mode"] == "eval"
    train, evaluation = d["results"]["trace"]["value"], exact_head_eval["results"]["trace"]["value"]
    assert math.isfinite(train) and train > 0
    assert not math.isclose(train, evaluation, rel_tol=1e-6)


# ---------------------------------------------------------------- parameter subsets


def test_params_restricts_to_head(exact_head_eval, exact_eval):
    d = exact_head_eval
    assert d["model"]["probed_parameters"] == HEAD_PARAMS
    assert d["model"]["parameters"] == 14410
    assert d["model"]["params_filter"] == ["head.*"]
    r = d["results"]["trace"]
    assert list(r["details"]["layers"]) == ["head"]
    assert r["details"]["parameters"] == HEAD_PARAMS
    # the exact GGN's diagonal block for the head is the head's part of the full trace
    full_head = exact_eval["results"]["trace"]["details"]["layers"]["head"]["value"]
    assert math.isclose(r["value"], full_head, rel_tol=1e-5)


# ---------------------------------------------------------------- probe command


def test_probe_runs_several_probes_with_options():
    d = as_json(invoke("probe", CKPT, "--spec", SPEC, "--data", "digits", *SMALL, "--params", "head.*",
                       "--probes", "trace,gini", "-o", "trace.estimator=exact", "--json", "-"))
    assert list(d["results"]) == ["trace", "gini"]
    trace_r, gini = d["results"]["trace"], d["results"]["gini"]
    assert trace_r["details"]["estimator"] == "exact" and trace_r["label"] == "Tr(G)"
    assert trace_r["stderr"] is None and trace_r["matvecs"] == 0
    assert gini["stderr"] is None and 0 <= gini["value"] <= 1
    assert 0 <= gini["details"]["accuracy"] <= 1


def test_probe_long_option_and_table():
    result = invoke("probe", CKPT, "--spec", SPEC, *SMALL, "--params", "head.*", "--probes", "trace",
                    "--option", "trace.probes_max=8", "--option", "trace.estimator=hutchpp", "--quiet")
    ok(result)
    assert "Tr(H)" in result.stdout and "hutchpp" in result.stdout
    assert_only_tables(result.stdout)


def test_no_layers_takes_forward_tangents_with_the_same_probes():
    """`--no-layers` asks for the total alone, which the autograd backend takes by forward
    tangents (`--route tangent`; by default from TANGENT_MIN_PRODUCTS products on): same seed,
    same probes, so the same trace to float32 round-off (the per-probe values are sums over the
    14k parameters in float32, each product accurate to ~1e-6). Fewer products by default take
    HVPs, the --layers arithmetic: the same probe values, bit for bit."""
    full = as_json(trace("--probes-max", "6", "--json", "-"))["results"]["trace"]
    fast = as_json(trace("--probes-max", "6", "--no-layers", "--route", "tangent", "--json", "-"))["results"]["trace"]
    short = as_json(trace("--probes-max", "6", "--no-layers", "--json", "-"))["results"]["trace"]
    assert short["details"]["route"] == "hvp_sums" and fast["details"]["route"] == "vhv_tangent"
    assert short["details"]["probe_values"] == full["details"]["probe_values"]
    assert "forward tangents" in fast["notes"] and "forward tangents" not in full["notes"]
    assert fast["details"]["parts"] is False and fast["details"]["layers"] == {}
    assert full["details"]["layers"] and fast["matvecs"] == full["matvecs"] == 6
    assert abs(fast["value"] - full["value"]) <= 1e-4 * abs(full["value"])
    assert abs(fast["stderr"] - full["stderr"]) <= 1e-4 * full["stderr"]


def test_trace_max_probes_alias():
    d = as_json(trace("--max-probes", "4", "--params", "head.*", "--json", "-"))
    assert d["results"]["trace"]["matvecs"] == 4


def test_probe_help_shows_short_option():
    result = invoke("probe", "--help")
    ok(result)
    assert "-o" in result.stdout and "--option" in result.stdout


# ---------------------------------------------------------------- list-probes, version


def test_list_probes():
    result = invoke("list-probes")
    ok(result)
    assert "trace" in result.stdout and "gini" in result.stdout
    assert result.stderr == ""


def test_version():
    result = invoke("version")
    ok(result)
    assert __version__ in result.stdout
    assert result.stdout.startswith("flatcheck ")


def test_no_arguments_shows_help():
    result = invoke()
    assert "trace" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


# ---------------------------------------------------------------- entry points


@pytest.mark.process
def test_python_dash_m_help():
    proc = subprocess.run([sys.executable, "-m", "flatcheck", "--help"], capture_output=True, text=True,
                          timeout=HANG_GUARD, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for command in ("trace", "probe", "list-probes", "version"):
        assert command in proc.stdout


@pytest.mark.process
def test_console_script_installed():
    script = Path(sys.executable).parent / "flatcheck"
    assert script.is_file(), f"no console script at {script}"
    proc = subprocess.run([str(script), "version"], capture_output=True, text=True, timeout=HANG_GUARD, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(f"flatcheck {__version__}")
