from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from flatcheck.data.preprocess import Preprocess
from flatcheck.errors import SpecError
from flatcheck.models.sources import (
    build_model,
    find_head,
    list_sources,
    register_source,
    resolve_preprocess,
)
from flatcheck.models.spec import load_spec, spec_from_dict

SPECS = Path(__file__).resolve().parents[1] / "model_specs"
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)


def spec(**fields):
    return spec_from_dict(fields)


def test_sources_registered():
    assert {"timm", "torchvision", "python"} <= set(list_sources())


@pytest.mark.parametrize(
    "name, head, params, shape",
    [
        ("demo_digits.yaml", "head", 14_410, (2, 1, 8, 8)),
        ("resnet18_cifar.yaml", "fc", 11_173_962, (2, 3, 32, 32)),
        ("vgg_small_cifar.yaml", "classifier", 1_571_456, (2, 3, 32, 32)),
    ],
)
def test_shipped_python_specs(name, head, params, shape):
    loaded = load_spec(SPECS / name)
    model = build_model(loaded)
    assert not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == params
    assert find_head(model, loaded) == head
    # The explicit head and the detected one must agree.
    assert find_head(model, dataclasses.replace(loaded, head=None)) == head
    with torch.no_grad():
        assert model(torch.zeros(shape)).shape == (2, 10)
    pre = resolve_preprocess(loaded, model)
    assert pre.input_size == tuple(shape[1:])
    if name == "demo_digits.yaml":
        assert pre.mean is None and pre.std is None
    else:
        assert pre.mean == pytest.approx(CIFAR_MEAN)


def test_vgg_small_matches_table():
    model = build_model(load_spec(SPECS / "vgg_small_cifar.yaml"))
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert model.classifier.bias is None and model.classifier.in_features == 2048


def test_shipped_vit_spec():
    from timm.data import resolve_data_config

    loaded = load_spec(SPECS / "vit_small_patch16_224.yaml")
    model = build_model(loaded)
    assert find_head(model, loaded) == "head"
    assert find_head(model, dataclasses.replace(loaded, head=None)) == "head"
    timm_cfg = resolve_data_config({}, model=model)
    pre = resolve_preprocess(loaded, model)
    assert pre.input_size == (3, 224, 224)
    assert pre.mean == pytest.approx(timm_cfg["mean"])
    assert pre.std == pytest.approx(timm_cfg["std"])
    assert pre.interpolation == timm_cfg["interpolation"]


@pytest.mark.parametrize("arch, head", [("test_vit", "head"), ("test_resnet", "fc"), ("test_convnext", "head.fc")])
def test_timm_tiny_models(arch, head):
    import timm

    if arch not in timm.list_models("test_*"):
        pytest.skip(f"timm has no {arch}")
    s = spec(source="timm", arch=arch, num_classes=5)
    model = build_model(s)
    assert find_head(model, s) == head
    assert model.get_classifier().out_features == 5


def test_spec_overrides_timm_defaults():
    s = spec(source="timm", arch="test_resnet", input_size=[3, 64, 64], mean=[0.1, 0.2, 0.3], std=[1, 1, 1])
    pre = resolve_preprocess(s, build_model(s))
    assert pre == Preprocess((3, 64, 64), (0.1, 0.2, 0.3), (1.0, 1.0, 1.0), "bilinear")


def test_timm_unknown_arch_suggests():
    with pytest.raises(SpecError, match=r"'arch'.*did you mean .*test_vit"):
        build_model(spec(source="timm", arch="test_vitt"))


def test_timm_bad_kwargs():
    with pytest.raises(SpecError, match="'kwargs'"):
        build_model(spec(source="timm", arch="test_resnet", kwargs={"no_such_argument": 1}))


def test_torchvision_resnet18():
    s = spec(source="torchvision", arch="resnet18", num_classes=10)
    model = build_model(s)
    assert find_head(model, s) == "fc"
    assert model.fc.out_features == 10
    pre = resolve_preprocess(s, model)
    assert pre.input_size == (3, 224, 224)
    assert pre.mean == pytest.approx((0.485, 0.456, 0.406))
    assert pre.std == pytest.approx((0.229, 0.224, 0.225))


def test_torchvision_unknown_arch():
    with pytest.raises(SpecError, match=r"'arch'.*resnet18"):
        build_model(spec(source="torchvision", arch="resnet_18"))


def test_python_model_next_to_spec(tmp_path):
    (tmp_path / "my_local_net.py").write_text(
        "from torch import nn\n"
        "def make(num_classes=3, width=4):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(6, width), nn.ReLU(), nn.Linear(width, num_classes))\n"
    )
    path = tmp_path / "net.yaml"
    path.write_text("source: python\narch: my_local_net:make\nnum_classes: 2\nkwargs: {width: 5}\ninput_size: [6]\n")
    loaded = load_spec(path)
    model = build_model(loaded)
    assert find_head(model, loaded) == "3"
    assert model[3].out_features == 2 and model[1].out_features == 5
    assert str(tmp_path) not in sys.path
    assert resolve_preprocess(loaded, model) == Preprocess((6,), None, None)


@pytest.mark.parametrize(
    "arch, match",
    [
        ("flatcheck_no_such_module:f", "cannot import"),
        ("flatcheck.zoo.demo_cnn:Nope", "no attribute"),
    ],
)
def test_python_import_errors(arch, match):
    with pytest.raises(SpecError, match=f"'arch'.*{match}"):
        build_model(spec(source="python", arch=arch))


def test_python_not_a_module():
    with pytest.raises(SpecError, match="not a torch.nn.Module"):
        build_model(spec(source="python", arch="collections:OrderedDict"))


def test_find_head_errors():
    demo = dict(source="python", arch="flatcheck.zoo.demo_cnn:DigitsCNN")
    model = build_model(spec(**demo))
    with pytest.raises(SpecError, match="'head'.*no module"):
        find_head(model, spec(**demo, head="classifier"))
    with pytest.raises(SpecError, match="'head'.*BatchNorm2d"):
        find_head(model, spec(**demo, head="features.1"))
    with pytest.raises(SpecError, match="10 outputs but num_classes is 3"):
        find_head(model, spec(**demo, num_classes=3, head="head"))
    headless = spec(source="python", arch="torch.nn:ReLU")
    with pytest.raises(SpecError, match="set field 'head'"):
        find_head(build_model(headless), headless)


def test_one_by_one_conv_head():
    s = spec(source="torchvision", arch="squeezenet1_0", num_classes=4)
    assert find_head(build_model(s), s) == "classifier.1"


def test_register_custom_source(monkeypatch):
    from flatcheck.models import sources

    monkeypatch.setattr(sources, "_REGISTRY", dict(sources._REGISTRY))

    @register_source("unit_test_source", defaults=lambda s, m: Preprocess((2,), (0.0, 0.0), (1.0, 1.0)))
    def _build(s):
        return nn.Linear(2, s.num_classes or 3)

    s = spec(source="unit_test_source", arch="anything", num_classes=4)
    model = build_model(s)
    assert "unit_test_source" in list_sources()
    assert find_head(model, s) == ""
    assert resolve_preprocess(s, model).input_size == (2,)
