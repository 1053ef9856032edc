"""Bad input, end to end through the CLI: exit code 2 and one line on stderr that starts
with "error:" and names the file, field or flag at fault; never a traceback unless --debug.
"""

from __future__ import annotations

import os
import pickle
import shlex
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from test_cli import invoke  # the one CLI runner of the suite (stdout/stderr apart, fixed width)

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "demo" / "digits_cnn.safetensors"
SPEC = ROOT / "model_specs" / "demo_digits.yaml"
SMALL = ["--samples", "64", "--batch-size", "32"]


def trace(*extra, ckpt=CKPT, spec=SPEC):
    return invoke("trace", ckpt, "--spec", spec, *SMALL, "--probes-max", "8", *extra)


def probe(*extra, ckpt=CKPT, spec=SPEC):
    return invoke("probe", ckpt, "--spec", spec, *SMALL, *extra)


def bad(result, *names: str, code: int = 2) -> str:
    """Assert the contract for a refused input and return the message."""
    err = result.stderr.strip()
    assert result.exit_code == code, f"exit {result.exit_code}\nstderr: {result.stderr}\nstdout: {result.stdout}"
    assert "Traceback" not in result.stderr + result.stdout
    assert err, "nothing on stderr"
    assert "\n" not in err, f"more than one line on stderr:\n{err}"
    assert err.startswith("error:" if code == 2 else "internal error:"), err
    for name in names:
        assert name in err, f"{name!r} not in {err!r}"
    assert result.stdout == "", f"stdout not empty: {result.stdout!r}"
    return err


@pytest.fixture(scope="module")
def state() -> dict[str, torch.Tensor]:
    return load_file(str(CKPT))


def save(tmp_path: Path, sd: dict[str, torch.Tensor], name: str = "bad.safetensors") -> Path:
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


def spec_copy(tmp_path: Path, old: str | None = None, new: str = "", append: str = "", name="spec.yaml") -> Path:
    text = SPEC.read_text(encoding="utf-8")
    if old is not None:
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text + append, encoding="utf-8")
    return path


# ---------------------------------------------------------------- checkpoints


def test_missing_checkpoint(tmp_path):
    path = tmp_path / "nope.safetensors"
    bad(trace(ckpt=path), "not found", "nope.safetensors")


def test_missing_checkpoint_with_debug_shows_traceback(tmp_path):
    result = trace("--debug", ckpt=tmp_path / "nope.safetensors")
    assert result.exit_code == 2
    assert "Traceback" in result.stderr
    assert "CheckpointError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error:")


def test_truncated_safetensors(tmp_path):
    blob = CKPT.read_bytes()
    path = tmp_path / "half.safetensors"
    path.write_bytes(blob[: len(blob) // 2])
    bad(trace(ckpt=path), "half.safetensors", "safetensors")


def test_garbage_safetensors(tmp_path):
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(os.urandom(4096))
    bad(trace(ckpt=path), "garbage.safetensors")


def test_empty_safetensors_file(tmp_path):
    path = tmp_path / "empty.safetensors"
    path.write_bytes(b"")
    bad(trace(ckpt=path), "empty.safetensors")


class _RunsCode:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


@pytest.mark.parametrize("writer", ["torch.save", "pickle.dump"])
def test_pickle_that_runs_code_is_refused(tmp_path, writer):
    marker = tmp_path / "PWNED"
    payload = {"state_dict": {"head.weight": _RunsCode(marker)}}
    path = tmp_path / "evil.pt"
    if writer == "torch.save":
        torch.save(payload, path)
    else:
        with open(path, "wb") as fh:
            pickle.dump(payload, fh, protocol=2)
    err = bad(trace(ckpt=path), "evil.pt")
    assert "refusing" in err and "safetensors" in err
    assert not marker.exists(), "the checkpoint's pickled code was executed"


def test_pt_that_is_not_a_state_dict(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([torch.zeros(3)], path)
    bad(trace(ckpt=path), "list.pt", "mapping")


def test_checkpoint_missing_key(tmp_path, state):
    sd = dict(state)
    del sd["head.bias"]
    bad(trace(ckpt=save(tmp_path, sd)), "bad.safetensors", "missing", "head.bias")


def test_checkpoint_unexpected_key(tmp_path, state):
    sd = dict(state, **{"head.extra": torch.zeros(3)})
    bad(trace(ckpt=save(tmp_path, sd)), "bad.safetensors", "unexpected", "head.extra")


def test_checkpoint_misshaped_key(tmp_path, state):
    sd = dict(state, **{"head.weight": torch.zeros(11, 32)})
    bad(trace(ckpt=save(tmp_path, sd)), "bad.safetensors", "head.weight", "(11, 32)", "(10, 32)")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_checkpoint_non_finite_weights(tmp_path, state, value):
    weight = state["features.0.weight"].clone()
    weight.view(-1)[3] = value
    sd = dict(state, **{"features.0.weight": weight})
    bad(trace(ckpt=save(tmp_path, sd)), "bad.safetensors", "features.0.weight", "NaN")


def test_checkpoint_unknown_extension(tmp_path):
    path = tmp_path / "weights.ckpt"
    path.write_bytes(CKPT.read_bytes())
    bad(trace(ckpt=path), "weights.ckpt", ".ckpt", ".safetensors")


# ---------------------------------------------------------------- specs


def test_spec_unknown_key(tmp_path):
    spec = spec_copy(tmp_path, append="lr: 0.1\n")
    bad(trace(spec=spec), "spec.yaml", "'lr'", "unknown")


def test_spec_wrong_type(tmp_path):
    spec = spec_copy(tmp_path, "num_classes: 10", "num_classes: ten")
    bad(trace(spec=spec), "spec.yaml", "num_classes", "ten")


def test_spec_missing_file(tmp_path):
    bad(trace(spec=tmp_path / "nosuch.yaml"), "nosuch.yaml", "not found")


def test_spec_not_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("source: python\narch: [unclosed\n", encoding="utf-8")
    bad(trace(spec=path), "broken.yaml", "YAML")


def test_spec_num_classes_disagrees_with_checkpoint(tmp_path):
    # DigitsCNN takes num_classes as its argument, so the model follows the spec and the
    # 10-class checkpoint no longer fits its head
    spec = spec_copy(tmp_path, "num_classes: 10", "num_classes: 5")
    bad(trace(spec=spec), "digits_cnn.safetensors", "head.weight", "(10, 32)", "(5, 32)")


# ---------------------------------------------------------------- data


def test_cifar10_missing_under_data_root(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    spec = spec_copy(tmp_path, "input_size: [1, 8, 8]", "input_size: [3, 8, 8]")
    # the data set is looked up before the spec's input size is checked against it
    err = bad(trace("--data", "cifar10", "--data-root", root, spec=spec), "cifar10", "cifar-10-batches-py")
    assert str(root) in err


def test_cifar10_missing_with_demo_spec(tmp_path):
    bad(trace("--data", "cifar10", "--data-root", tmp_path), "cifar-10-batches-py", "--data-root")


def test_unknown_data_set():
    bad(trace("--data", "nosuch"), "nosuch", "digits")


def test_more_samples_than_available():
    result = invoke("trace", CKPT, "--spec", SPEC, "--samples", "100000", "--batch-size", "32",
                    "--probes-max", "8")
    bad(result, "--samples", "100000", "digits")


def test_samples_zero():
    result = invoke("trace", CKPT, "--spec", SPEC, "--samples", "0", "--batch-size", "32")
    bad(result, "--samples")


def test_wrong_channel_count(tmp_path):
    spec = spec_copy(tmp_path, "input_size: [1, 8, 8]", "input_size: [3, 8, 8]")
    bad(trace(spec=spec), "digits", "3 channels", "input_size")


def test_flat_input_size_for_a_cnn(tmp_path):
    spec = spec_copy(tmp_path, "input_size: [1, 8, 8]", "input_size: [64]")
    bad(trace(spec=spec), "spec.yaml", "input_size", "(64,)")


def test_input_size_wrong_rank(tmp_path):
    spec = spec_copy(tmp_path, "input_size: [1, 8, 8]", "input_size: [8, 8]")
    bad(trace(spec=spec), "spec.yaml", "input_size")


def test_spatial_mismatch_is_resized_not_refused(tmp_path):
    # data/transform.py: only resizing is implicit (checkpoints are routinely evaluated at
    # their own resolution); channels and rank must match exactly (tests above)
    spec = spec_copy(tmp_path, "input_size: [1, 8, 8]", "input_size: [1, 16, 16]")
    result = trace("--estimator", "exact", "--params", "head.*", "--quiet", spec=spec)
    assert result.exit_code == 0, result.stderr
    assert "Tr(G)" in result.stdout


# ---------------------------------------------------------------- flags


@pytest.mark.parametrize(
    "args, names",
    [
        (["--dtype", "float16"], ["--dtype", "float16"]),
        (["--bn-mode", "foo"], ["--bn-mode", "foo"]),
        (["--split", "validation"], ["--split", "validation"]),
        (["--device", "nosuch"], ["--device", "nosuch"]),
        (["--seed", "-1"], ["--seed"]),
        (["--rtol", "-1"], ["--rtol"]),
        (["--rtol", "0"], ["--rtol"]),
        (["--probes-max", "1"], ["--probes-max"]),
        (["--estimator", "nosuch"], ["estimator", "nosuch"]),
        (["--matrix", "fisher"], ["matrix", "fisher"]),
        (["--params", "nomatch.*"], ["--params", "nomatch.*"]),
        (["--backend", "nosuch"], ["nosuch"]),
        (["--compile"], ["--compile", "--backend func", "autograd"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("--") else None,
)
def test_bad_trace_flag(args, names):
    bad(trace(*args), *names)


def test_batch_size_zero():
    result = invoke("trace", CKPT, "--spec", SPEC, "--samples", "64", "--batch-size", "0", "--probes-max", "8")
    bad(result, "--batch-size")


def test_cuda_on_a_cpu_only_machine():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    bad(trace("--device", "cuda"), "--device", "cuda", "CUDA")


def test_cuda_index_out_of_range():
    if not torch.cuda.is_available():
        bad(trace("--device", "cuda:7"), "--device", "cuda:7")
    else:
        bad(trace("--device", f"cuda:{torch.cuda.device_count()}"), "--device")


@pytest.mark.parametrize(
    "args, names",
    [
        (["--probes", "nosuch"], ["--probes", "nosuch", "trace", "gini"]),
        (["--probes", ""], ["--probes"]),
        (["--probes", "trace,trace"], ["--probes", "twice"]),
        (["--probes", "trace", "-o", "trace.nosuch=1"], ["trace.nosuch", "probes_max"]),
        (["--probes", "trace", "-o", "trace.probes_max=many"], ["trace.probes_max", "many"]),
        (["--probes", "trace", "-o", "trace.estimator=nosuch"], ["trace.estimator", "nosuch"]),
        (["--probes", "trace", "-o", "estimator=exact"], ["-o", "PROBE.KEY=VALUE"]),
        (["--probes", "trace", "-o", "gini.x=1"], ["gini", "--probes"]),
        (["--probes", "trace", "-o", "trace.estimator=exact", "-o", "trace.matrix=hessian"], ["--matrix"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v and v[0].startswith("--") else None,
)
def test_bad_probe_flag(args, names):
    bad(probe(*args), *names)


# ---------------------------------------------------------------- --json PATH


def test_json_into_missing_folder(tmp_path):
    out = tmp_path / "nosuch" / "out.json"
    bad(trace("--json", out), "--json", "nosuch", "does not exist")
    assert not out.parent.exists()


def test_json_onto_a_folder(tmp_path):
    bad(trace("--json", tmp_path), "--json", str(tmp_path), "folder")
    assert list(tmp_path.iterdir()) == []


def test_json_write_failure_is_bad_input_not_a_crash(tmp_path, monkeypatch):
    import flatcheck.report.io as io

    def denied(path, text):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(io, "write_text_atomic", denied)
    out = tmp_path / "out.json"
    bad(trace("--estimator", "exact", "--params", "head.*", "--json", out), "--json", "out.json", "Permission denied")
    assert not out.exists()


# ---------------------------------------------------------------- internal errors


def test_probe_crash_is_internal_error(monkeypatch):
    from flatcheck.probes.trace import TraceProbe

    def boom(self, ctx, options):
        raise RuntimeError("boom in the probe")

    monkeypatch.setattr(TraceProbe, "run", boom)
    result = trace("--params", "head.*")
    err = bad(result, "internal error", "RuntimeError", "boom in the probe", code=101)
    assert "--debug" in err

    debug = trace("--params", "head.*", "--debug")
    assert debug.exit_code == 101
    assert "Traceback" in debug.stderr and "boom in the probe" in debug.stderr
