from __future__ import annotations

import hashlib
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from flatcheck.errors import CheckpointError
from flatcheck.models.checkpoint import apply_state_dict, load_checkpoint
from flatcheck.models.spec import CheckpointSpec
from flatcheck.zoo.demo_cnn import DigitsCNN


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return DigitsCNN(num_classes=10).eval()


@pytest.fixture
def weights(model) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    trained = DigitsCNN(num_classes=10)
    with torch.no_grad():
        trained.features[1].running_mean.uniform_()
    return {k: v.clone() for k, v in trained.state_dict().items()}


def assert_loaded(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    for key, value in model.state_dict().items():
        assert torch.equal(value, weights[key]), key


def roundtrip(tmp_path, model, weights, obj, name="ckpt.pt", spec=CheckpointSpec()):
    path = tmp_path / name
    torch.save(obj, path)
    loaded = load_checkpoint(path, spec)
    apply_state_dict(model, loaded.state_dict)
    assert_loaded(model, weights)
    return loaded


def test_safetensors_roundtrip(tmp_path, model, weights):
    path = tmp_path / "w.safetensors"
    save_file(weights, str(path))
    loaded = load_checkpoint(path)
    assert loaded.format == "safetensors"
    assert loaded.path == path
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    apply_state_dict(model, loaded.state_dict)
    assert_loaded(model, weights)


def test_torch_plain_roundtrip(tmp_path, model, weights):
    loaded = roundtrip(tmp_path, model, weights, OrderedDict(weights), name="w.pth")
    assert loaded.format == "torch"
    assert loaded.sha256 == hashlib.sha256((tmp_path / "w.pth").read_bytes()).hexdigest()


@pytest.mark.parametrize("key", ["state_dict", "model", "model_state_dict", "ema", "state_dict_ema", "model_ema"])
def test_nested_auto(tmp_path, model, weights, key):
    obj = {"epoch": 12, "optimizer": {"lr": 0.1, "momentum": [0.9]}, "name": "run-3", key: weights}
    roundtrip(tmp_path, model, weights, obj, name="nested.bin")


def test_model_weights_preferred_over_ema(tmp_path, model, weights):
    ema = {k: torch.zeros_like(v) for k, v in weights.items()}
    roundtrip(tmp_path, model, weights, {"ema": ema, "state_dict": weights, "epoch": 3})
    # ...but the EMA copy can be asked for explicitly.
    loaded = load_checkpoint(tmp_path / "ckpt.pt", CheckpointSpec(key="ema"))
    assert all(torch.count_nonzero(v) == 0 for v in loaded.state_dict.values())


def test_top_level_tensors_with_leftovers(tmp_path, model, weights):
    roundtrip(tmp_path, model, weights, {**weights, "epoch": 7, "meta": {"note": "x"}})


def test_dotted_key(tmp_path, model, weights):
    obj = {"ema": {"module": weights, "decay": 0.999}, "epoch": 2}
    roundtrip(tmp_path, model, weights, obj, spec=CheckpointSpec(key="ema.module"))


def test_dotted_key_literal_dot(tmp_path, model, weights):
    roundtrip(tmp_path, model, weights, {"ema.module": weights}, spec=CheckpointSpec(key="ema.module"))


def test_missing_key_lists_top_level(tmp_path, weights):
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": weights, "epoch": 1}, path)
    with pytest.raises(CheckpointError, match=r"'ema\.module' not found.*state_dict, epoch"):
        load_checkpoint(path, CheckpointSpec(key="ema.module"))


def test_module_prefix_stripped(tmp_path, model, weights):
    obj = {"state_dict": {f"module.{k}": v for k, v in weights.items()}}
    roundtrip(tmp_path, model, weights, obj)


def test_compile_and_ddp_prefixes_stripped(tmp_path, model, weights):
    roundtrip(tmp_path, model, weights, {f"module._orig_mod.{k}": v for k, v in weights.items()})


def test_strip_prefix(tmp_path, model, weights):
    obj = {f"model.net.{k}": v for k, v in weights.items()}
    roundtrip(tmp_path, model, weights, obj, spec=CheckpointSpec(strip_prefix="model.net."))


def test_strip_prefix_matching_nothing(tmp_path, weights):
    path = tmp_path / "ckpt.pt"
    torch.save(weights, path)
    with pytest.raises(CheckpointError, match="strip_prefix 'backbone.' matches no key"):
        load_checkpoint(path, CheckpointSpec(strip_prefix="backbone."))


def test_missing_num_batches_tracked_tolerated(tmp_path, model, weights):
    trimmed = {k: v for k, v in weights.items() if not k.endswith("num_batches_tracked")}
    apply_state_dict(model, trimmed)
    assert_loaded(model, {**weights, "features.1.num_batches_tracked": model.features[1].num_batches_tracked})


def test_dtype_cast(model, weights):
    apply_state_dict(model, {k: v.double() if v.is_floating_point() else v for k, v in weights.items()})
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert_loaded(model, weights)


def test_truncated_safetensors(tmp_path, weights):
    path = tmp_path / "w.safetensors"
    save_file(weights, str(path))
    data = path.read_bytes()
    for cut in (len(data) // 2, 5):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"not a valid safetensors file: .*w\.safetensors"):
            load_checkpoint(path)


@pytest.mark.parametrize("name", ["w.safetensors", "w.pt"])
def test_garbage_bytes(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"garbage bytes, definitely not weights\x00\x01")
    with pytest.raises(CheckpointError, match=r"(not a valid safetensors file|not a PyTorch checkpoint): .*w\."):
        load_checkpoint(path)


def test_empty_torch_file(tmp_path):
    path = tmp_path / "w.pt"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint: .*w.pt is neither a torch.save archive nor a pickle"):
        load_checkpoint(path)


def touch_marker(path: str) -> None:  # pragma: no cover - must never run
    Path(path).write_text("pwned")


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (touch_marker, (self.marker,))


class ShellPayload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class PlainObject:
    def __init__(self) -> None:
        self.weights = torch.ones(2)


@pytest.mark.parametrize("kind", ["function", "os.system", "raw-pickle", "class"])
def test_code_pickle_refused_and_not_run(tmp_path, kind):
    marker = tmp_path / "marker"
    path = tmp_path / "evil.pt"
    if kind == "function":
        torch.save({"state_dict": {"w": torch.ones(1)}, "hook": Payload(marker)}, path)
    elif kind == "os.system":
        torch.save({"w": torch.ones(1), "hook": ShellPayload(marker)}, path)
    elif kind == "raw-pickle":
        path.write_bytes(pickle.dumps(ShellPayload(marker), protocol=4))
    else:
        torch.save({"model": PlainObject()}, path)
    with pytest.raises(CheckpointError, match=r"refusing to execute pickled code in .*evil\.pt; save a plain state_dict"):
        load_checkpoint(path)
    assert not marker.exists()


def test_refusal_names_the_global(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": PlainObject()}, path)
    with pytest.raises(CheckpointError, match=r"it needs \S*PlainObject"):
        load_checkpoint(path)


def test_mismatch_reports_all_groups(model, weights):
    bad = dict(weights)
    del bad["features.0.weight"]
    bad["extra.weight"] = torch.zeros(3)
    bad["head.weight"] = torch.zeros(5, 32)
    with pytest.raises(CheckpointError) as info:
        apply_state_dict(model, bad, source="run.pt")
    message = str(info.value)
    assert "\n" not in message and message.startswith("run.pt")
    assert "missing keys 1 (features.0.weight)" in message
    assert "unexpected keys 1 (extra.weight)" in message
    assert "head.weight: checkpoint (5, 32) vs model (10, 32)" in message


def test_long_lists_truncated(model):
    with pytest.raises(CheckpointError, match=r"missing keys 12 \(.*, \.\.\. and 7 more\)"):
        apply_state_dict(model, {})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_refused(model, weights, value):
    bad = dict(weights)
    bad["head.weight"] = bad["head.weight"].clone()
    bad["head.weight"][0, 0] = value
    bad["features.1.running_var"] = bad["features.1.running_var"].clone().fill_(value)
    with pytest.raises(CheckpointError, match=r"non-finite.*2 tensors: features\.1\.running_var, head\.weight"):
        apply_state_dict(model, bad)


def test_float64_overflow_refused(model, weights):
    bad = {k: v.double() if v.is_floating_point() else v for k, v in weights.items()}
    bad["head.bias"][0] = 1e300
    with pytest.raises(CheckpointError, match="head.bias"):
        apply_state_dict(model, bad)


def test_tied_weights_saved_once():
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(5, 4)
            self.out = nn.Linear(4, 5, bias=False)
            self.out.weight = self.embed.weight

    target = Tied()
    value = torch.randn(5, 4)
    apply_state_dict(target, {"out.weight": value})
    assert torch.equal(target.embed.weight, value)


def test_unknown_extension(tmp_path):
    path = tmp_path / "w.h5"
    path.write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"w\.h5.*allowed: \.safetensors, \.pt, \.pth, \.bin"):
        load_checkpoint(path)


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="not found.*nope.safetensors"):
        load_checkpoint(tmp_path / "nope.safetensors")


def test_no_tensors(tmp_path):
    path = tmp_path / "w.pt"
    torch.save({"epoch": 1, "config": {"lr": 0.1}}, path)
    with pytest.raises(CheckpointError, match=r"w.pt: not a checkpoint: no tensors found \(top-level keys: epoch, config\)"):
        load_checkpoint(path)


def test_integer_weights_refused(model, weights):
    stored = dict(weights, **{"features.0.weight": weights["features.0.weight"].round().to(torch.int32),
                              "head.bias": weights["head.bias"].round().to(torch.int64)})
    with pytest.raises(CheckpointError) as info:
        apply_state_dict(model, stored, source="q.safetensors")
    assert str(info.value).startswith(
        "q.safetensors stores 2 floating-point tensors of the model as integers: "
        "features.0.weight (int32), head.bias (int64)"
    )


def test_integer_buffers_stay_fine(model, weights):
    # num_batches_tracked is an int64 buffer in the model too: same kind, nothing to refuse
    assert weights["features.1.num_batches_tracked"].dtype == torch.int64
    apply_state_dict(model, weights)
    assert_loaded(model, weights)


def test_folder_is_named_a_folder(tmp_path):
    folder = tmp_path / "run1.safetensors"
    folder.mkdir()
    with pytest.raises(CheckpointError, match=r"checkpoint .*run1.safetensors is a folder, not a file"):
        load_checkpoint(folder)


@pytest.mark.parametrize(
    "obj, says",
    [
        (torch.zeros(3, 2), r"not a checkpoint: it holds a single tensor of shape \(3, 2\), where a mapping"),
        ([torch.zeros(3)], r"not a checkpoint: it holds a list of 1 items, where a mapping"),
        ({"epoch": 3}, r"not a checkpoint: no tensors found \(top-level keys: epoch\)"),
        ({101: "x", 7: 1}, r"not a checkpoint: no tensors found \(top-level keys: 101, 7\)"),
        ({}, r"not a checkpoint: no tensors found \(top-level keys: none\)"),
    ],
    ids=["tensor", "list", "dict without tensors", "int keys", "empty dict"],
)
def test_pt_that_is_not_a_checkpoint(tmp_path, obj, says):
    path = tmp_path / "thing.pt"
    torch.save(obj, path)
    with pytest.raises(CheckpointError, match=f"thing.pt: {says}"):
        load_checkpoint(path)


@pytest.mark.parametrize("content", [b"hello world\n", b"PK\x03\x04 not really a zip", bytes(range(256))])
def test_bytes_that_are_no_pickle_say_so(tmp_path, content):
    # the weights-only unpickler reports an unknown opcode byte as a bare KeyError ('101' for "e")
    path = tmp_path / "notes.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert message == (f"not a PyTorch checkpoint: {path} is neither a torch.save archive nor a pickle; "
                       f"save the weights with torch.save(model.state_dict()) or use .safetensors")


# ---------------------------------------------------------------- loaded in the checkpoint's precision


def _float64_demo(tmp_path: Path, weights: dict[str, torch.Tensor]) -> Path:
    path = tmp_path / "f64.safetensors"
    torch.manual_seed(3)
    # values float32 cannot hold exactly: a load through float32 would round them
    wide = {k: (v.double() + 1e-9 * torch.randn(v.shape, dtype=torch.float64)) if v.is_floating_point() else v
            for k, v in weights.items()}
    save_file(wide, str(path))
    return path


def test_float64_weights_are_loaded_as_stored_then_cast(tmp_path, weights):
    """The model was built in float32 and loaded, rounding a float64 checkpoint before --dtype
    float64 cast it back. Now the weights are the file's to the bit in float64, and a float32
    run says it rounds them."""
    import warnings

    from flatcheck.models.load import build_with_weights
    from flatcheck.models.spec import load_spec
    from tests.support.cli import SPEC

    path = _float64_demo(tmp_path, weights)
    stored = load_checkpoint(path).state_dict
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64 from float64: nothing rounded, nothing said
        model, _, _ = build_with_weights(load_spec(SPEC), path, dtype=torch.float64)
    for key, value in model.state_dict().items():
        assert value.dtype == stored[key].dtype and torch.equal(value, stored[key]), key
    with pytest.warns(UserWarning, match=r"stores float64 weights; measuring in float32 rounds \d+ of its tensors"):
        narrow, _, _ = build_with_weights(load_spec(SPEC), path, dtype=torch.float32)
    assert all(p.dtype == torch.float32 for p in narrow.parameters())


def test_float64_weights_beyond_float32_refused_when_measured_in_float32(tmp_path, weights):
    from flatcheck.models.load import build_with_weights
    from flatcheck.models.spec import load_spec
    from tests.support.cli import SPEC

    wide = {k: v.double() if v.is_floating_point() else v for k, v in weights.items()}
    wide["head.bias"][0] = 1e300
    path = tmp_path / "big.safetensors"
    save_file(wide, str(path))
    with pytest.raises(CheckpointError, match=r"head\.bias.*beyond float32's range.*float64 \(--dtype\)"):
        build_with_weights(load_spec(SPEC), path, dtype=torch.float32)
    model, _, _ = build_with_weights(load_spec(SPEC), path, dtype=torch.float64)
    assert model.head.bias[0].item() == 1e300


def test_cli_float64_values_match_measure_on_a_float64_checkpoint(tmp_path, weights):
    """Through the CLI, --dtype float64 on a float64 checkpoint gives measure()'s value on the
    same float64 model: the exact trace of the head to rounding (a float32 detour gave ~1e-8)."""
    import json

    import flatcheck
    from flatcheck.data import create_dataset
    from tests.support.cli import SPEC, invoke

    path = _float64_demo(tmp_path, weights)
    n = 64
    args = ["trace", path, "--spec", SPEC, "--data", "digits", "--samples", n, "--dtype", "float64",
            "--estimator", "exact", "--params", "head.*", "--no-layers", "--quiet", "--json", "-"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    cli = json.loads(result.stdout)["results"]["trace"]["value"]
    model = DigitsCNN(num_classes=10).double().eval()
    model.load_state_dict(load_checkpoint(path).state_dict)
    data = create_dataset("digits", split="train")
    x = torch.stack([data[i][0] for i in range(n)]).double()
    y = torch.tensor([int(data[i][1]) for i in range(n)])
    live = flatcheck.measure(model, (x, y), probes={"trace": {"estimator": "exact"}}, params=["head.*"],
                             dtype="float64").results["trace"].value
    assert cli == pytest.approx(live, rel=1e-12)


def test_a_rounding_cast_is_in_the_json_under_quiet(tmp_path, weights):
    """With -q the float64 → float32 rounding ("rounds 12 tensors (relative 6.0e-08)") was said
    nowhere, not even in the JSON: meta.checkpoint.cast now holds it whatever stderr shows."""
    import json

    from tests.support.cli import SPEC, invoke

    path = _float64_demo(tmp_path, weights)
    floats = sum(v.is_floating_point() for v in weights.values())
    args = ["trace", path, "--spec", SPEC, "--data", "digits", "--samples", 16, "--estimator", "exact",
            "--params", "head.*", "--no-layers", "--json", "-"]
    result = invoke(*args, "-q")
    assert result.exit_code == 0, result.output
    assert "rounds" not in result.stderr
    cast = json.loads(result.stdout)["checkpoint"]["cast"]
    assert cast["stored_dtype"] == "float64" and cast["dtype"] == "float32"
    assert cast["rounded_tensors"] == floats and cast["relative_rounding"] == torch.finfo(torch.float32).eps / 2
    assert f"measuring in float32 rounds {floats} of its tensors (relative 6.0e-08)" in cast["warning"]
    # measured as stored: the dtype is recorded, nothing rounded, nothing said
    kept = json.loads(invoke(*args, "-q", "--dtype", "float64").stdout)["checkpoint"]["cast"]
    assert kept == {"stored_dtype": "float64", "dtype": "float64", "rounded_tensors": 0,
                    "relative_rounding": 0.0, "warning": None}
