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

from tests.support.cli import CKPT, ROOT, SMALL, SPEC, bad, invoke
from tests.support.proc import HANG_GUARD

pytestmark = pytest.mark.workflow  # whole workflows, seconds each: make test-all only


def trace(*extra, ckpt=CKPT, spec=SPEC):
    # the exact GGN trace takes no probe count (the flag is refused with it)
    count = [] if "exact" in extra else ["--probes-max", "8"]
    return invoke("trace", ckpt, "--spec", spec, *SMALL, *count, *extra)


def probe(*extra, ckpt=CKPT, spec=SPEC):
    return invoke("probe", ckpt, "--spec", spec, *SMALL, *extra)


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
    # grey → RGB and RGB → grey are converted (test_output_text.py); 1 → 2 has no standard way
    spec = spec_copy(tmp_path, "input_size: [1, 8, 8]", "input_size: [2, 8, 8]")
    bad(trace(spec=spec), "digits", "2 channels", "input_size")


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

    def denied(path, data):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(io, "write_bytes_atomic", denied)
    out = tmp_path / "out.json"
    line = shown_then_refused(trace("--estimator", "exact", "--params", "head.*", "--json", out), "--json",
                              "out.json", "Permission denied", "the output is in")
    assert not out.exists()
    spare = Path(line.rsplit("the output is in ", 1)[1].split(" instead")[0])
    assert json.loads(spare.read_text())["results"]["trace"]["value"] > 0


def shown_then_refused(result, *names: str) -> str:
    """An output not written at its path after the run (report.io.rescued_outputs): the
    results are on stdout all the same, then one error line names the output and where it
    went; exit 2."""
    assert result.exit_code == 2, f"exit {result.exit_code}\nstderr: {result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout and "Tr(G)" in result.stdout
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("flatcheck") for line in lines[:-1]), result.stderr
    assert lines[-1].startswith("error: ") and all(n in lines[-1] for n in names), lines[-1]
    return lines[-1]


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


# ---------------------------------------------------------------- data catalogue
# Real files in their on-disk formats, holding the embedded digits (as 0..255 pixels) so
# that the demo model classifies them: a label shift or a wrong scale shows in its numbers.

import json  # noqa: E402

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from flatcheck.data.builtin import digits  # noqa: E402

N_TRAIN, N_TEST = 64, 32  # --samples 64 reads every train image; gap caps test at its 32


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """The first N_TRAIN + N_TEST embedded digits as (N, 8, 8) uint8 0..255, and labels."""
    data = digits(split="train").dataset
    x = (data.x[: N_TRAIN + N_TEST, 0].to(torch.int32) * 255 + 8) // 16  # 0..16 -> 0..255, rounded
    return x.to(torch.uint8).numpy(), data.y[: N_TRAIN + N_TEST].numpy()


def write_npz(path: Path, x: np.ndarray, y: np.ndarray, test: bool = True) -> str:
    arrays = {"x": x[:N_TRAIN], "y": y[:N_TRAIN]}
    if test:
        arrays.update(x_test=x[N_TRAIN:], y_test=y[N_TRAIN:])
    np.savez(path, **arrays)
    return f"npz:{path}"


def write_folder(base: Path, x: np.ndarray, y: np.ndarray, splits: bool = True) -> str:
    """PNG files base/{train,test}/<label>/<index>.png, or base/<label>/... without splits."""
    for i, (img, label) in enumerate(zip(x, y)):
        split = "train" if i < N_TRAIN else "test"
        if not splits and split == "test":
            break
        folder = base / split / str(label) if splits else base / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img, mode="L").save(folder / f"{i:03d}.png")
    return f"imagefolder:{base}"


def gap_result(uri: str) -> dict:
    result = probe("--data", uri, "--probes", "gap", "--json", "-", "--quiet")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["results"]["gap"]


def _npz_train_only(tmp_path: Path) -> str:
    return write_npz(tmp_path / "train_only.npz", *digit_images(), test=False)


def _flat_folder(tmp_path: Path) -> str:
    return write_folder(tmp_path / "flat", *digit_images(), splits=False)


NO_TEST_SPLIT = pytest.mark.parametrize(
    "write, names",
    [(_npz_train_only, ["train_only.npz", "x_test", "y_test"]), (_flat_folder, ["flat", "test/", "val/"])],
    ids=["npz", "imagefolder"],
)


@NO_TEST_SPLIT
def test_split_test_without_a_test_split(tmp_path, write, names):
    bad(trace("--data", write(tmp_path), "--split", "test"), "no test split", *names)


@NO_TEST_SPLIT
def test_gap_command_without_a_test_split(tmp_path, write, names):
    bad(invoke("gap", CKPT, "--spec", SPEC, "--data", write(tmp_path), *SMALL), "no test split", *names)


@NO_TEST_SPLIT
def test_gap_probe_is_skipped_without_a_test_split(tmp_path, write, names):
    gap = gap_result(write(tmp_path))
    assert gap["value"] is None  # never a gap between the train arrays and themselves
    assert gap["notes"].startswith("skipped") and "no test split" in gap["notes"]
    assert all(name in gap["details"]["skipped"] for name in names)


def test_default_probes_skip_gap_but_run_the_rest(tmp_path):
    result = probe("--data", _npz_train_only(tmp_path), "-o", "trace.probes_max=8", "--json", "-", "--quiet")
    assert result.exit_code == 0, result.stderr
    results = json.loads(result.stdout)["results"]
    assert results["gap"]["value"] is None and isinstance(results["trace"]["value"], float)


def test_npz_float_pixels_in_unit_interval_equal_uint8(tmp_path):
    x, y = digit_images()
    as_uint8 = gap_result(write_npz(tmp_path / "u8.npz", x, y))
    as_float = gap_result(write_npz(tmp_path / "f32.npz", x.astype(np.float32) / np.float32(255), y))
    assert as_float["details"] == as_uint8["details"]
    assert as_uint8["details"]["train"]["accuracy"] > 0.9  # the images are ones the model knows


@pytest.mark.parametrize(
    "scale, names",
    [
        (lambda x: x.astype(np.float32), ["0..255", "uint8"]),  # pixels as floats, never divided
        (lambda x: (x / 255.0 - 0.5) / 0.25, ["normalised", "mean", "std"]),  # already normalised
    ],
    ids=["0..255", "mean-std"],
)
def test_npz_float_outside_unit_interval(tmp_path, scale, names):
    x, y = digit_images()
    uri = write_npz(tmp_path / "pixels.npz", scale(x), y)
    bad(trace("--data", uri), "pixels.npz", "'x'", "[0, 1]", *names)


def test_imagefolder_ignores_hidden_entries(tmp_path):
    x, y = digit_images()
    x, y = x[y < 9], y[y < 9]  # 9 classes: with .hidden/ as a 10th the model still fits, and shows the shift
    assert len(y) > N_TRAIN
    reference = gap_result(write_npz(tmp_path / "same.npz", x, y))
    uri = write_folder(tmp_path / "images", x, y)
    for split in ("train", "test"):
        # a hidden folder sorts first and would become class 0, shifting every label by one
        write_folder(tmp_path / "images" / split / ".hidden", x[:2], np.zeros(2, np.int64), splits=False)
        (tmp_path / "images" / split / ".DS_Store").write_bytes(os.urandom(64))
        (tmp_path / "images" / split / "3" / "._000.png").write_bytes(os.urandom(64))  # macOS resource fork
    gap = gap_result(uri)
    for split in ("train", "test"):
        assert gap["details"][split]["accuracy"] == reference["details"][split]["accuracy"]
        assert gap["details"][split]["loss"] == pytest.approx(reference["details"][split]["loss"], rel=1e-6)


def _truncated(fmt: str):
    def write(path: Path, img: np.ndarray) -> None:
        Image.fromarray(img, mode="L").save(path, format=fmt)
        blob = path.read_bytes()
        path.write_bytes(blob[: len(blob) // 2])

    return write


def _garbage(path: Path, img: np.ndarray) -> None:
    path.write_bytes(os.urandom(256))


@pytest.mark.parametrize(
    "name, damage",
    [("bad.png", _truncated("PNG")), ("bad.jpg", _truncated("JPEG")), ("bad.png", _garbage)],
    ids=["truncated-png", "truncated-jpeg", "garbage"],
)
def test_imagefolder_corrupt_image(tmp_path, name, damage):
    x, y = digit_images()
    uri = write_folder(tmp_path / "images", x, y)
    damage(tmp_path / "images" / "train" / str(y[5]) / name, x[5])
    bad(trace("--data", uri), str(Path("train") / str(y[5]) / name), "cannot read")


def test_gap_stops_on_a_broken_test_split_rather_than_skipping(tmp_path):
    # only a missing split skips gap; an unreadable file in the split that is there is bad input
    x, y = digit_images()
    uri = write_folder(tmp_path / "images", x, y)
    _garbage(tmp_path / "images" / "test" / str(y[N_TRAIN]) / "bad.png", x[0])
    bad(probe("--data", uri, "--probes", "gap"), str(Path("test") / str(y[N_TRAIN]) / "bad.png"), "cannot read")


def test_gap_skips_a_source_serving_train_as_test(tmp_path, monkeypatch):
    from flatcheck.data import catalogue as registry

    x, y = digit_images()
    f = write_npz(tmp_path / "train_only.npz", x, y, test=False).partition(":")[2]
    npz = registry._REGISTRY["npz"].factory

    def same_for_both(*, split: str, **_) -> registry.DataSource:
        return npz(path=f, split="train")

    monkeypatch.setitem(registry._REGISTRY, "same-splits", registry._Entry(same_for_both, takes_path=False))
    gap = gap_result("same-splits")
    assert gap["value"] is None and "same 64 samples" in gap["details"]["skipped"]


# ---------------------------------------------------------------- models, specs, checkpoints

import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

from tests.support.cli import strip_volatile  # noqa: E402

# The demo CNN with its logits wrapped as a `source: python` model file beside a spec.
WRAPPED_NET = """
from flatcheck.zoo.demo_cnn import DigitsCNN


class Wrapped(DigitsCNN):
    def forward(self, x):
        logits = super().forward(x)
        return {wrap}


def make(num_classes=10):
    return Wrapped(num_classes=num_classes)
"""


@pytest.fixture
def model_file(tmp_path):
    """write(body or wrap=...) -> module name: a model file in tmp_path, forgotten afterwards
    (an in-process CLI keeps imported modules, and each test's file must be its own)."""
    names = []

    def write(body: str | None = None, wrap: str = "logits") -> str:
        name = f"fc_model_{tmp_path.name.replace('-', '_')}_{len(names)}"
        (tmp_path / f"{name}.py").write_text(body if body is not None else WRAPPED_NET.format(wrap=wrap))
        names.append(name)
        return name

    yield write
    for name in names:
        sys.modules.pop(name, None)


def python_spec(tmp_path: Path, arch: str, append: str = "", name: str = "spec.yaml") -> Path:
    return spec_copy(tmp_path, "arch: flatcheck.zoo.demo_cnn:DigitsCNN", f"arch: {arch}", append=append, name=name)


def results(result) -> dict:
    assert result.exit_code == 0, result.stderr
    return strip_volatile(json.loads(result.stdout)["results"])


# vᵀHv by forward tangents traces the model with make_fx; the HVP route (per-layer parts) runs it eagerly
TANGENT = ("--probes", "trace", "-o", "trace.probes_max=4", "-o", "trace.parts=false", "-o", "trace.route=tangent",
           "--json", "-", "-q")
EAGER = ("--layers", "--json", "-", "-q")
# HF's ModelOutput is a dict whose keys are attributes too; a plain dataclass has .logits
OUTPUT_TYPES = ("import dataclasses\nimport torch\n\nclass _ModelOutput(dict):\n    __getattr__ = dict.__getitem__\n\n"
                "@dataclasses.dataclass\nclass _Output:\n    hidden: torch.Tensor\n    logits: torch.Tensor\n")


@functools.cache
def demo_results(*args: str) -> dict:
    """The demo model's results for these arguments, run once per test session."""
    return results(probe(*args) if "--probes" in args else trace(*args))


@pytest.mark.parametrize(
    "wrap, key",
    [
        ("(logits, x.sum())", None),
        ("{'scores': logits, 'hidden': x}", None),
        ("(x, logits)", "1"),
        ("_ModelOutput(hidden=x, logits=logits)", None),
        ("_Output(hidden=x, logits=logits)", None),
    ],
    ids=["tuple", "dict first tensor", "index", "ModelOutput", "dataclass"],
)
def test_structured_forward_output_gives_the_same_results(tmp_path, model_file, wrap, key):
    name = model_file(OUTPUT_TYPES + WRAPPED_NET.format(wrap=wrap))
    spec = python_spec(tmp_path, f"{name}:make", append=f"output_key: {key}\n" if key else "")
    got = results(probe(*TANGENT, spec=spec))
    assert got["trace"]["details"]["route"] == "vhv_tangent"
    assert got == demo_results(*TANGENT)


def test_tuple_output_keeps_layer_and_parameter_names(tmp_path, model_file):
    spec = python_spec(tmp_path, f"{model_file(wrap='(logits, x)')}:make")
    got = results(trace(*EAGER, "--params", "head.*,features.0.*", spec=spec))
    assert list(got["trace"]["details"]["layers"]) == ["features.0", "head"]
    assert got == demo_results(*EAGER, "--params", "head.*,features.0.*")


@pytest.mark.parametrize(
    "wrap, key, names",
    [
        ("(None, 3)", None, ["spec.yaml", "output_key", "tuple of 2"]),
        ("{'hidden': x, 'scores': logits}", "logits", ["spec.yaml", "output_key", "'logits'", "hidden, scores"]),
        ("(logits, x)", "5", ["spec.yaml", "output_key", "5"]),
        ("logits", "logits", ["spec.yaml", "output_key", "returns a tensor"]),
    ],
    ids=["no tensor", "missing key", "index out of range", "key on a tensor"],
)
def test_structured_forward_output_refused(tmp_path, model_file, wrap, key, names):
    spec = python_spec(tmp_path, f"{model_file(wrap=wrap)}:make", append=f"output_key: {key}\n" if key else "")
    bad(trace(spec=spec), *names)


@pytest.mark.parametrize("raised", ["ValueError('width must be even')", "KeyError('depth')", "SystemExit(3)",
                                    "AssertionError()"])
def test_python_builder_that_raises(tmp_path, model_file, raised):
    name = model_file(f"def make(num_classes=10):\n    raise {raised}\n")
    bad(trace(spec=python_spec(tmp_path, f"{name}:make")), "spec.yaml", "builder", f"{name}:make",
        raised.partition("(")[0])


@pytest.mark.parametrize("arch, kwargs", [("subprocess:getoutput", "cmd"), ("os:system", "command")])
def test_python_spec_cannot_run_the_standard_library(tmp_path, arch, kwargs):
    marker = tmp_path / "RAN"
    spec = python_spec(tmp_path, arch, append=f"kwargs: {{{kwargs}: 'touch {marker}'}}\n")
    spec.write_text(spec.read_text().replace("num_classes: 10\n", ""))
    bad(trace(spec=spec), "spec.yaml", "'arch'", arch.partition(":")[0], "--trust-package")
    assert not marker.exists()


def test_python_spec_module_outside_its_folder_is_refused_before_import(tmp_path, monkeypatch):
    site, marker = tmp_path / "site", tmp_path / "IMPORTED"
    site.mkdir()
    name = f"fc_outside_{tmp_path.name.replace('-', '_')}"
    (site / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                     "from flatcheck.zoo.demo_cnn import DigitsCNN as make\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, name, raising=False)
    spec = python_spec(tmp_path, f"{name}:make")
    bad(trace(spec=spec), "spec.yaml", name, f"--trust-package {name}")
    assert not marker.exists(), "the module was imported before it was refused"

    # named by the user, the same module is imported and measured like the demo model
    assert results(trace("--json", "-", "-q", "--trust-package", name, spec=spec)) == results(trace("--json", "-", "-q"))
    assert marker.exists()


@pytest.mark.parametrize("name", ["os;rm", "-x", "a..b", ""])
def test_trust_package_not_a_package_name(name):
    bad(trace("--trust-package", name), "--trust-package")


def test_integer_dtype_weights(tmp_path, state):
    sd = dict(state, **{"features.3.weight": state["features.3.weight"].mul(100).round().to(torch.int32)})
    assert sd["features.1.num_batches_tracked"].dtype == torch.int64  # an integer buffer, which stays fine
    bad(trace(ckpt=save(tmp_path, sd)), "bad.safetensors", "features.3.weight", "int32")


@pytest.mark.parametrize("field, value", [("mean", ".nan"), ("std", ".inf"), ("mean", "-.inf"), ("std", ".NaN")])
def test_non_finite_normalisation(tmp_path, field, value):
    other = {"mean": "std", "std": "mean"}[field]
    spec = spec_copy(tmp_path, append=f"{field}: [{value}]\n{other}: [0.5]\n")
    bad(trace(spec=spec), "spec.yaml", f"'{field}'", "finite")


@pytest.mark.parametrize(
    "old, new, key",
    [
        (None, "num_classes: 100\n", "'num_classes'"),
        ("loss: cross_entropy\n", "loss:\n  name: mse\n  name: cross_entropy\n", "'name'"),
    ],
    ids=["top level", "nested"],
)
def test_duplicate_yaml_keys(tmp_path, old, new, key):
    spec = spec_copy(tmp_path, old, new) if old else spec_copy(tmp_path, append=new)
    lines = spec.read_text().splitlines()
    second = max(i for i, text in enumerate(lines, 1) if text.strip().startswith(key.strip("'") + ":"))
    bad(trace(spec=spec), "spec.yaml", "duplicate key", key, f"line {second}")


def test_checkpoint_that_is_a_folder(tmp_path):
    folder = tmp_path / "run.safetensors"
    folder.mkdir()
    bad(trace(ckpt=folder), "run.safetensors", "is a folder")


@pytest.mark.parametrize(
    "write, names",
    [
        (lambda p: p.write_text("epoch 101\n"), ["notes.pt", "neither a torch.save archive nor a pickle"]),
        (lambda p: torch.save(torch.zeros(3), p), ["notes.pt", "not a checkpoint", "single tensor"]),
        (lambda p: torch.save({"epoch": 101}, p), ["notes.pt", "not a checkpoint", "no tensors", "epoch"]),
        (lambda p: torch.save({101: "x"}, p), ["notes.pt", "not a checkpoint", "no tensors"]),
    ],
    ids=["text", "tensor", "dict without tensors", "int keys"],
)
def test_pt_that_is_not_a_checkpoint(tmp_path, write, names):
    path = tmp_path / "notes.pt"
    write(path)
    err = bad(trace(ckpt=path), *names)
    assert "(101)" not in err and "KeyError" not in err


# ---------------------------------------------------------------- CLI, outputs, scans
# Output paths are checked before any probe runs (never_runs makes a probe that runs fail as
# an internal error), files are replaced atomically without losing their mode or symlink,
# and Ctrl-C ends every command the same way, imports included.

import signal  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

EXACT_HEAD = ["--estimator", "exact", "--params", "head.*"]
NOT_ROOT = pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the mode bits say, so there is "
                              "nothing to refuse here (run the suite as an unprivileged user to check it)")


@pytest.fixture
def never_runs(monkeypatch):
    from flatcheck.probes.trace import TraceProbe

    def ran(self, ctx, options):
        raise AssertionError("the probe ran before the output path was checked")

    monkeypatch.setattr(TraceProbe, "run", ran)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_json_under_a_regular_file(tmp_path, never_runs):
    (tmp_path / "notes.txt").write_text("keep")
    bad(trace(*EXACT_HEAD, "--json", tmp_path / "notes.txt" / "out.json"), "--json", "notes.txt", "not a folder")


def test_json_symlink_into_a_missing_folder(tmp_path, never_runs):
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "gone" / "out.json")
    bad(trace(*EXACT_HEAD, "--json", link), "--json", "gone", "does not exist")
    assert link.is_symlink() and os.listdir(tmp_path) == ["out.json"]


@NOT_ROOT
def test_json_onto_a_read_only_file(tmp_path, never_runs):
    out = tmp_path / "out.json"
    out.write_text("keep")
    out.chmod(0o444)
    bad(trace(*EXACT_HEAD, "--json", out), "--json", "out.json", "read-only")
    assert out.read_text() == "keep" and mode(out) == 0o444


@NOT_ROOT
def test_json_into_a_read_only_folder(tmp_path, never_runs):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        bad(trace(*EXACT_HEAD, "--json", folder / "out.json"), "--json", "cannot write", "locked")
    finally:
        folder.chmod(0o755)
    assert os.listdir(folder) == []


def written_report(result, path: Path) -> dict:
    assert result.exit_code == 0, result.stderr
    return json.loads(path.read_text())["results"]["trace"]


def test_json_rewrite_keeps_the_file_mode(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("{}")
    out.chmod(0o640)  # group-readable, not world-readable: a rewrite must not change who can read
    written_report(trace(*EXACT_HEAD, "--json", out, "-q"), out)
    assert mode(out) == 0o640 and os.listdir(tmp_path) == ["out.json"]


def test_json_new_file_follows_the_umask(tmp_path):
    out = tmp_path / "out.json"
    old = os.umask(0o027)
    try:
        written_report(trace(*EXACT_HEAD, "--json", out, "-q"), out)
    finally:
        os.umask(old)
    assert mode(out) == 0o640  # 0o666 less the umask, as open() would make it


def test_json_through_a_symlink_writes_its_target(tmp_path):
    target = tmp_path / "runs" / "report.json"
    target.parent.mkdir()
    target.write_text("{}")
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    report = written_report(trace(*EXACT_HEAD, "--json", link, "-q"), target)
    assert report["value"] > 0
    assert link.is_symlink() and link.resolve() == target
    assert os.listdir(tmp_path / "runs") == ["report.json"]  # no temporary file left beside it


# -- two scans, one --out


def scan_subprocess(*args) -> subprocess.Popen:
    from tests.support.scan import FAST, subprocess_env

    return subprocess.Popen([sys.executable, "-m", "flatcheck", "scan", *FAST, *map(str, args)], cwd=ROOT,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_records(out: Path, count: int, proc: subprocess.Popen) -> None:
    deadline = time.time() + HANG_GUARD
    while (out.read_bytes().count(b"\n") if out.exists() else 0) < count:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() else "timed out"
        time.sleep(0.02)


@pytest.mark.process
def test_second_scan_on_the_same_out_is_refused_and_sigkill_leaves_no_lock(tmp_path):
    from tests.support.scan import CHEAP, lines, models_file, scan

    out = tmp_path / "scan.jsonl"
    names = CHEAP[:2]
    mf = models_file(tmp_path, names)
    holder = scan_subprocess("--models-file", mf, "--probes", "gini", "--out", out)
    try:
        wait_for_records(out, 1, holder)
        holder.send_signal(signal.SIGSTOP)  # mid-scan, holding the file, for as long as this test needs
        before = out.read_bytes()
        # the same command again, as a second terminal or a resubmitted job would run it
        bad(scan("--models-file", mf, "--probes", "gini", "--out", out, "--resume"), "--out", str(out),
            "another scan")
        assert out.read_bytes() == before
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=HANG_GUARD)
    finally:
        holder.kill()
        holder.communicate()
    res = scan("--models-file", mf, "--probes", "gini", "--out", out, "--resume")
    assert res.exit_code == 0, res.stderr
    assert [r["model"] for r in lines(out)] == names  # each model once: nothing written twice


HOLD = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(1e6)")  # killed when done


def test_scan_lock_is_per_rank_shard(tmp_path, monkeypatch):
    """torchrun ranks and job-array shards write OUT.rankN each: holding one blocks no other."""
    from tests.support.scan import lines, scan

    out = tmp_path / "scan.jsonl"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out.with_name("scan.jsonl.rank0"))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "0")
        bad(scan("--timm", "test_resnet", "--probes", "gini", "--out", out), "scan.jsonl.rank0", "another scan")
        monkeypatch.setenv("RANK", "1")
        res = scan("--timm", "test_resnet", "--timm", "test_vit", "--probes", "gini", "--out", out)
        assert res.exit_code == 0, res.stderr
        assert [r["model"] for r in lines(out.with_name("scan.jsonl.rank1"))] == ["test_vit"]
    finally:
        holder.kill()
        holder.communicate()


# -- lmax --k


def test_lmax_k_above_the_parameter_count(monkeypatch):
    import flatcheck.probes.lmax as lmax

    def solver(*args, **kwargs):
        raise AssertionError("Lanczos started before --k was checked")

    monkeypatch.setattr(lmax, "lanczos_top", solver)
    # head.bias: 10 parameters, so 10 eigenvalues
    bad(invoke("lmax", CKPT, "--spec", SPEC, *SMALL, "--params", "head.bias", "--k", "11"), "--k 11", "10 probed")
    bad(probe("--probes", "lmax", "--params", "head.bias", "-o", "lmax.k=11"), "--k 11", "10 probed")


# -- Ctrl-C


LONG_TRACE = ["trace", str(CKPT), "--spec", str(SPEC), "--samples", "512", "--probes-max", "5000", "--rtol", "1e-9"]


# Each wait below returns at a phase of the run, told by the process itself (a line on stderr,
# a library mapped), never after a number of seconds: how far a process gets in a given time
# depends on the machine's load. Each returns what it read of stderr.


def starting(proc: subprocess.Popen) -> str:
    """The entry point's first line, written once its interrupt handler is in place and just
    before the CLI is imported (typer and rich, then torch)."""
    line = proc.stderr.readline()
    assert line.startswith("flatcheck trace: starting"), line
    return line


def once_loaded(library: str):
    """Wait until the process has mapped `library`: it is then inside that import."""

    def wait(proc: subprocess.Popen) -> str:
        while proc.poll() is None:
            try:
                if library in Path(f"/proc/{proc.pid}/maps").read_text():
                    return ""
            except (FileNotFoundError, ProcessLookupError):
                break
            time.sleep(0.002)
        pytest.fail(f"{library} never loaded: the process ended first")

    return wait


def running(proc: subprocess.Popen) -> str:
    """Wait for the probe's own progress line (the ticker's, every PERIOD seconds): the model and
    data are loaded and the run is under way."""
    seen = ""
    while True:
        line = proc.stderr.readline()
        assert line, f"the process ended before its run began:\n{seen}"
        seen += line
        if line.startswith("flatcheck trace") and "elapsed" in line:
            return seen


def then(*waits):
    def wait(proc: subprocess.Popen) -> str:
        return "".join(w(proc) for w in waits)

    return wait


SCRIPT = [str(Path(sys.executable).with_name("flatcheck"))]  # the console script pip made
MODULE = [sys.executable, "-m", "flatcheck"]
PERIOD = "0.2"  # FLATCHECK_PROGRESS_SECONDS: the run's ticker line comes soon after the run starts


@pytest.mark.process
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the imports")
@pytest.mark.parametrize("exe, when", [
    (SCRIPT, starting),  # importing typer and rich
    (SCRIPT, once_loaded("libtorch_cpu")),  # importing torch
    (MODULE, once_loaded("libtorch_cpu")),
    (SCRIPT, once_loaded("_multiarray_umath")),  # numpy, imported by torch's C code, which swallowed the interrupt
    (SCRIPT, then(once_loaded("_multiarray_umath"), running)),  # later: the run
], ids=["starting", "torch", "torch -m", "numpy", "running"])
def test_ctrl_c_at_any_moment(exe, when):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FLATCHECK_PROGRESS_SECONDS": PERIOD}
    proc = subprocess.Popen(exe + LONG_TRACE, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        before = when(proc)
        proc.send_signal(signal.SIGINT)
        # a guard against a hang only: an interrupt that was swallowed lets the run go on to
        # its end, and its exit status fails the check below
        stdout, stderr = proc.communicate(timeout=HANG_GUARD)
    finally:
        proc.kill()
    stderr = before + stderr
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.splitlines()[-1] == "interrupted", stderr
    assert stdout == ""


def test_interrupted_is_said_once_with_the_commands_detail(monkeypatch, capsys):
    # a scan says where its finished models are; the entry point's own word must not repeat it
    from flatcheck import errors

    monkeypatch.setattr(errors, "_told", False)
    assert errors.interrupted("every finished model is in out.jsonl; continue with --resume") == 130
    assert errors.interrupted() == 130
    assert capsys.readouterr().err == "interrupted; every finished model is in out.jsonl; continue with --resume\n"


# ---------------------------------------------------------------- non-finite values
# One bad sample after the first batch (SMALL cuts 64 samples into two batches of 32): only
# the first batch used to be checked, so it gave "Tr(H) = nan ± nan", exit 0.

LATER = 40

OVERFLOW_NET = """
from torch import nn


def make(num_classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))
"""


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_non_finite_input_in_a_later_sample_is_the_datas_fault(tmp_path, value):
    x, y = digit_images()
    x = x.astype(np.float32) / np.float32(255)
    x[LATER, 3, 3] = value
    uri = write_npz(tmp_path / "holes.npz", x, y)
    bad(trace("--data", uri), uri, "split 'train'", f"sample {LATER} ", "non-finite inputs", f"({value})")


@pytest.mark.parametrize(
    "loss, weight, names",
    [("cross_entropy", 1e38, ["outputs are not finite"]), ("mse", 1e20, ["loss (mse) is not finite"])],
    ids=["outputs", "loss"],
)
def test_model_that_overflows_on_a_later_sample(tmp_path, model_file, loss, weight, names):
    # four weights on four pixels that are dark in every image but one: finite float32 weights
    # and inputs whose logit (4e38) or squared error (8e40) is not
    x, y = digit_images()
    x[:, 0, :4] = 0
    x[LATER, 0, :4] = 255
    uri = write_npz(tmp_path / "digits.npz", x, y)
    w = torch.zeros(10, 64)
    w[0, :4] = weight
    ckpt = save(tmp_path, {"1.weight": w, "1.bias": torch.zeros(10)})
    spec = tmp_path / "overflow.yaml"
    spec.write_text(f"source: python\narch: {model_file(OVERFLOW_NET)}:make\nnum_classes: 10\n"
                    f"input_size: [1, 8, 8]\nloss: {loss}\n", encoding="utf-8")
    result = trace("--data", uri, ckpt=ckpt, spec=spec)
    bad(result, str(ckpt), *names, f"data '{uri}' split 'train' sample {LATER},", "--dtype float64")


def corrupt_trace(monkeypatch, details: dict | None = None, **fields) -> None:
    """TraceProbe's own result with `fields` replaced and `details` merged in."""
    import dataclasses

    from flatcheck.probes.trace import TraceProbe

    honest = TraceProbe.run

    def run(self, ctx, options):
        r = honest(self, ctx, options)
        return dataclasses.replace(r, details={**r.details, **(details or {})}, **fields)

    monkeypatch.setattr(TraceProbe, "run", run)


@pytest.mark.parametrize("field, value", [("value", float("nan")), ("stderr", float("inf"))])
def test_probe_with_a_non_finite_result(monkeypatch, field, value):
    corrupt_trace(monkeypatch, **{field: value})
    bad(trace("--json", "-"), f"probe trace gave a non-finite {field} ({value})", "--dtype float64")


def test_json_has_null_where_a_detail_is_not_finite(monkeypatch):
    corrupt_trace(monkeypatch, details={"ratio": float("nan"), "bounds": [float("-inf"), 1.0]})
    result = trace("--json", "-", "--quiet")
    assert result.exit_code == 0, result.stderr

    def refuse(constant):
        raise AssertionError(f"{constant} in JSON")

    details = json.loads(result.stdout, parse_constant=refuse)["results"]["trace"]["details"]
    assert details["ratio"] is None and details["bounds"] == [None, 1.0]


# ---------------------------------------------------------------- gates and their baselines


GATE_RULES = "rules:\n  - {field: trace.value, max_increase: 20%}\n"


def gate(tmp_path, baseline, rules=GATE_RULES, *extra, probes: int = 4):
    cfg = tmp_path / "gates.yaml"
    cfg.write_text(f"probes:\n  trace: {{probes_max: {probes}}}\n" + rules, encoding="utf-8")
    args = ["--baseline", baseline] if baseline is not None else []
    return invoke("gate", CKPT, "--spec", SPEC, *SMALL, "--config", cfg, *args, *extra)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> dict:
    """A real baseline: the same gate's JSON with --no-baseline (the first release of docs/quickstart/ci-gate.md)."""
    return _release(tmp_path_factory, 4)


@pytest.fixture(scope="module")
def release_16(tmp_path_factory) -> dict:
    """The same with 16 probes: narrow enough that the 20 % rule can decide at the same seed."""
    return _release(tmp_path_factory, 16)


def _release(tmp_path_factory, probes: int) -> dict:
    import json

    folder = tmp_path_factory.mktemp("release")
    out = folder / "release.json"
    cfg = folder / "gates.yaml"
    cfg.write_text(f"probes:\n  trace: {{probes_max: {probes}}}\n" + GATE_RULES, encoding="utf-8")
    res = invoke("gate", CKPT, "--spec", SPEC, *SMALL, "--config", cfg, "--no-baseline", "--json", out, "-q")
    assert res.exit_code == 0, res.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def _write(tmp_path, data) -> Path:
    import json

    path = tmp_path / "base.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_gate_baseline_without_results(tmp_path, release):
    bad(gate(tmp_path, _write(tmp_path, {**release, "results": {}})), "base.json", "no results")


@pytest.mark.parametrize("value", ["nan", "abc", None])
def test_gate_baseline_value_not_a_finite_number(tmp_path, release, value):
    data = {**release, "results": {**release["results"], "trace": {**release["results"]["trace"], "value": value}}}
    bad(gate(tmp_path, _write(tmp_path, data)), "base.json", "trace.value", "not a finite number")


@pytest.mark.parametrize("where, key, new", [("model", "arch", "resnet18"), ("model", "parameters", 99),
                                             ("data", "samples", 63), ("data", "split", "test")])
def test_gate_baseline_from_another_model_or_data(tmp_path, release_16, where, key, new):
    data = {**release_16, where: {**release_16[where], key: new}}
    bad(gate(tmp_path, _write(tmp_path, data), probes=16), "base.json", f"{where}.{key}", "--allow-foreign-baseline")
    allowed = gate(tmp_path, _write(tmp_path, data), GATE_RULES, "--allow-foreign-baseline", "-q", probes=16)
    assert allowed.exit_code in (0, 1), allowed.stderr  # compared, as asked


def test_gate_baseline_too_wide_for_the_rule(tmp_path, release):
    """4 probes of the demo's trace (about ±20 %) can never decide a 20 % rule at another seed."""
    bad(gate(tmp_path, _write(tmp_path, release), GATE_RULES, "--seed", "1"), "cannot pass an unchanged model",
        "make the baseline, and run the gate, with probes_max ≥")


def test_gate_rule_with_min_above_max(tmp_path):
    bad(gate(tmp_path, None, "rules:\n  - {field: trace.value, min: 2, max: 1}\n"), "rules[0]", "min 2 above max 1")


def test_trace_rtol_with_hutchpp():
    bad(trace("--estimator", "hutchpp", "--rtol", "0.1"), "--rtol", "hutchinson")


def test_hutchpp_larger_than_memory_is_refused_before_allocating():
    bad(trace("--estimator", "hutchpp", "--probes-max", "3000000"), "--probes-max 3000000", "GiB", "fits", "--max-memory")


# ---------------------------------------------------------------- outputs that clobber inputs, and the one error line
# An output path that names an input (or another output) is refused before the run, whichever
# way it names it; stderr holds the one error line and nothing else, read raw from a real
# process (not a terminal, without -q); click's usage errors follow the same contract.

MAX_SEED = 2**63 - 1


def clone(source: Path, folder: Path, how: str) -> tuple[Path, Path]:
    """A copy of `source` in `folder`, and a second path naming the same file `how`."""
    path = folder / source.name
    path.write_bytes(source.read_bytes())
    other = folder / f"other{source.suffix}"
    if how == "same":
        return path, path
    if how == "dotdot":
        (folder / "sub").mkdir()
        return path, folder / "sub" / ".." / source.name
    if how == "symlink":
        other.symlink_to(path)
    else:
        os.link(path, other)
    return path, other


@pytest.mark.parametrize("how", ["same", "dotdot", "symlink", "hardlink"])
@pytest.mark.parametrize("what", ["checkpoint", "spec", "npz"])
def test_json_onto_an_input_is_refused_before_the_run(tmp_path, never_runs, what, how):
    source = {"checkpoint": CKPT, "spec": SPEC}.get(what)
    if source is None:
        x, y = digit_images()
        write_npz(tmp_path / "digits.npz", x, y)
        source = tmp_path / "digits.npz"
        (tmp_path / "data").mkdir()
    folder = tmp_path / "data" if what == "npz" else tmp_path
    path, alias = clone(source, folder, how)
    before = path.read_bytes()
    kwargs = {"ckpt": path} if what == "checkpoint" else {"spec": path} if what == "spec" else {}
    extra = ["--data", f"npz:{path}"] if what == "npz" else []
    flag = {"checkpoint": "CHECKPOINT", "spec": "--spec", "npz": "--data"}[what]
    bad(trace(*EXACT_HEAD, *extra, "--json", alias, **kwargs), flag, "--json", "same file", "overwrite an input")
    assert path.read_bytes() == before


@pytest.mark.parametrize("what", ["found spec", "spec.yaml", "module", "image", "inside data", "plot"])
def test_json_onto_an_input_found_after_the_command_line_is_refused(tmp_path, never_runs, monkeypatch, what):
    """Inputs the command line does not name: the spec found beside the checkpoint, a python
    spec's own module, the data folder's files. Each was overwritten by the report, exit 0."""
    monkeypatch.chdir(tmp_path)
    count = ["--probes-max", "8"]
    if what in ("found spec", "spec.yaml"):
        ckpt = tmp_path / "m.safetensors"
        ckpt.write_bytes(CKPT.read_bytes())
        target = tmp_path / ("m.yaml" if what == "found spec" else "spec.yaml")
        target.write_text(SPEC.read_text())
        result = invoke("trace", ckpt, *SMALL, *count, "--json", target)
    elif what == "module":
        target = tmp_path / "mymodels.py"
        target.write_text("from flatcheck.zoo.demo_cnn import DigitsCNN\n\n\ndef build():\n    return DigitsCNN()\n")
        result = invoke("trace", "--model", "python:mymodels:build", "--random-init", "--num-classes", "10",
                        "--input-size", "1,8,8", *SMALL, *count, "--json", "mymodels.py")
    else:
        x, y = digit_images()
        data = write_folder(tmp_path / "imgs", x, y)
        target = sorted((tmp_path / "imgs" / "train").rglob("*.png"))[0]
        if what == "inside data":  # a new image there would be read as a sample next time
            target = tmp_path / "imgs" / "train" / "0" / "new.png"
        if what == "plot":  # spectrum's own output file
            result = invoke("spectrum", CKPT, "--spec", SPEC, *SMALL, "--data", data, "--lanczos-steps", "4",
                            "--plot", target)
        else:
            result = trace("--data", data, *count, "--json", target)
    before = target.read_bytes() if target.exists() else None
    err = bad(result, "--plot" if what == "plot" else "--json", str(target.name))
    assert ("lies inside the data folder" if what in ("image", "inside data", "plot") else
            "would overwrite an input") in err
    assert (target.read_bytes() if target.exists() else None) == before
    if what == "image":  # a report beside the data, not read as a sample, is written as asked
        report = tmp_path / "imgs" / "report.json"
        assert trace("--data", data, *count, "--json", report).exit_code == 101  # never_runs: got past the check


def gate_outputs(tmp_path: Path, *flags_and_paths) -> tuple:
    cfg = tmp_path / "gates.yaml"
    cfg.write_text("probes:\n  trace: {probes_max: 4}\n" + GATE_RULES, encoding="utf-8")
    base = tmp_path / "base.json"
    base.write_text("{}", encoding="utf-8")
    named = {"gates.yaml": cfg, "base.json": base, "g.out": tmp_path / "g.out"}
    args = [named.get(a, a) for a in flags_and_paths]
    return invoke("gate", CKPT, "--spec", SPEC, *SMALL, "--config", cfg, *args), cfg, base


@pytest.mark.parametrize("args, names", [
    (["--no-baseline", "--json", "g.out", "--junit", "g.out", "--summary", "g.out"], ["--junit", "--summary"]),
    (["--no-baseline", "--json", "g.out", "--junit", "g.out"], ["--junit", "--json", "replace the other"]),
    (["--no-baseline", "--json", "g.out", "--summary", "g.out"], ["--summary", "--json", "replace the other"]),
    (["--no-baseline", "--junit", "gates.yaml"], ["--config", "--junit", "overwrite an input"]),
    (["--baseline", "base.json", "--summary", "base.json"], ["--baseline", "--summary", "overwrite an input"]),
    (["--baseline", "base.json", "--json", "base.json"], ["--baseline", "--json", "overwrite an input"]),
], ids=["all-three", "junit-json", "summary-json", "junit-config", "summary-baseline", "json-baseline"])
def test_gate_outputs_that_clash(tmp_path, never_runs, args, names):
    result, cfg, base = gate_outputs(tmp_path, *args)
    bad(result, *names, "same file")
    assert not (tmp_path / "g.out").exists() and base.read_text() == "{}" and cfg.read_text().startswith("probes:")


@pytest.mark.parametrize("flag", ["--summary", "--junit", "--json"])
def test_an_empty_output_path_says_it_is_empty(tmp_path, never_runs, flag):
    # `--summary "$GITHUB_STEP_SUMMARY"` outside GitHub Actions: the variable is unset
    result, _, _ = gate_outputs(tmp_path, "--no-baseline", flag, "")
    err = bad(result, flag, "the path is empty")
    assert ("GITHUB_STEP_SUMMARY is set only inside GitHub Actions" in err) == (flag == "--summary")


def run_cli(*args, timeout: float = HANG_GUARD) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(MODULE + [str(a) for a in args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess, *names: str) -> str:
    """The contract on the raw stderr of a real process: nothing before or after the line."""
    assert proc.returncode == 2, f"exit {proc.returncode}\nstderr: {proc.stderr!r}"
    assert proc.stdout == "", proc.stdout
    # progress lines ("flatcheck trace: starting …" within a second) may come first
    lines = proc.stderr.splitlines(keepends=True)
    assert all(line.startswith("flatcheck") for line in lines[:-1]), repr(proc.stderr)
    error = lines[-1] if lines else ""
    assert error.startswith("error:") and error.endswith("\n"), repr(proc.stderr)
    for name in names:
        assert name in error, f"{name!r} not in {error!r}"
    return error


@pytest.mark.process
def test_error_during_the_run_is_the_only_line_on_stderr(tmp_path):
    # the progress display is live when a later batch fails (no -q)
    x, y = digit_images()
    x = x.astype(np.float32) / np.float32(255)
    x[LATER, 3, 3] = np.nan
    uri = write_npz(tmp_path / "holes.npz", x, y)
    one_error_line(run_cli("trace", CKPT, "--spec", SPEC, *SMALL, "--probes-max", "8", "--data", uri),
                   f"sample {LATER} ", "non-finite inputs")


@pytest.mark.process
def test_a_run_without_q_writes_only_progress_lines_to_stderr_when_not_a_terminal():
    proc = run_cli("trace", CKPT, "--spec", SPEC, *SMALL, *EXACT_HEAD)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and lines and all(line.startswith("flatcheck") for line in lines), repr(proc.stderr)
    assert "Tr(" in proc.stdout


@pytest.mark.process
@pytest.mark.parametrize("args, names", [
    (["trace", CKPT, "--spec", SPEC, "--samples", "x"], ["--samples", "integer", "trace --help"]),
    (["gate", CKPT, "--spec", SPEC, "--config", SPEC, "--confidence", "high"], ["--confidence", "number"]),
    # the checkpoint alone may say what it is: when it does not, the ways are listed
    (["trace", CKPT], ["--spec", "--model", "does not say which model"]),
    (["trace"], ["CHECKPOINT", "--spec", "--model"]),
    (["nosuch", CKPT], ["nosuch", "command", "flatcheck --help"]),
    (["trace", CKPT, "--spec", SPEC, "--bogus"], ["--bogus", "no such option"]),
], ids=["samples-x", "confidence-high", "no-spec", "no-checkpoint", "unknown-command", "unknown-flag"])
def test_usage_errors_are_one_line(args, names):
    one_error_line(run_cli(*args), *names)


@pytest.mark.process
def test_help_and_bare_command_still_show_help():
    helped = run_cli("trace", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("Usage:") and "--samples" in helped.stdout
    bare = run_cli()
    assert bare.returncode == 2 and "Usage:" in bare.stdout + bare.stderr and "trace" in bare.stdout + bare.stderr


@pytest.mark.parametrize("seed", ["99999999999999999999", str(2**64), str(MAX_SEED + 1)])
def test_seed_beyond_64_bits(seed):
    bad(trace("--seed", seed), "--seed", seed, f"0 to {MAX_SEED}")


def test_largest_seed_runs():
    # adaptive-sharpness offsets the seed for its second stream: the largest seed must still fit torch
    result = invoke("adaptive-sharpness", CKPT, "--spec", SPEC, *SMALL, "--seed", MAX_SEED, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["seed"] == MAX_SEED


@pytest.mark.process
@pytest.mark.parametrize("args", [["explain", "trace"],
                                  ["trace", CKPT, "--spec", SPEC, "--samples", "16", "--probes-max", "2"]])
def test_a_reader_that_closes_stdout_ends_the_command_quietly_with_141(args):
    """`flatcheck … | head -1`: the reader going away is neither a failed gate (1) nor an
    internal error (101): no message, the status a shell gives a process SIGPIPE ended (141)."""
    proc = subprocess.Popen([*MODULE, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "FLATCHECK_PROGRESS_SECONDS": "600"})
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=HANG_GUARD) == 141, err
    assert "error" not in err and "Traceback" not in err, err


# ---------------------------------------------------------------- outputs: no file of another kind destroyed


@pytest.fixture(scope="module")
def report_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "r.json"
    result = trace(*EXACT_HEAD, "--json", path, "-q")
    assert result.exit_code == 0, result.output
    return path


def scan_file(path: Path) -> Path:
    path.write_text(json.dumps({"schema_version": "2.5", "kind": "scan", "model": "m", "status": "ok",
                                "results": {}}) + "\n")
    return path


@pytest.mark.parametrize("flag", ["--csv", "--json"])
def test_report_refuses_to_write_over_its_own_input(tmp_path, report_file, flag):
    """`flatcheck report scan.jsonl --csv scan.jsonl` replaced the scan with its table, exit 0."""
    path = tmp_path / "r.json"
    path.write_bytes(report_file.read_bytes())
    before = path.read_bytes()
    bad(invoke("report", path, flag, path), flag, "same file", "overwrite an input")
    assert path.read_bytes() == before


@pytest.mark.parametrize("what, said", [("checkpoint", "a checkpoint"), ("spec", "a model spec"),
                                        ("scan", "a scan's JSONL records"), ("npz", "a data file")])
@pytest.mark.parametrize("flag", ["--csv", "--json"])
def test_report_refuses_to_write_over_a_file_of_another_kind(tmp_path, report_file, what, said, flag):
    """`report r.json --csv model.safetensors` replaced a checkpoint with a 117-byte CSV."""
    target = tmp_path / f"target.{what}"
    if what == "checkpoint":
        target.write_bytes(CKPT.read_bytes())
    elif what == "spec":
        target.write_bytes(SPEC.read_bytes())
    elif what == "scan":
        scan_file(target)
    else:
        x, y = digit_images()
        np.savez(target.with_suffix(".npz"), x_train=x, y_train=y)
        target = target.with_suffix(".npz")
    before = target.read_bytes()
    bad(invoke("report", report_file, flag, target), flag, str(target), said, "would destroy it")
    assert target.read_bytes() == before


def test_report_rewrites_its_own_earlier_output(tmp_path, report_file):
    csv_out, json_out = tmp_path / "t.csv", tmp_path / "t.json"
    for _ in range(2):
        result = invoke("report", report_file, "--csv", csv_out, "--json", json_out, "-q")
        assert result.exit_code == 0, result.output
    assert csv_out.read_text().startswith("model,") and json.loads(json_out.read_text())["models"]


@pytest.mark.parametrize("flag, what", [("--json", "checkpoint"), ("--json", "scan"), ("--summary", "checkpoint")])
def test_a_probe_command_refuses_an_output_over_a_file_of_another_kind(tmp_path, never_runs, flag, what):
    target = tmp_path / "target"
    target.write_bytes(CKPT.read_bytes()) if what == "checkpoint" else scan_file(target)
    before = target.read_bytes()
    command = ("gate", CKPT, "--spec", SPEC, "--config", ROOT / "examples" / "gates.yaml", "--no-baseline") \
        if flag == "--summary" \
        else ("trace", CKPT, "--spec", SPEC, *EXACT_HEAD)
    bad(invoke(*command, "--data", "digits", flag, target), flag, str(target), "would destroy it")
    assert target.read_bytes() == before


def test_sniffed_kinds():
    from flatcheck.report.io import sniff_kind

    assert sniff_kind(CKPT) == "checkpoint" and sniff_kind(SPEC) == "spec"
    assert sniff_kind(ROOT / "examples" / "gates.yaml") == "gates"
    assert sniff_kind(ROOT / "docs" / "track_training.png") == "figure"


# ---------------------------------------------------------------- a --json path that fails after the run


def test_a_json_path_gone_after_the_run_keeps_the_report_elsewhere(tmp_path, monkeypatch):
    """`(sleep 4; rm -rf jd3) & flatcheck trace … --json jd3/out.json` ended in exit 2 after
    every probe, the report nowhere. Now it is written beside the target (or in the temporary
    folder, when the target's folder is gone), the table is printed and the error line says where."""
    import flatcheck.api as api
    from tests.support.outputs import lose_folder_after

    folder, spare_folder = lose_folder_after(monkeypatch, api, "run", tmp_path)
    line = shown_then_refused(trace(*EXACT_HEAD, "--json", folder / "out.json"), "--json", "out.json",
                              "does not exist", "the output is in")
    spare = Path(line.rsplit("the output is in ", 1)[1].split(" instead")[0])
    assert spare.parent == spare_folder and json.loads(spare.read_text())["results"]["trace"]["value"] > 0


# ---------------------------------------------------------------- internal errors that were bad input


@pytest.mark.parametrize("text, said", [("", "nothing (an empty file)"), ("- 1\n- 2\n", "a list")])
def test_a_spec_that_is_no_mapping(tmp_path, text, said):
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    bad(trace(spec=spec), str(spec), "top level must be a mapping", said)


def test_an_embedded_spec_that_is_no_mapping(tmp_path):
    from flatcheck.models.embed import embed_spec

    ckpt = tmp_path / "m.safetensors"
    ckpt.write_bytes(CKPT.read_bytes())
    embed_spec(ckpt, [1, 2])  # as a hand-edited header would hold it
    bad(invoke("trace", ckpt, *SMALL, "--data", "digits"), str(ckpt), "embedded spec", "a mapping", "a list")


@pytest.mark.parametrize("size", ["1e400", "1e30T"])
def test_max_memory_beyond_any_size(size):
    bad(trace("--max-memory", size), "--max-memory", size, "finite size")


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the address space from /proc")
def test_torch_that_cannot_load_under_an_address_space_limit_is_one_line():
    """Under `ulimit -v 2500000` importing torch failed with a traceback (and exit 1, a failed
    gate's code). Now: one line, exit 2, and what the limit leaves."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (2_500_000 * 1024, resource.RLIM_INFINITY))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*MODULE, "trace", str(CKPT), "--spec", str(SPEC), "--data", "digits"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=HANG_GUARD, preexec_fn=limited)
    if proc.returncode == 0:
        pytest.skip("torch loads within 2.5 GB of address space here")
    one_error_line(proc, "cannot load", "ulimit -v allows 2.38 GiB of address space and leaves this process",
                   "raise ulimit -v")


@pytest.mark.parametrize("args, said", [
    (["--data", "cifar10"], ["data 'cifar10' needs a data root", "--data-root", "FLATCHECK_DATA_ROOT"]),
    (["--data=mnist", "--data-root", "/nonexistent/data"], ["--data-root /nonexistent/data: does not exist"]),
])
def test_a_missing_data_root_is_told_before_torch_is_imported(args, said):
    """It was said after importing torch and loading the model (51 s on a loaded machine); the
    line now comes before the 'starting · importing torch' line would."""
    env = {k: v for k, v in os.environ.items() if k != "FLATCHECK_DATA_ROOT"}
    proc = subprocess.run([*MODULE, "trace", str(CKPT), "--spec", str(SPEC), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=HANG_GUARD)
    one_error_line(proc, *said)
    assert proc.stderr.count("\n") == 1, proc.stderr  # nothing else: torch was never imported


@pytest.mark.parametrize("data, split, expected", [
    ("cifar10", "train", "cifar-10-batches-py/data_batch_1"), ("svhn", "test", "test_32x32.mat"),
])
def test_a_data_root_without_the_sets_files_is_told_before_torch_is_imported(tmp_path, data, split, expected):
    """A root that exists but lacks the data set's files was told after the torch import and
    the model load (11 s for a resnet50); now before either."""
    root = tmp_path / "emptyroot"
    root.mkdir()
    proc = subprocess.run([*MODULE, "trace", str(CKPT), "--spec", str(SPEC), "--data", data, "--split", split,
                           "--data-root", str(root)], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD)
    one_error_line(proc, f"data '{data}': expected {root / expected} (not found)", "download it once")
    assert proc.stderr.count("\n") == 1, proc.stderr  # nothing else: torch was never imported


def test_a_data_root_without_the_sets_files_is_refused_before_the_model_is_found(tmp_path, monkeypatch):
    """In process (the entry point's check bypassed) the command refuses it before it resolves
    and builds the model."""
    import flatcheck.models.resolve as resolve

    def never(*args, **kwargs):
        raise AssertionError("the model was resolved before the data root was checked")

    monkeypatch.setattr(resolve, "resolve", never)
    bad(trace("--data", "cifar100", "--data-root", tmp_path), f"expected {tmp_path / 'cifar-100-python' / 'train'}")
