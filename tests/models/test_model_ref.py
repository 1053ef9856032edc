"""A model by name (--model), by its checkpoint alone (embedded spec, STEM.yaml, spec.yaml,
config.json), the spec-field flags every command shares, `flatcheck spec`, `embed-spec`,
--pretrained from a local cache, and flatcheck.load_model."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import flatcheck
from flatcheck.models.header import read_header
from flatcheck.models.sources import build_model
from flatcheck.models.spec import load_spec
from tests.support.cli import CKPT as DEMO, SPEC as DEMO_SPEC, FAST_JSON as FAST, ROOT, copy_demo, invoke, refused, run_json
from tests.support.cifar import write_cifar10

pytestmark = pytest.mark.workflow  # whole workflows, seconds each: make test-all only


TV_CIFAR = ROOT / "model_specs" / "resnet18_torchvision_cifar10.yaml"
DEMO_REF = "python:flatcheck.zoo.demo_cnn:DigitsCNN"


def spec_of(*args) -> tuple[dict, dict]:
    """`flatcheck spec …`: the fields it writes and each field's origin comment."""
    result = invoke("spec", *args)
    assert result.exit_code == 0, result.output
    fields = yaml.safe_load(result.stdout)
    origins = {}
    for line in result.stdout.splitlines():
        if line.startswith("# ") and ": " in line and not line.startswith("# resolved"):
            name, _, origin = line[2:].partition(": ")
            origins[name] = origin
    return fields, origins


def data_section(path: Path) -> bytes:
    _, start = read_header(path)
    return path.read_bytes()[start:]


# ---------------------------------------------------------------- --model and the flags


def test_model_ref_runs_like_the_spec_it_names():
    by_spec = run_json("trace", DEMO, "--spec", DEMO_SPEC, "--data", "digits", *FAST)
    by_ref = run_json("trace", DEMO, "--model", DEMO_REF, "--num-classes", "10", "--input-size", "1,8,8",
                      "--set", "head=head", "--data", "digits", *FAST)
    assert by_ref["results"]["trace"]["value"] == by_spec["results"]["trace"]["value"]
    model = by_ref["model"]
    assert model["resolved_spec"] == {"source": "python", "arch": "flatcheck.zoo.demo_cnn:DigitsCNN",
                                      "num_classes": 10, "input_size": [1, 8, 8], "loss": "cross_entropy",
                                      "head": "head"}
    assert model["spec_origins"]["arch"] == f"flag --model {DEMO_REF}"
    assert model["spec_origins"]["num_classes"] == "flag --num-classes"
    assert model["spec_origins"]["input_size"] == "flag --input-size"
    assert model["spec_origins"]["head"] == "flag --set head"
    assert model["spec_origins"]["loss"] == "default"
    assert by_spec["model"]["spec_origins"]["input_size"] == f"spec file {DEMO_SPEC}"
    assert by_ref["weights"] == "checkpoint" and by_ref["checkpoint"]["path"] == str(DEMO)


def test_flags_override_the_spec_file_and_say_so():
    fields, origins = spec_of("--spec", DEMO_SPEC, "--mean", "0.5", "--std", "0.25", "--set", "loss=mse",
                              "--set", "checkpoint.strip_prefix=net.")
    assert fields["mean"] == [0.5] and fields["std"] == [0.25] and fields["loss"] == "mse"
    assert fields["checkpoint"] == {"strip_prefix": "net."} and fields["num_classes"] == 10
    assert origins["mean"] == "flag --mean" and origins["std"] == "flag --std"
    assert origins["loss"] == "flag --set loss" and origins["checkpoint"] == "flag --set checkpoint"
    assert origins["num_classes"] == f"spec file {DEMO_SPEC}"
    # a square size is an RGB image: the one parser scan uses too
    fields, _ = spec_of("--model", "timm:test_vit", "--input-size", "64", "--set", "kwargs.img_size=64")
    assert fields["input_size"] == [3, 64, 64] and fields["kwargs"] == {"img_size": 64}


@pytest.mark.parametrize("args, named", [
    (["--set", "colour=red"], "--set colour=red: unknown spec field 'colour'"),
    (["--set", "num_classes=many"], "--set num_classes=many"),
    (["--set", "head"], "--set expects FIELD=VALUE"),
    (["--set", "arch.x=1"], "only kwargs, loss, checkpoint take FIELD.KEY=VALUE"),
    (["--num-classes", "0"], "--num-classes"),
    (["--input-size", "3,8"], "got '3,8' (2 numbers): an image takes C,H,W"),
    (["--mean", "a,b"], "--mean expects comma-separated numbers"),
    (["--mean", "0.5"], "--mean is given but not --std"),
    (["--std", "0,1"], "--std: field 'std' must be"),
    # checked against the data's channels: which value came from the flags is said
    (["--mean", "0.5,0.5", "--std", "0.5,0.5"], "mean has 2 values (from flag --mean), expected 1 or one per channel"),
])
def test_bad_field_flags_are_one_line_naming_the_flag(args, named):
    assert named in refused("trace", DEMO, "--model", DEMO_REF, *args, "--data", "digits")


def test_flags_checked_against_the_spec_file_say_they_are_flags():
    # the spec file's input_size [1, 8, 8] and the flags' two channels: the flag is named, not
    # only the file (which had read as if the file's own mean were wrong)
    line = refused("trace", DEMO, "--spec", DEMO_SPEC, "--mean", "0.5,0.5", "--std", "0.5,0.5", "--data", "digits")
    assert "field 'mean' must have 1 values" in line and "(mean from flag --mean; std from flag --std)" in line


@pytest.mark.parametrize("ref", ["resnet18", "keras:resnet18", "timm:", "python:flatcheck.zoo.demo_cnn"])
def test_bad_model_reference(ref):
    assert "--model" in refused("trace", DEMO, "--model", ref)


def test_spec_and_model_exclude_each_other():
    assert "--spec and --model" in refused("trace", DEMO, "--spec", DEMO_SPEC, "--model", DEMO_REF)


def test_without_checkpoint_weights_must_be_asked_for():
    line = refused("trace", "--model", DEMO_REF, "--data", "digits")
    assert "--pretrained" in line and "--random-init" in line
    assert "CHECKPOINT" in refused("trace", DEMO, "--spec", DEMO_SPEC, "--random-init")
    report = run_json("trace", "--model", DEMO_REF, "--random-init", "--input-size", "1,8,8", "--data",
                      "digits", *FAST)
    assert report["checkpoint"] is None and report["weights"] == "random-init"


def test_python_reference_obeys_the_trust_rule(tmp_path, monkeypatch):
    (tmp_path / "untrusted_net.py").write_text(
        "from torch import nn\n\ndef net(num_classes=10):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["trace", "--model", "python:untrusted_net:net", "--random-init", "--input-size", "1,8,8",
            "--data", "digits"]
    assert "--trust-package untrusted_net" in refused(*args)
    report = run_json(*args, "--trust-package", "untrusted_net", *FAST)
    assert report["model"]["resolved_spec"]["head"] == "1"


def test_an_embedded_specs_trusted_module_is_found_in_the_working_directory(tmp_path, monkeypatch):
    """embed-spec said to run with --trust-package MODULE; with MODULE.py where the user runs,
    that was "No module named". The checkpoint's own folder is never searched."""
    work, elsewhere = tmp_path / "work", tmp_path / "download"
    work.mkdir(), elsewhere.mkdir()
    source = "from flatcheck.zoo.demo_cnn import DigitsCNN\n\n\ndef build():\n    return DigitsCNN()\n"
    (work / "my_digits_net.py").write_text(source)
    spec = work / "net.yaml"
    spec.write_text("source: python\narch: my_digits_net:build\ninput_size: [1, 8, 8]\n")
    ckpt = copy_demo(elsewhere)
    result = invoke("embed-spec", ckpt, "--spec", spec)
    assert "--trust-package my_digits_net (a checkpoint's own spec imports nothing unnamed), where my_digits_net " \
           "is installed or in the working directory" in result.stderr
    (elsewhere / "my_digits_net.py").write_text(source)
    monkeypatch.chdir(tmp_path)  # beside the checkpoint only, not where the user runs: not imported
    assert "No module named 'my_digits_net'" in refused("trace", ckpt, "--data", "digits", "--trust-package",
                                                      "my_digits_net")
    assert "--trust-package my_digits_net" in refused("trace", ckpt, "--data", "digits")
    monkeypatch.chdir(work)
    report = run_json("trace", ckpt, "--data", "digits", "--trust-package", "my_digits_net", *FAST)
    by_spec = run_json("trace", DEMO, "--spec", DEMO_SPEC, "--data", "digits", *FAST)
    assert report["results"]["trace"]["value"] == by_spec["results"]["trace"]["value"]


# ---------------------------------------------------------------- what the checkpoint says


def test_sibling_yaml_and_folder_spec(tmp_path):
    ckpt = copy_demo(tmp_path / "a")
    shutil.copy(DEMO_SPEC, tmp_path / "a" / "spec.yaml")
    _, origins = spec_of(ckpt)
    assert origins["arch"] == f"spec file {tmp_path / 'a' / 'spec.yaml'}"
    shutil.copy(DEMO_SPEC, ckpt.with_suffix(".yaml"))  # the checkpoint's own file wins over the folder's
    _, origins = spec_of(ckpt)
    assert origins["arch"] == f"spec file {ckpt.with_suffix('.yaml')}"
    report = run_json("trace", ckpt, "--data", "digits", *FAST)
    assert report["model"]["spec"] == str(ckpt.with_suffix(".yaml"))


def test_embedded_spec_runs_and_embedding_leaves_tensor_bytes(tmp_path):
    ckpt = copy_demo(tmp_path)
    before = data_section(ckpt)
    result = invoke("embed-spec", ckpt, "--spec", DEMO_SPEC)
    assert result.exit_code == 0, result.output
    # said when embedding, not first when the checkpoint alone is refused
    assert "warning: the spec builds the model by importing flatcheck.zoo.demo_cnn" in result.stderr
    assert "--trust-package flatcheck.zoo.demo_cnn" in result.stderr
    assert data_section(ckpt) == before
    original = load_file(str(DEMO))
    assert all(torch.equal(original[k], v) for k, v in load_file(str(ckpt)).items())
    with safe_open(str(ckpt), framework="pt") as fh:
        assert json.loads(fh.metadata()["flatcheck.spec"])["arch"] == "flatcheck.zoo.demo_cnn:DigitsCNN"
    assert (8 + struct.unpack("<Q", ckpt.read_bytes()[:8])[0]) % 8 == 0  # data stays 8-byte aligned
    # an embedded python spec imports only what --trust-package names, flatcheck's zoo included
    assert "--trust-package flatcheck" in refused("trace", ckpt, "--data", "digits")
    report = run_json("trace", ckpt, "--data", "digits", "--trust-package", "flatcheck.zoo.demo_cnn", *FAST)
    by_spec = run_json("trace", DEMO, "--spec", DEMO_SPEC, "--data", "digits", *FAST)
    assert report["results"]["trace"]["value"] == by_spec["results"]["trace"]["value"]
    assert report["model"]["spec_origins"]["arch"] == f"embedded in {ckpt}"


def test_embedded_python_spec_needs_trust(tmp_path):
    (tmp_path / "mynet.py").write_text("from flatcheck.zoo.demo_cnn import DigitsCNN as net\n")
    spec = tmp_path / "mynet.yaml"
    spec.write_text("source: python\narch: mynet:net\ninput_size: [1, 8, 8]\n")
    ckpt = copy_demo(tmp_path / "elsewhere")
    assert invoke("embed-spec", ckpt, "--spec", spec).exit_code == 0
    assert "--trust-package mynet" in refused("trace", ckpt, "--data", "digits")


def test_embed_spec_refusals(tmp_path):
    pt = tmp_path / "net.pt"
    torch.save(load_file(str(DEMO)), pt)
    assert "net.yaml beside it" in refused("embed-spec", pt, "--spec", DEMO_SPEC)
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: python\narch: x\n")
    ckpt = copy_demo(tmp_path)
    before = ckpt.read_bytes()
    assert "bad.yaml" in refused("embed-spec", ckpt, "--spec", bad)
    assert ckpt.read_bytes() == before


def test_timm_config_json(tmp_path):
    torch.manual_seed(0)
    model = build_model(load_spec_dict({"source": "timm", "arch": "test_vit", "num_classes": 4}))
    ckpt = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    (tmp_path / "config.json").write_text(json.dumps({
        "architecture": "test_vit", "num_classes": 4, "num_features": 64,
        "pretrained_cfg": {"input_size": [3, 160, 160], "mean": [0.1, 0.2, 0.3], "std": [0.5, 0.5, 0.5]}}))
    fields, origins = spec_of(ckpt)
    assert fields["arch"] == "test_vit" and fields["num_classes"] == 4 and fields["mean"] == [0.1, 0.2, 0.3]
    assert origins["mean"] == f"config.json {tmp_path / 'config.json'}"
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["ViTForImageClassification"]}))
    assert "transformers config.json" in refused("spec", ckpt)


def test_a_checkpoint_that_says_nothing_lists_the_ways(tmp_path):
    line = refused("trace", copy_demo(tmp_path), "--data", "digits")
    for way in ("--spec", "--model", "embed-spec", "net.yaml or spec.yaml", "config.json"):
        assert way in line


@pytest.mark.realsize
def test_headline_torchvision_resnet18_on_cifar10(tmp_path):
    """`flatcheck trace model.safetensors --data cifar10 --data-root DIR` as written, on a
    torchvision ResNet-18 (7x7 stem) checkpoint that carries the shipped spec."""
    torch.manual_seed(0)
    model = build_model(load_spec(TV_CIFAR))
    assert tuple(model.conv1.kernel_size) == (7, 7)
    ckpt = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    assert invoke("embed-spec", ckpt, "--spec", TV_CIFAR).exit_code == 0
    write_cifar10(tmp_path / "data")
    report = run_json("trace", ckpt, "--data", "cifar10", "--data-root", tmp_path / "data", "--samples", "4",
                      "--probes-max", "2", "--params", "fc.*", "--quiet", "--json", "-")
    trace = report["results"]["trace"]
    assert trace["matvecs"] == 2 and trace["stderr"] > 0
    assert report["model"]["probed_parameters"] == 512 * 10 + 10
    assert report["model"]["resolved_spec"]["input_size"] == [3, 32, 32]


# ---------------------------------------------------------------- library models and their metadata


def test_timm_test_models_at_random_init():
    fields, origins = spec_of("--model", "timm:test_vit")
    assert fields["input_size"] == [3, 160, 160] and fields["mean"] == [0.5, 0.5, 0.5]
    assert fields["num_classes"] == 1000 and fields["head"] == "head"
    assert origins["input_size"] == "library metadata (timm pretrained_cfg)"
    assert origins["head"] == "detected (the final linear layer)"
    report = run_json("trace", "--model", "timm:test_resnet", "--random-init", "--num-classes", "3",
                      "--input-size", "3,32,32", "--data", "synthetic", "--params", "fc.*", *FAST)
    assert report["model"]["num_classes"] == 3 and report["results"]["trace"]["matvecs"] == 2


def test_torchvision_resnet18_at_random_init():
    fields, origins = spec_of("--model", "torchvision:resnet18")
    assert fields["input_size"] == [3, 224, 224] and fields["num_classes"] == 1000 and fields["head"] == "fc"
    assert origins["mean"] == "library metadata (torchvision weights meta)"
    assert "unknown torchvision model 'resnet81'" in refused("spec", "--model", "torchvision:resnet81")


def test_spec_out_file_round_trips(tmp_path):
    out = tmp_path / "spec.yaml"
    assert invoke("spec", "--model", "timm:test_vit", "--num-classes", "10", "-o", out).exit_code == 0
    again = load_spec(out)
    assert again.arch == "test_vit" and again.num_classes == 10 and again.input_size == (3, 160, 160)
    assert "# num_classes: flag --num-classes" in out.read_text()


def _fake_hf_cache(home: Path, repo: str, files: dict[str, bytes]) -> Path:
    snap = home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / "0123abc"
    snap.mkdir(parents=True)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0123abc")
    for name, data in files.items():
        (snap / name).write_bytes(data)
    return snap


def test_pretrained_timm_from_a_local_hf_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    args = ["trace", "--model", "timm:test_vit", "--pretrained", "--data", "synthetic", "--params", "head.*"]
    line = refused(*args)
    assert str(tmp_path / "hf" / "hub") in line and "never downloads" in line
    torch.manual_seed(3)
    weights = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in build_model(load_spec_dict(
        {"source": "timm", "arch": "test_vit"})).state_dict().items()}, str(weights))
    snap = _fake_hf_cache(tmp_path / "hf", "timm/test_vit.r160_in1k", {"model.safetensors": weights.read_bytes()})
    report = run_json(*args, *FAST)
    assert report["checkpoint"]["path"] == str(snap / "model.safetensors") and report["weights"] == "pretrained"
    # hf-hub: names are described by their cached config.json
    (snap / "config.json").write_text(json.dumps({"architecture": "test_vit", "num_classes": 1000,
                                                  "pretrained_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3,
                                                                     "input_size": [3, 160, 160]}}))
    fields, origins = spec_of("--model", "timm:hf-hub:timm/test_vit.r160_in1k")
    assert fields["arch"] == "test_vit" and origins["mean"] == f"config.json {snap / 'config.json'}"
    assert "not in the local HF cache" in refused("spec", "--model", "timm:hf-hub:timm/absent")


def test_pretrained_torchvision_from_a_local_torch_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    line = refused("trace", "--model", "torchvision:resnet18", "--pretrained", "--data", "synthetic")
    assert str(tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in line
    torch.manual_seed(4)
    state = build_model(load_spec_dict({"source": "torchvision", "arch": "resnet18"})).state_dict()
    (tmp_path / "torch" / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(state, tmp_path / "torch" / "hub" / "checkpoints" / "resnet18-f37072fd.pth")
    module, spec = flatcheck.load_model("torchvision:resnet18", pretrained=True)
    assert all(torch.equal(state[k], v) for k, v in module.state_dict().items())
    assert spec.num_classes == 1000


# ---------------------------------------------------------------- the Python API


def test_load_model_resolves_like_the_cli(tmp_path, monkeypatch):
    module, spec = flatcheck.load_model("timm:test_vit", checkpoint=None, pretrained=False, num_classes=5)
    assert module(torch.zeros(1, 3, 160, 160)).shape == (1, 5) and not module.training
    assert spec.origins["num_classes"] == "argument" and spec.input_size == (3, 160, 160)
    ckpt = copy_demo(tmp_path)
    shutil.copy(DEMO_SPEC, ckpt.with_suffix(".yaml"))
    monkeypatch.chdir(tmp_path)
    module, spec = flatcheck.load_model(checkpoint="net.safetensors")
    assert spec.path == tmp_path / "net.yaml" and spec.path.is_absolute()
    assert torch.equal(module.state_dict()["head.weight"], load_file(str(DEMO))["head.weight"])
    with pytest.raises(flatcheck.InputError, match="unknown spec field 'colour'"):
        flatcheck.load_model("timm:test_vit", colour="red")


def load_spec_dict(data: dict):
    from flatcheck.models.spec import spec_from_dict

    return spec_from_dict(data)


def test_scan_folders_read_what_a_checkpoint_says(tmp_path):
    from flatcheck.workflows.scan_sources import checkpoint_entries

    own = copy_demo(tmp_path, "a.safetensors")
    shutil.copy(DEMO_SPEC, own.with_suffix(".yaml"))
    assert invoke("embed-spec", copy_demo(tmp_path, "b.safetensors"), "--spec", DEMO_SPEC).exit_code == 0
    copy_demo(tmp_path, "c.safetensors")
    a, b, c = checkpoint_entries(tmp_path)
    assert a.describe["spec"] == str(own.with_suffix(".yaml")) and a.make_spec().arch.endswith("DigitsCNN")
    assert b.describe["spec"] == f"embedded in {tmp_path / 'b.safetensors'}" and b.make_spec().embedded
    assert c.skip_reason.startswith("no spec:") and "embed-spec" in c.skip_reason


def test_a_random_init_is_drawn_from_the_runs_seed():
    """--random-init weights come from --seed, so a run (and a scan record) can be reproduced;
    the caller's RNG state is left as it was."""
    args = ("gini", "--model", "timm:test_vit", "--random-init", "--num-classes", "10", "--input-size", "3,32,32",
            "--data", "synthetic", "--samples", "8", "-q", "--json", "-")
    one, again, other = (run_json(*args, "--seed", s)["results"]["gini"]["value"] for s in ("3", "3", "4"))
    assert one == again and one != other
    state = torch.random.get_rng_state()
    a, _ = flatcheck.load_model("timm:test_vit", num_classes=10, seed=5)
    b, _ = flatcheck.load_model("timm:test_vit", num_classes=10, seed=5)
    c, _ = flatcheck.load_model("timm:test_vit", num_classes=10, seed=6)
    assert torch.equal(torch.random.get_rng_state(), state)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_a_missing_checkpoint_is_reported_as_missing_not_as_saying_nothing(tmp_path):
    assert refused("trace", tmp_path / "nonexist.safetensors") == \
        f"error: checkpoint not found: {tmp_path / 'nonexist.safetensors'}"
    assert "a folder" in refused("trace", tmp_path)


# ---------------------------------------------------------------- a downloaded folder runs no code of its own


@pytest.mark.parametrize("where", ["stem", "folder"])
def test_a_found_python_spec_imports_nothing_of_its_folder_unless_told(tmp_path, where):
    """A checkpoint folder as downloaded: its STEM.yaml (or spec.yaml) names a module that
    sits beside it. Found, not typed, the spec runs that module only under --trust-package;
    typed as --spec, it keeps the rule of a spec the user chose (its folder's modules run)."""
    module = f"downloaded_net_{where}"
    marker = tmp_path / "ran"
    folder = tmp_path / "download"
    ckpt = copy_demo(folder)
    (folder / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                        "from flatcheck.zoo.demo_cnn import DigitsCNN as build\n")
    spec = ckpt.with_suffix(".yaml") if where == "stem" else folder / "spec.yaml"
    spec.write_text(f"source: python\narch: {module}:build\nnum_classes: 10\ninput_size: [1, 8, 8]\n")
    line = refused("trace", ckpt, "--data", "digits", *FAST)
    assert f"{spec}, the spec found" in line and f"--trust-package {module}" in line, line
    assert str(folder / f"{module}.py") in line and "--spec" in line
    assert not marker.exists()
    assert "--trust-package" in refused("spec", ckpt)  # the same rule where the spec is only shown
    assert not marker.exists()
    by_spec = run_json("trace", DEMO, "--spec", DEMO_SPEC, "--data", "digits", *FAST)
    told = run_json("trace", ckpt, "--data", "digits", "--trust-package", module, *FAST)
    assert marker.exists() and told["results"]["trace"]["value"] == by_spec["results"]["trace"]["value"]
    typed = run_json("trace", ckpt, "--spec", spec, "--data", "digits", *FAST)  # no flag needed
    assert typed["results"]["trace"]["value"] == by_spec["results"]["trace"]["value"]


def test_a_found_spec_still_builds_from_trusted_packages(tmp_path):
    """flatcheck's zoo, timm and torchvision are installed code, not the folder's: a found spec
    naming them needs no flag (the demo's own spec beside its checkpoint)."""
    ckpt = copy_demo(tmp_path)
    shutil.copy(DEMO_SPEC, tmp_path / "spec.yaml")
    assert run_json("trace", ckpt, "--data", "digits", *FAST)["model"]["spec"] == str(tmp_path / "spec.yaml")


# ---------------------------------------------------------------- embed-spec checks the spec against the tensors


def test_embed_spec_refuses_a_spec_whose_model_cannot_hold_the_tensors(tmp_path):
    ckpt = copy_demo(tmp_path)
    before = ckpt.read_bytes()
    other = tmp_path / "other.yaml"
    other.write_text("source: timm\narch: test_resnet\nnum_classes: 10\ninput_size: [3, 32, 32]\n")
    line = refused("embed-spec", ckpt, "--spec", other)
    assert "does not fit the model: missing keys" in line and "test_resnet" in line, line
    assert ckpt.read_bytes() == before
    out = tmp_path / "copy.safetensors"
    assert "does not fit" in refused("embed-spec", ckpt, "--spec", other, "--out", out)
    assert not out.exists()


# ---------------------------------------------------------------- a bare state dict: what its keys look like


def test_a_bare_torchvision_resnet_state_dict_gets_a_hint(tmp_path):
    import torchvision

    torch.manual_seed(0)
    state = torchvision.models.resnet18(num_classes=10).state_dict()
    ckpt = tmp_path / "resnet.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(ckpt))
    line = refused("trace", ckpt, "--data", "synthetic")
    assert "does not say which model it holds" in line
    assert "torchvision's resnet18 with a 10-class fc: --model torchvision:resnet18 --num-classes 10" in line
    assert "--spec model_specs/resnet18_torchvision_cifar10.yaml" in line and TV_CIFAR.is_file()
    assert "its keys are" not in refused("trace", copy_demo(tmp_path / "demo"), "--data", "digits")
