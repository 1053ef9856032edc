from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from flatcheck.errors import InputError, SpecError
from flatcheck.models.spec import CheckpointSpec, LossSpec, ModelSpec, load_spec, spec_from_dict

SPECS = Path(__file__).resolve().parents[1] / "model_specs"


def write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def spec_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "bad.yaml" in message and "\n" not in message
    return message


def test_shipped_spec_fields():
    spec = load_spec(SPECS / "resnet18_cifar.yaml")
    assert spec.source == "python"
    assert spec.arch == "flatcheck.zoo.cifar_resnet:resnet18_cifar"
    assert spec.input_size == (3, 32, 32)
    assert spec.mean == pytest.approx((0.4914, 0.4822, 0.4465))
    assert spec.std == pytest.approx((0.2470, 0.2435, 0.2616))
    assert spec.loss == LossSpec("cross_entropy", 0.0)
    assert spec.checkpoint == CheckpointSpec()
    assert spec.kwargs == {}
    assert spec.path == SPECS / "resnet18_cifar.yaml"
    assert spec.sha256 == hashlib.sha256(spec.path.read_bytes()).hexdigest()


def test_full_spec(tmp_path):
    path = write(
        tmp_path,
        """
source: timm
arch: test_vit
kwargs: {drop_rate: 0.1}
num_classes: 7
input_size: [3, 160, 160]
mean: [0.5, 0.5, 0.5]
std: [0.25, 0.25, 0.25]
loss: {name: label-smoothing, alpha: 0.2}
head: head
checkpoint: {key: ema.module, strip_prefix: "backbone."}
""",
        "full.yaml",
    )
    spec = load_spec(path)
    assert spec.kwargs == {"drop_rate": 0.1}
    assert spec.num_classes == 7
    assert spec.loss == LossSpec("label_smoothing", 0.2)
    assert spec.checkpoint == CheckpointSpec("ema.module", "backbone.")
    assert spec.head == "head"


@pytest.mark.parametrize(
    "loss, expected",
    [
        ("mse", LossSpec("mse", 0.0)),
        ("sigmoid-mse", LossSpec("sigmoid_mse", 0.0)),
        ("label_smoothing", LossSpec("label_smoothing", 0.1)),
        ({"name": "label_smoothing"}, LossSpec("label_smoothing", 0.1)),
        (None, LossSpec()),
    ],
)
def test_loss_forms(loss, expected):
    spec = spec_from_dict({"source": "python", "arch": "m:f", "loss": loss})
    assert spec.loss == expected
    assert spec.path is None and spec.sha256 is None


def test_loss_spec_in_code():
    assert LossSpec("sigmoid-mse").name == "sigmoid_mse"
    assert LossSpec("label_smoothing").alpha == 0.1
    with pytest.raises(SpecError):
        LossSpec("hinge")
    with pytest.raises(SpecError):
        LossSpec("label_smoothing", 1.0)


@pytest.mark.parametrize(
    "text, field",
    [
        ("source: timm\narch: test_vit\nlr: 0.1\n", "'lr'"),
        ("source: timm\narch: test_vit\nloss: {name: mse, beta: 1}\n", "loss.beta"),
        ("source: timm\narch: test_vit\ncheckpoint: {keys: x}\n", "checkpoint.keys"),
        ("source: timm\narch: test_vit\nnum_classes: ten\n", "'num_classes'"),
        ("source: timm\narch: test_vit\nnum_classes: 0\n", "'num_classes'"),
        ("source: timm\narch: test_vit\nnum_classes: true\n", "'num_classes'"),
        ("source: timm\narch: [a]\n", "'arch'"),
        ("source: timm\narch: test_vit\nkwargs: [1]\n", "'kwargs'"),
        ("source: timm\narch: test_vit\nkwargs: {pretrained: true}\n", "'kwargs'"),
        ("source: timm\narch: test_vit\nkwargs: {num_classes: 3}\n", "'kwargs'"),
        ("source: timm\narch: test_vit\nhead: 3\n", "'head'"),
        ("arch: test_vit\n", "'source'"),
        ("source: timm\n", "'arch'"),
        ("source: keras\narch: x\n", "'source'"),
        ("source: python\narch: no_colon\n", "'arch'"),
        ("source: timm\narch: test_vit\ninput_size: [3, 32]\n", "'input_size'"),
        ("source: timm\narch: test_vit\ninput_size: [3, -1, 32]\n", "'input_size'"),
        ("source: timm\narch: test_vit\ninput_size: 32\n", "'input_size'"),
        ("source: timm\narch: test_vit\nmean: [0.5]\nstd: [0]\n", "'std'"),
        ("source: timm\narch: test_vit\nmean: [a]\nstd: [1]\n", "'mean'"),
        ("source: timm\narch: test_vit\nmean: [0.5]\n", "'mean'"),
        ("source: timm\narch: test_vit\nmean: [0.5, 0.5]\nstd: [1]\n", "'mean'"),
        ("source: timm\narch: test_vit\ninput_size: [3, 8, 8]\nmean: [0.5]\nstd: [1]\n", "'mean'"),
        ("source: timm\narch: test_vit\nloss: hinge\n", "loss.name"),
        ("source: timm\narch: test_vit\nloss: {name: label_smoothing, alpha: 1.5}\n", "loss.alpha"),
        ("source: timm\narch: test_vit\nloss: {name: mse, alpha: 0.1}\n", "loss.alpha"),
        ("source: timm\narch: test_vit\nloss: [mse]\n", "'loss'"),
        ("source: timm\narch: test_vit\ncheckpoint: state_dict\n", "'checkpoint'"),
    ],
)
def test_field_errors(tmp_path, text, field):
    assert field in spec_error(tmp_path, text)


def test_unknown_field_lists_allowed(tmp_path):
    message = spec_error(tmp_path, "source: timm\narch: test_vit\nlr: 0.1\n")
    assert "allowed: arch, checkpoint, head" in message


def test_bad_source_lists_allowed(tmp_path):
    message = spec_error(tmp_path, "source: keras\narch: x\n")
    assert "python" in message and "timm" in message and "torchvision" in message


def test_wrong_type_shows_value(tmp_path):
    message = spec_error(tmp_path, "source: timm\narch: test_vit\nnum_classes: ten\n")
    assert "positive integer" in message and "'ten'" in message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", ""])
def test_non_mapping_yaml(tmp_path, text):
    assert "mapping" in spec_error(tmp_path, text)


def test_not_yaml(tmp_path):
    assert "YAML" in spec_error(tmp_path, "source: [unclosed\n")


def test_missing_file(tmp_path):
    with pytest.raises(SpecError, match="nope.yaml"):
        load_spec(tmp_path / "nope.yaml")


def test_spec_error_is_input_error():
    assert issubclass(SpecError, InputError)
    with pytest.raises(InputError):
        spec_from_dict({"source": "timm"})


def test_spec_from_dict_names_model_spec():
    with pytest.raises(SpecError, match="model spec: missing required field 'arch'"):
        spec_from_dict({"source": "timm"})


def test_modelspec_defaults_in_code():
    spec = ModelSpec(source="python", arch="m:f")
    assert spec.kwargs == {} and spec.loss == LossSpec() and spec.checkpoint == CheckpointSpec()
