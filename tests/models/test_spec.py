from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from flatcheck.errors import InputError, SpecError
from flatcheck.models.spec import CheckpointSpec, LossSpec, ModelSpec, load_spec, spec_from_dict

SPECS = Path(__file__).resolve().parents[2] / "model_specs"


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
        ("source: timm\narch: test_vit\nmean: [.nan]\nstd: [1]\n", "'mean'"),
        ("source: timm\narch: test_vit\nmean: [0.5]\nstd: [.inf]\n", "'std'"),
        ("source: timm\narch: test_vit\nmean: [-.inf]\nstd: [1]\n", "'mean'"),
        ("source: timm\narch: test_vit\nmean: [0.5]\nstd: [.NaN]\n", "'std'"),
        ("source: timm\narch: test_vit\noutput_key: -1\n", "'output_key'"),
        ("source: timm\narch: test_vit\noutput_key: ''\n", "'output_key'"),
        ("source: timm\narch: test_vit\noutput_key: true\n", "'output_key'"),
        ("source: timm\narch: test_vit\noutput_key: [logits]\n", "'output_key'"),
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


def test_non_finite_normalisation_says_finite(tmp_path):
    message = spec_error(tmp_path, "source: timm\narch: test_vit\nmean: [0.5]\nstd: [.inf]\n")
    assert "field 'std' must be a non-empty list of finite positive numbers, got [inf]" in message


@pytest.mark.parametrize("value, expected", [("logits", "logits"), ("' out '", "out"), ("0", 0), ("2", 2), (None, None)])
def test_output_key(tmp_path, value, expected):
    text = "source: timm\narch: test_vit\n" + (f"output_key: {value}\n" if value is not None else "")
    assert load_spec(write(tmp_path, text)).output_key == expected


# ---------------------------------------------------------------- duplicate keys


@pytest.mark.parametrize(
    "text, key, line, first",
    [
        ("source: timm\narch: test_vit\nnum_classes: 10\nnum_classes: 100\n", "'num_classes'", 4, 3),
        ("source: timm\narch: a\narch: b\n", "'arch'", 3, 2),
        ("source: timm\narch: test_vit\nloss:\n  name: mse\n  name: cross_entropy\n", "'name'", 5, 4),
        ("source: timm\narch: test_vit\nkwargs: {depth: 2, depth: 3}\n", "'depth'", 3, 3),
    ],
)
def test_duplicate_keys_refused(tmp_path, text, key, line, first):
    message = spec_error(tmp_path, text)
    assert f"duplicate key {key} at line {line} (first at line {first})" in message


def test_yaml_merge_may_override(tmp_path):
    # `<<: *base` then an explicit key is YAML's override idiom, not a duplicate
    text = "source: timm\narch: test_vit\nbase: &b {drop_rate: 0.1, depth: 2}\n"
    from flatcheck.models.yamlfile import load_yaml

    data = load_yaml(text + "kwargs:\n  <<: *b\n  depth: 3\n", "x.yaml")
    assert data["kwargs"] == {"drop_rate": 0.1, "depth": 3}


def test_load_yaml_files_and_error_class(tmp_path):
    from flatcheck.errors import ConfigError
    from flatcheck.models.yamlfile import load_yaml

    good = write(tmp_path, "a: 1\n", "good.yaml")
    assert load_yaml(good, "--config good.yaml", error=ConfigError) == {"a": 1}
    assert load_yaml(b"a: [1, 2]\n", "bytes") == {"a": [1, 2]}
    cases = [
        (write(tmp_path, "a: 1\nb: 2\na: 3\n", "dup.yaml"), "duplicate key 'a' at line 3 (first at line 1)"),
        (tmp_path / "none.yaml", "file not found"),
        (tmp_path, "is a folder"),
        (write(tmp_path, "a: [1\n", "broken.yaml"), "not valid YAML"),
    ]
    for source, message in cases:
        with pytest.raises(ConfigError) as info:
            load_yaml(source, "--config FILE", error=ConfigError)
        assert str(info.value).startswith(f"--config FILE: {message}") and "\n" not in str(info.value)
    # PyYAML's own name for a parsed string is not shown: the message names the file once, first
    with pytest.raises(ConfigError, match=r"--config FILE: not valid YAML \(.* at line 2, column 1") as info:
        load_yaml(tmp_path / "broken.yaml", "--config FILE", error=ConfigError)
    assert "<unicode string>" not in str(info.value)
    (tmp_path / "latin1.yaml").write_bytes(b"a: caf\xe9\n")
    with pytest.raises(SpecError, match="latin1.yaml: not valid UTF-8"):
        load_yaml(tmp_path / "latin1.yaml", "latin1.yaml")


def test_spec_folder_is_not_a_spec(tmp_path):
    with pytest.raises(SpecError, match="is a folder"):
        load_spec(tmp_path)
