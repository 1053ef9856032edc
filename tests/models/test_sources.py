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

SPECS = Path(__file__).resolve().parents[2] / "model_specs"
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
        build_model(spec(source="python", arch=arch), trust_packages=("flatcheck_no_such_module",))


def test_python_not_a_module():
    with pytest.raises(SpecError, match="not a torch.nn.Module"):
        build_model(spec(source="python", arch="collections:OrderedDict"), trust_packages=("collections",))


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
        find_head(build_model(headless, trust_packages=("torch",)), headless)


def test_one_by_one_conv_head():
    s = spec(source="torchvision", arch="squeezenet1_0", num_classes=4)
    assert find_head(build_model(s), s) == "classifier.1"


def test_register_custom_source(monkeypatch):
    from flatcheck.models import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @register_source("unit_test_source", defaults=lambda s, m: Preprocess((2,), (0.0, 0.0), (1.0, 1.0)))
    def _build(s):
        return nn.Linear(2, s.num_classes or 3)

    s = spec(source="unit_test_source", arch="anything", num_classes=4)
    model = build_model(s)
    assert "unit_test_source" in list_sources()
    assert find_head(model, s) == ""
    assert resolve_preprocess(s, model).input_size == (2,)


# ---------------------------------------------------------------- what a python spec may import


MARKER_MODULE = """
from pathlib import Path
Path({marker!r}).write_text("imported")
from torch import nn
def make(num_classes=2):
    return nn.Linear(3, num_classes)
"""


def python_spec(folder: Path, arch: str, **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "net.yaml"
    lines = [f"source: python", f"arch: {arch}", "num_classes: 2", "input_size: [3]"]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def outside_module(tmp_path, monkeypatch):
    """An importable module outside the spec's folder whose import leaves a marker file."""
    name = f"fc_outside_{tmp_path.name.replace('-', '_')}"
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "IMPORTED"
    (site / f"{name}.py").write_text(MARKER_MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(site))
    yield name, marker
    sys.modules.pop(name, None)


def test_untrusted_module_refused_before_import(tmp_path, outside_module):
    name, marker = outside_module
    loaded = load_spec(python_spec(tmp_path / "specs", f"{name}:make"))
    with pytest.raises(SpecError, match=f"net.yaml: field 'arch': refusing to import '{name}'.*--trust-package {name}"):
        build_model(loaded)
    assert not marker.exists() and name not in sys.modules


def test_trust_package_allows_it(tmp_path, outside_module):
    name, marker = outside_module
    loaded = load_spec(python_spec(tmp_path / "specs", f"{name}:make"))
    assert build_model(loaded, trust_packages=(name,)).out_features == 2
    assert marker.read_text() == "imported"


@pytest.mark.parametrize(
    "arch, kwargs",
    [
        ("subprocess:getoutput", "{cmd: 'touch {marker}'}"),
        ("os:system", "{command: 'touch {marker}'}"),
        ("flatcheck.zoo.demo_cnn:nn.Linear", "{in_features: 3, out_features: 2}"),
    ],
)
def test_standard_library_and_torch_refused(tmp_path, arch, kwargs):
    marker = tmp_path / "RAN"
    path = tmp_path / "evil.yaml"
    path.write_text(f"source: python\narch: {arch}\nkwargs: {kwargs.replace('{marker}', str(marker))}\n")
    with pytest.raises(SpecError, match="evil.yaml: field 'arch'.*(refusing to import|not trusted)"):
        build_model(load_spec(path))
    assert not marker.exists()


def test_callable_reached_through_an_allowed_file_is_checked(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "sneaky_net.py").write_text("import os\nfrom subprocess import getoutput\n")
    for arch, origin in (("sneaky_net:getoutput", "subprocess"), ("sneaky_net:os.system", "posix")):
        with pytest.raises(SpecError, match=f"defined in module '{origin}', which is not trusted"):
            build_model(load_spec(python_spec(folder, arch)))


def test_dunder_attributes_refused():
    with pytest.raises(SpecError, match="no attribute"):
        build_model(spec(source="python", arch="flatcheck.zoo.demo_cnn:__builtins__"))


def test_local_file_shadowing_a_loaded_module_refused(tmp_path):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "json.py").write_text("def make(num_classes=2):\n    raise SystemExit('ran')\n")
    with pytest.raises(SpecError, match="already loaded from elsewhere.*rename"):
        build_model(load_spec(python_spec(folder, "json:make")))


def test_local_package_in_the_spec_folder(tmp_path):
    folder = tmp_path / "specs"
    package = folder / f"fc_pkg_{tmp_path.name.replace('-', '_')}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text("from torch import nn\ndef make(num_classes=2):\n    return nn.Linear(3, num_classes)\n")
    try:
        assert build_model(load_spec(python_spec(folder, f"{package.name}.nets:make"))).out_features == 2
    finally:
        for name in (package.name, f"{package.name}.nets"):
            sys.modules.pop(name, None)


def test_embedded_spec_needs_trust_package(tmp_path):
    # A spec that came inside a checkpoint: neither the built-in packages nor files
    # beside the checkpoint are trusted; only what the user names.
    (tmp_path / "beside.py").write_text("from torch import nn\ndef make(num_classes=2):\n    return nn.Linear(3, 2)\n")
    fields = dict(source="python", arch="flatcheck.zoo.demo_cnn:DigitsCNN", num_classes=10)
    embedded = spec_from_dict(fields, path=tmp_path / "ckpt.safetensors", embedded=True)
    assert embedded.embedded and not spec_from_dict(fields).embedded
    with pytest.raises(SpecError, match="embedded in a checkpoint.*--trust-package flatcheck"):
        build_model(embedded)
    assert build_model(embedded, trust_packages=("flatcheck.zoo",)).head.out_features == 10
    beside = spec_from_dict(dict(source="python", arch="beside:make"), path=tmp_path / "c.pt", embedded=True)
    with pytest.raises(SpecError, match="embedded in a checkpoint"):
        build_model(beside)
    assert "beside" not in sys.modules


def test_load_spec_embedded_flag(tmp_path):
    path = python_spec(tmp_path, "flatcheck.zoo.demo_cnn:DigitsCNN")
    assert load_spec(path, embedded=True).embedded and not load_spec(path).embedded


@pytest.mark.parametrize(
    "body, shown",
    [
        ("raise ValueError('bad width')", "ValueError: bad width"),
        ("raise RuntimeError('no such layer')", "RuntimeError: no such layer"),
        ("raise SystemExit(3)", "SystemExit: 3"),
        ("return {}['missing']", "KeyError: 'missing'"),
    ],
)
def test_builder_exception_names_spec_and_builder(tmp_path, body, shown):
    folder = tmp_path / "specs"
    folder.mkdir()
    name = f"fc_failing_{abs(hash(body))}"
    (folder / f"{name}.py").write_text(f"def make(num_classes=2):\n    {body}\n")
    try:
        with pytest.raises(SpecError) as info:
            build_model(load_spec(python_spec(folder, f"{name}:make")))
    finally:
        sys.modules.pop(name, None)
    assert str(info.value) == f"{folder / 'net.yaml'}: field 'arch': builder '{name}:make' failed ({shown})"


# ---------------------------------------------------------------- forwards that return more than logits


class _Net(nn.Module):
    """Two layers whose forward wraps its logits as `wrap` says."""

    def __init__(self, wrap=lambda logits, x: logits):
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(1))
        self.wrap = wrap

    def forward(self, x):
        return self.wrap(self.head(torch.tanh(self.body(x))) * self.scale, x)


@dataclasses.dataclass
class _Plain:
    hidden: torch.Tensor
    logits: torch.Tensor


class _ModelOutput(dict):
    """What HF's ModelOutput is to flatcheck: a dict whose keys are also attributes."""

    def __getattr__(self, name):
        return self[name]


WRAPS = {
    "tuple": (lambda z, x: (z, x.sum()), None),
    "tuple, index": (lambda z, x: (x, z), 1),
    "list, None first": (lambda z, x: [None, z, x], None),
    "dict, logits key": (lambda z, x: {"hidden": x, "logits": z}, None),
    "dict, first tensor": (lambda z, x: {"loss": None, "scores": z, "hidden": x}, None),
    "dict, key": (lambda z, x: {"hidden": x, "out": z}, "out"),
    "dict, index": (lambda z, x: {"hidden": x, "out": z}, 1),
    "ModelOutput": (lambda z, x: _ModelOutput(hidden=x, logits=z), None),
    "dataclass": (lambda z, x: _Plain(hidden=x, logits=z), None),
    "dataclass, attribute": (lambda z, x: _Plain(hidden=z, logits=x), "hidden"),
}


def _built(wrap, key, monkeypatch) -> nn.Module:
    from flatcheck.models import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    torch.manual_seed(0)
    register_source("unit_test_wrapped")(lambda s: _Net(wrap))
    return build_model(spec(source="unit_test_wrapped", arch="net", output_key=key))


@pytest.mark.parametrize("case", list(WRAPS))
def test_structured_output_gives_the_logits(case, monkeypatch):
    wrap, key = WRAPS[case]
    model = _built(wrap, key, monkeypatch)
    torch.manual_seed(0)
    plain = _Net()
    x = torch.randn(5, 3)
    assert torch.equal(model(x), plain(x))
    # nothing renamed: checkpoints, --params globs, per-layer rows and the head see the same names
    assert list(model.state_dict()) == list(plain.state_dict()) == ["scale", "body.weight", "body.bias",
                                                                    "head.weight", "head.bias"]
    assert [n for n, _ in model.named_modules()] == ["", "body", "head"]


def test_structured_output_gives_the_same_gradient(monkeypatch):
    model = _built(WRAPS["tuple"][0], None, monkeypatch)
    torch.manual_seed(0)
    plain = _Net()
    x = torch.randn(5, 3)
    grads = [torch.autograd.grad(m(x).square().sum(), m.head.weight)[0] for m in (model, plain)]
    assert torch.equal(*grads)


@pytest.mark.parametrize(
    "wrap, key, match",
    [
        (lambda z, x: (None, 3), None, r"returned a tuple of 2 \(NoneType, int\) with no tensor.*'output_key'"),
        (lambda z, x: {"hidden": x}, "logits", r"'output_key' 'logits' is not in the model's output, a dict with keys hidden"),
        (lambda z, x: (z, x), 2, r"'output_key' 2 is not in the model's output, a tuple of 2"),
        (lambda z, x: {"n": 3, "z": z}, "n", r"'output_key' 'n' selects int, not a tensor"),
        (lambda z, x: z, "logits", r"'output_key' is 'logits' but the model's forward returns a tensor"),
        (lambda z, x: "text", None, r"returned a str with no tensor"),
    ],
)
def test_structured_output_errors(wrap, key, match, monkeypatch):
    model = _built(wrap, key, monkeypatch)
    with pytest.raises(SpecError, match=f"model spec: .*{match}"):
        model(torch.randn(2, 3))


def test_a_found_spec_imports_a_module_of_its_folder_only_when_told(tmp_path):
    """A spec the user named (load_spec) imports its folder's module; the same spec found beside
    a checkpoint (models.discover sets `found`) does so only under --trust-package, and its
    refusal names the file found and the flag; installed trusted packages stay allowed."""
    name = "found_spec_net_31"
    marker = tmp_path / "ran"
    (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                         "from flatcheck.zoo.demo_cnn import DigitsCNN as net\n")
    fields = dict(source="python", arch=f"{name}:net", num_classes=10)
    how = f"{tmp_path / 'spec.yaml'}, the spec found in the checkpoint's folder"
    found = spec_from_dict(fields, path=tmp_path / "spec.yaml", found=how)
    assert found.discovered and not spec_from_dict(fields, path=tmp_path / "spec.yaml").discovered
    try:
        with pytest.raises(SpecError, match=rf"^{how}: field 'arch': refusing to import '{name}' from "
                                            rf"{tmp_path / name}\.py .*--trust-package {name}"):
            build_model(found)
        with pytest.raises(SpecError, match=f"--trust-package {name}"):
            build_model(found, trust_packages=("flatcheck",))  # another package's trust is not this one's
        assert not marker.exists()
        assert build_model(found, trust_packages=(name,)).head.out_features == 10 and marker.exists()
        zoo = spec_from_dict(dict(source="python", arch="flatcheck.zoo.demo_cnn:DigitsCNN"),
                             path=tmp_path / "spec.yaml", found=how)
        assert build_model(zoo).head.out_features == 10
    finally:
        sys.modules.pop(name, None)
