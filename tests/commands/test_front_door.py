"""The front door's leftovers (what a stranger's first runs tripped on): a --model python: module in the working
directory, the spec named in a checkpoint/model mismatch, a Lightning .ckpt's `model.` prefix,
an empty --summary path, the notice of a resize to the spec's input size."""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

import flatcheck
from flatcheck.models.checkpoint import fitting_prefix
from flatcheck.zoo.demo_cnn import DigitsCNN
from tests.support.cli import CKPT as DEMO, SPEC as DEMO_SPEC, FAST_JSON as FAST, copy_demo, invoke, refused, run_json
from tests.support.proc import HANG_GUARD

LOUD = [a for a in FAST if a != "--quiet"]  # warnings are said (and pytest records them)
NET = ("from torch import nn\n\ndef net(num_classes=10):\n"
       "    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\n")


# ---------------------------------------------------------------- --model python: in the working directory

def test_python_reference_imports_a_module_of_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "cwd_net_16.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    args = ["trace", "--model", "python:cwd_net_16:net", "--random-init", "--input-size", "1,8,8", "--data", "digits"]
    report = run_json(*args, *FAST)  # no --trust-package: the folder the user typed it in, as a spec's own
    assert report["model"]["resolved_spec"]["head"] == "1"
    assert sys.path == before  # the folder was on the path for the import only
    module, _ = flatcheck.load_model("python:cwd_net_16:net", num_classes=3)
    assert module[1].out_features == 3


def test_python_reference_elsewhere_still_needs_trust(tmp_path, monkeypatch):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "far_net_16.py").write_text(NET)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    line = refused("trace", "--model", "python:far_net_16:net", "--random-init", "--input-size", "1,8,8")
    assert f"only a .py file in the working directory {work}" in line and "--trust-package far_net_16" in line
    # a module of the working directory may not hand over a callable of an untrusted one
    (work / "relay_16.py").write_text("from far_net_16 import net\n")
    line = refused("trace", "--model", "python:relay_16:net", "--random-init", "--input-size", "1,8,8")
    assert "defined in module 'far_net_16', which is not trusted" in line


# ---------------------------------------------------------------- which spec built the model that does not fit

OTHER = "source: timm\narch: test_resnet\nnum_classes: 10\ninput_size: [3, 32, 32]\n"


@pytest.mark.parametrize("where", ["stem", "folder", "embedded", "flag"])
def test_a_mismatch_names_the_spec_and_where_it_came_from(tmp_path, where):
    ckpt = copy_demo(tmp_path)
    other = tmp_path / "other.yaml"
    other.write_text(OTHER)
    args = ["trace", ckpt, "--data", "synthetic"]
    if where == "stem":
        shutil.copy(other, ckpt.with_suffix(".yaml"))
        said = f"the model is timm 'test_resnet' from {ckpt.with_suffix('.yaml')}, the spec found beside the checkpoint"
    elif where == "folder":
        shutil.copy(other, tmp_path / "spec.yaml")
        said = f"from {tmp_path / 'spec.yaml'}, the spec found in the checkpoint's folder"
    elif where == "embedded":
        from flatcheck.models.embed import embed_spec  # embed-spec itself refuses a spec that does not fit

        embed_spec(ckpt, yaml.safe_load(OTHER))
        said = f"from the spec embedded in {ckpt} (by flatcheck embed-spec)"
    else:
        args += ["--model", "timm:test_resnet", "--num-classes", "10"]
        said = "the model is timm 'test_resnet' from flag --model timm:test_resnet"
    line = refused(*args)
    assert "does not fit the model: missing keys" in line and said in line, line
    assert ("--spec or --model chooses another" in line) == (where != "flag")


# ---------------------------------------------------------------- a prefix on every key (Lightning)

def lightning_ckpt(path: Path, extra: dict | None = None) -> Path:
    state = {f"model.{k}": v for k, v in load_file(str(DEMO)).items()}
    torch.save({"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
                "state_dict": {**state, **(extra or {})}, "hyper_parameters": {"lr": 0.1},
                "optimizer_states": [{"state": {}, "param_groups": [{"lr": 0.1}]}]}, path)
    return path


def test_a_lightning_ckpt_loads_with_its_prefix_stripped_and_recorded(tmp_path):
    ckpt = lightning_ckpt(tmp_path / "epoch=3.ckpt")
    with pytest.warns(UserWarning, match=r"every key carries the prefix 'model\.' and fits the model without it"):
        report = run_json("trace", ckpt, "--spec", DEMO_SPEC, "--data", "digits", *LOUD)
    by_spec = run_json("trace", DEMO, "--spec", DEMO_SPEC, "--data", "digits", *FAST)
    assert report["results"]["trace"]["value"] == by_spec["results"]["trace"]["value"]  # the same weights
    assert report["model"]["resolved_spec"]["checkpoint"] == {"strip_prefix": "model."}
    assert report["model"]["spec_origins"]["checkpoint"].startswith("detected")
    assert report["checkpoint"]["format"] == "torch"


def test_a_prefix_that_does_not_fit_exactly_is_a_hint_not_a_strip(tmp_path):
    ckpt = lightning_ckpt(tmp_path / "last.ckpt", {"criterion.weight": torch.ones(3)})
    line = refused("trace", ckpt, "--spec", DEMO_SPEC, "--data", "digits")
    assert "12 of the 12 missing keys are there with the prefix 'model.': " \
           "--set checkpoint.strip_prefix=model. removes it" in line, line
    assert "unexpected keys 14" in line  # criterion.weight stays named: it would stay unexpected


def test_fitting_prefix_only_for_an_exact_fit():
    model = DigitsCNN()
    state = model.state_dict()
    assert fitting_prefix(state, model) is None  # already fits
    assert fitting_prefix({f"a.b.{k}": v for k, v in state.items()}, model) == "a.b."
    partial = {f"model.{k}": v for k, v in state.items() if not k.startswith("head")}
    assert fitting_prefix(partial, model) is None  # a key missing after the strip
    assert fitting_prefix({**{f"model.{k}": v for k, v in state.items()}, "x": torch.ones(1)}, model) is None


def test_a_ckpt_that_needs_code_is_still_refused(tmp_path):
    # weights_only stays: an object in the hyper-parameters is code, and refused, never run
    path = tmp_path / "code.ckpt"
    torch.save({"state_dict": load_file(str(DEMO)), "hyper_parameters": {"cfg": Path("x")}}, path)
    assert "refusing to execute pickled code" in refused("trace", path, "--spec", DEMO_SPEC)


# ---------------------------------------------------------------- a resize to the spec's input size

@pytest.mark.process
def test_a_resize_is_said_once_on_stderr_and_recorded(tmp_path):
    import subprocess

    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "flatcheck", "probe", str(DEMO), "--spec", str(DEMO_SPEC),
                           "--input-size", "1,16,16", "--probes", "gini,gap", "--samples", "32", "--json", str(out)],
                          capture_output=True, text=True, timeout=HANG_GUARD,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "images resized" in line]
    # once, though gap reads both splits, and as a line of flatcheck's, not Python's file:line
    # and source line
    assert said == [next(line for line in said)] and "data 'digits': images resized 8×8 → 16×16, bilinear, to " \
                                                      "the model's input size" in said[0], proc.stderr
    assert said[0].startswith("flatcheck: warning: data 'digits'") and ".py:" not in proc.stderr
    assert json.loads(out.read_text())["data"]["resized"] == "8×8 → 16×16, bilinear"
    assert "(resized 8×8 → 16×16, bilinear)" in proc.stdout  # the table's header says it too
    # at the data's own size nothing is resized, and nothing said
    report = run_json("trace", DEMO, "--spec", DEMO_SPEC, "--data", "digits", *FAST)
    assert "resized" not in report["data"]


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "absent.safetensors", "error: checkpoint not found: {}"),
    (lambda tmp: (tmp / "weights.pt").mkdir() or tmp / "weights.pt", "error: checkpoint {} is a folder, not a file"),
])
def test_a_missing_checkpoint_is_refused_before_torch_is_imported(tmp_path, make, message):
    """The front door's commonest mistake, a mistyped file name, costs no import of torch: the
    line and exit 2 the loader itself gives, said at once."""
    import subprocess

    path = str(make(tmp_path))
    code = ("import sys, atexit; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
            f"sys.argv = ['flatcheck', 'trace', {path!r}, '--data', 'synthetic']; "
            "from flatcheck.entry import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(path)), proc.stderr
    assert proc.stdout.strip() == "torch imported: False"


def test_the_early_check_knows_every_checkpoint_suffix_the_loader_reads():
    from flatcheck.models.checkpoint import SAFETENSORS_EXTS, TORCH_EXTS
    from flatcheck.report.starting import CHECKPOINT_SUFFIXES

    assert set(CHECKPOINT_SUFFIXES) == set(SAFETENSORS_EXTS + TORCH_EXTS)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["version"], ["list-probes"], ["explain", "trace"], []])
def test_commands_that_run_nothing_import_no_torch(argv):
    """Help, the version, the probe list and `explain` answer from the CLI and the probes'
    catalogue without importing torch (seconds of a start-up for a line of text)."""
    import subprocess

    from flatcheck.probes.catalogue import current

    current()  # a shipped catalogue made stale by an edit to a probe is read once and cached
    code = ("import sys, atexit; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
            f"sys.argv = ['flatcheck', *{argv!r}]; from flatcheck.entry import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == (0 if argv else 2), proc.stderr  # bare: the help, as a usage error
    assert proc.stdout.strip().endswith("torch imported: False"), proc.stdout[-300:]
    if argv and argv[-1] in ("--version", "version"):
        assert proc.stdout.startswith("flatcheck ")
    if argv == ["explain", "trace"]:
        assert "--probes-max" in proc.stdout and "Options" in proc.stdout


def test_the_probe_catalogue_is_current():
    """The catalogue the CLI reads instead of the probes says what the probes say; after a change
    to a probe's help or options: python -m flatcheck.probes.catalogue."""
    from flatcheck.probes import catalogue

    assert catalogue.stored(shipped_only=True) is not None, "stale: run python -m flatcheck.probes.catalogue"
    assert catalogue.stored(shipped_only=True) == catalogue.read()


def test_settings_are_the_cli_s_shared_flags_and_errors_say_their_flags():
    """Each declared setting with a flag is a flag of every probe command, with its help; a
    setting's error below the CLI names the setting, and the CLI says its flag."""
    import typer

    from flatcheck.cli import app
    from flatcheck.settings import declared

    trace = typer.main.get_command(app).get_command(None, "trace")
    flags = {opt: p for p in trace.params for opt in getattr(p, "opts", [])}
    for name, how in declared().items():
        assert how.flag in flags and flags[how.flag].help == how.help, name
    result = invoke("gini", DEMO, "--spec", DEMO_SPEC, "--data", "digits", "--dtype", "float16")
    assert result.exit_code == 2 and "error: --dtype must be one of float32, float64, got 'float16'" in result.output
