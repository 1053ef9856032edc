"""flatcheck.measure on live objects: dense float64 truth for tensors, loaders
and iterables; the caller's model and RNG left bitwise as they were; shuffled data held once,
a changing stream refused; the CLI's run and measure the same path."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import flatcheck
from flatcheck.api import open_session, run
from flatcheck.config import RunConfig, probe_requests
from flatcheck.errors import ConfigError, DataError, InputError, SpecError
from flatcheck.probes.registry import list_probes

from tests.support.dense import dense, make_case

# exact probes in float64: the only difference from the dense truth is summation order over
# batches and samples, a few ulps of the terms summed (≤ 1e-12 relative on these sizes)
ROUNDOFF = 1e-10
# Tr(G) exactly (per-sample Jacobians), λ1, λ2 of H to a relative residual far below the gaps
EXACT = {"trace": {"estimator": "exact", "matrix": "ggn"}, "lmax": {"k": 2, "tol": 1e-8}}


class Batches:
    """A plain re-iterable of (x, y) batches (not a DataLoader)."""

    def __init__(self, X, Y, size, reshuffle=False):
        self.X, self.Y, self.size, self.reshuffle, self.passes = X, Y, size, reshuffle, 0

    def __iter__(self):
        self.passes += 1
        order = torch.randperm(len(self.X)) if self.reshuffle else torch.arange(len(self.X))
        for i in range(0, len(order), self.size):
            yield self.X[order[i:i + self.size]], self.Y[order[i:i + self.size]]


def sources(case):
    X, Y = case.X, case.Y
    torch.manual_seed(5)
    return {
        "tensors": (X, Y),
        "loader": DataLoader(TensorDataset(X, Y), batch_size=10),
        "shuffled loader": DataLoader(TensorDataset(X, Y), batch_size=7, shuffle=True),
        "iterable": Batches(X, Y, 10),
        "list": [(X[i:i + 10], Y[i:i + 10]) for i in range(0, len(X), 10)],
        "generator": ((X[i:i + 5], Y[i:i + 5]) for i in range(0, len(X), 5)),
    }


def check_against_dense(report, truth, what):
    H, G = truth
    ev = torch.linalg.eigvalsh(H)
    tr = report.results["trace"]
    assert tr.stderr is None and abs(tr.value - G.trace().item()) <= ROUNDOFF * abs(G.trace().item()), what
    lm = report.results["lmax"]
    # a unit vector q with ‖Hq − θq‖ = r has an eigenvalue within r of θ (Weyl/Bauer–Fike)
    for got, want, r in zip(lm.details["eigenvalues"], ev.flip(0), lm.details["residuals"]):
        assert abs(got - want.item()) <= r + ROUNDOFF * abs(want.item()), (what, got, want.item(), r)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_every_source_matches_dense_truth(kind):
    case = make_case(kind, n=23, batch_size=10)
    truth = dense(case)
    for name, data in sources(case).items():
        report = flatcheck.measure(case.model, data, probes=["trace", "lmax"], options=EXACT, dtype="float64")
        check_against_dense(report, truth, f"{kind} {name}")
        assert report.meta["data"]["samples"] == 23
        cached = name in ("shuffled loader", "iterable", "list", "generator", "loader")
        assert report.meta["data"]["cached"] is cached, name


def test_samples_and_batch_size_cap_the_source():
    case = make_case("mlp", n=23)
    loader = DataLoader(TensorDataset(case.X, case.Y), batch_size=6)
    report = flatcheck.measure(case.model, loader, probes="trace", options={"trace": EXACT["trace"]}, samples=15)
    data = report.meta["data"]
    assert (data["samples"], data["batch_size"], data["batches"]) == (15, 6, 3)
    sub = make_case("mlp", n=23)
    sub.problem.samples = type(sub.problem.samples)(TensorDataset(case.X[:15], case.Y[:15]), samples=15,
                                                    batch_size=6, dtype=torch.float64)
    _, G = dense(sub)
    assert report.results["trace"].value == pytest.approx(G.trace().item(), rel=ROUNDOFF)


def snapshot(model):
    return {
        "tensors": {n: t.detach().clone() for n, t in [*model.named_parameters(), *model.named_buffers()]},
        "grads": {n: (p.grad, None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()},
        "requires_grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "dtype_device": {n: (t.dtype, t.device) for n, t in model.state_dict().items()},
        "rng": torch.get_rng_state(),
    }


def assert_same(model, before):
    after = snapshot(model)
    for n, t in before["tensors"].items():
        got = after["tensors"][n]
        assert t.dtype == got.dtype and torch.equal(t.reshape(-1).view(torch.uint8), got.reshape(-1).view(torch.uint8)), n
    for n, (obj, val) in before["grads"].items():
        got = dict(model.named_parameters())[n].grad
        assert got is obj, f"{n}.grad is another tensor"
        if val is not None:
            assert torch.equal(val, got), n
    for key in ("requires_grad", "training", "dtype_device"):
        assert after[key] == before[key], key
    assert torch.equal(after["rng"], before["rng"]), "global CPU RNG state changed"


@pytest.mark.parametrize("dtype,bn_mode", [("float32", "train"), ("float64", "eval")])
def test_callers_model_left_bitwise_as_it_was(dtype, bn_mode):
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Dropout(0.2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 4))  # float32
    X, Y = torch.randn(12, 1, 5, 5), torch.randint(0, 4, (12,))
    model.train()
    nn.functional.cross_entropy(model(X), Y).backward()  # .grad set, BN running stats moved
    model[0].bias.requires_grad_(False)
    model[0].bias.grad = None
    before = snapshot(model)
    loader = DataLoader(TensorDataset(X, Y), batch_size=5, shuffle=True)  # draws from the global RNG
    report = flatcheck.measure(model, loader, probes=["lmax", "trace", "adaptive-sharpness", "gini"],
                               options={"lmax": {"k": 1}, "trace": {"probes_max": 10},
                                        "adaptive-sharpness": {"noise_draws": 4, "probes_max": 10}},
                               dtype=dtype, bn_mode=bn_mode)
    assert report.meta["dtype"] == dtype and report.meta["bn_mode"] == bn_mode
    assert report.meta["allow_tf32"] is False  # the default, recorded
    assert_same(model, before)
    assert model.training and model[1].track_running_stats


def test_float64_run_of_a_float32_model_is_a_copy():
    case = make_case("mlp")
    model32 = copy.deepcopy(case.model).float()
    before = snapshot(model32)
    report = flatcheck.measure(model32, (case.X, case.Y), probes=["trace", "lmax"], options=EXACT, dtype="float64")
    assert_same(model32, before)
    # the copy holds the float32 weights exactly; the dense truth is of the float64 originals
    # rounded to float32, so compare with the copy's own dense truth
    case.model.load_state_dict({k: v.double() for k, v in model32.state_dict().items()})
    check_against_dense(report, dense(case), "float64 copy")


def test_changing_stream_that_does_not_fit_is_refused(monkeypatch):
    import flatcheck.data.memory as memory

    case = make_case("mlp", n=23)
    monkeypatch.setattr(memory, "CACHE_BYTES", 64)  # nothing fits: every pass re-reads the source
    steady = flatcheck.measure(case.model, Batches(case.X, case.Y, 10), probes="trace",
                               options={"trace": EXACT["trace"]}, batch_size=10)
    assert steady.meta["data"]["cached"] is False
    _, G = dense(case)
    assert steady.results["trace"].value == pytest.approx(G.trace().item(), rel=ROUNDOFF)
    with pytest.raises(DataError, match=r"changed between passes \(batch 0\): random augmentation\? flatcheck "
                                        r"needs a deterministic data set"):
        flatcheck.measure(case.model, Batches(case.X, case.Y, 10, reshuffle=True), probes="trace")
    with pytest.raises(InputError, match="iterator can be read only once"):
        flatcheck.measure(case.model, iter([(case.X, case.Y)]), probes="trace")


def test_gap_and_head_probes_take_test_data_and_head():
    case = make_case("cnn", n=23)
    g = torch.Generator().manual_seed(9)
    Xt, Yt = torch.randn(15, 1, 6, 6, generator=g, dtype=torch.float64), torch.randint(0, 4, (15,), generator=g)
    report = flatcheck.measure(case.model, (case.X, case.Y), probes=["gap", "head-trace"], test_data=(Xt, Yt),
                               head="7")
    gap = report.results["gap"].details
    with torch.no_grad():
        case.model.eval()
        losses = [nn.functional.cross_entropy(case.model(x), y).item() for x, y in ((case.X, case.Y), (Xt, Yt))]
    assert gap["train"]["samples"] == 23 and gap["test"]["samples"] == 15
    assert gap["train"]["loss"] == pytest.approx(losses[0], rel=ROUNDOFF)
    assert gap["test"]["loss"] == pytest.approx(losses[1], rel=ROUNDOFF)
    assert report.results["head-trace"].details.get("head", "7") == "7"
    # a head that names no module is the caller's keyword, not a spec file's field
    with pytest.raises(SpecError, match=r"^measure\(\): keyword 'head' names no module of .*: 'nope'; linear "
                                        r"layers near the end: .*7"):
        flatcheck.measure(case.model, (case.X, case.Y), probes="head-trace", head="nope")
    # the probe's own option, by its keyword
    with pytest.raises(ConfigError, match=r"^head names no module of .*: 'nope'"):
        flatcheck.measure(case.model, (case.X, case.Y), probes={"head-trace": {"head": "nope"}})
    with pytest.raises(ConfigError, match=r"^measure\(\): unknown keyword 'loss' \(its 'foo'\)"):
        flatcheck.measure(case.model, (case.X, case.Y), loss={"name": "cross_entropy", "foo": 1})
    # skipped, as `flatcheck probe` skips it, but said: a None in a notebook was silent (stranger18)
    with pytest.warns(UserWarning, match=r"^probe gap gave no value, skipped: data '\w+' has no test split "
                                         r"\(pass test_data=\)$"):
        skipped = flatcheck.measure(case.model, (case.X, case.Y), probes="gap").results["gap"]
    assert skipped.value is None and "test_data" in skipped.notes
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a gap that has its split says nothing
        flatcheck.measure(case.model, (case.X, case.Y), probes="gap", test_data=(Xt, Yt))


def test_every_probe_runs_on_live_objects():
    case = make_case("cnn", n=12)
    X2, Y2 = case.X.flip(0), case.Y.flip(0)
    for probe in list_probes():
        report = flatcheck.measure(case.model, (case.X, case.Y), probes=probe, test_data=(X2 + 0.5, Y2),
                                   batch_size=6, options={p: o for p, o in {
                                       "adaptive-sharpness": {"noise_draws": 4, "probes_max": 10}, "trace": {"probes_max": 10},
                                       "spectrum": {"starts": 2, "lanczos_steps": 20}, "rank": {"starts": 2, "lanczos_steps": 20}}.items() if p == probe})
        assert report.results[probe].probe == probe
        assert report.to_dict()["results"][probe]["value"] is not None, probe


@pytest.mark.workflow
def test_cli_run_is_measure_on_the_loaded_model(tmp_path):
    """The CLI's path (checkpoint + spec → model and data) and measure give the same numbers:
    one code path for probes."""
    config = RunConfig(checkpoint=None, spec=_demo_spec(), probes=probe_requests("lmax,trace"), samples=40,
                       batch_size=16, dtype="float64", seed=3)
    session = open_session(config)
    via_cli = run(config, session=session)
    live = flatcheck.measure(session.model, session.samples.dataset, probes="lmax,trace", samples=40,
                             batch_size=16, seed=3)
    for probe in ("lmax", "trace"):
        assert live.results[probe].value == via_cli.results[probe].value, probe
        assert live.results[probe].matvecs == via_cli.results[probe].matvecs
    assert live.meta["data"]["fingerprint"] == via_cli.meta["data"]["fingerprint"]


def _demo_spec():
    from flatcheck.models.spec import ModelSpec

    return ModelSpec(source="python", arch="flatcheck.zoo.demo_cnn:DigitsCNN", num_classes=10)


def test_bad_arguments_are_one_line_errors():
    case = make_case("mlp", n=8)
    with pytest.raises(InputError, match="a tensor alone has no labels"):
        flatcheck.measure(case.model, case.X)
    with pytest.raises(InputError, match="labels must be integer class indices"):
        flatcheck.measure(case.model, (case.X, case.Y.double()))
    with pytest.raises(InputError, match="fewer|more than the 8 samples"):
        flatcheck.measure(case.model, [(case.X, case.Y)], samples=9)
    # the caller's keyword, not a spec file's field
    with pytest.raises(ConfigError, match=r"^measure\(\): keyword 'loss' \(its 'name'\) must be one of"):
        flatcheck.measure(case.model, (case.X, case.Y), loss="hinge")
    with pytest.raises(ConfigError, match="float32 or float64"):
        flatcheck.measure(copy.deepcopy(case.model).to(torch.bfloat16), (case.X, case.Y))
    with pytest.raises(InputError, match="expected a torch.nn.Module"):
        flatcheck.measure(lambda x: x, (case.X, case.Y))
    with pytest.raises(ConfigError, match="unknown probe"):
        flatcheck.measure(case.model, (case.X, case.Y), probes="nope")


def test_run_config_in_code_takes_text_and_names_what_it_cannot_take(tmp_path):
    # flatcheck.run(RunConfig(...)) from a notebook: paths as text and probes as "trace,gini" are
    # what people type; a wrong type was an AttributeError or pathlib's TypeError
    config = RunConfig(checkpoint="demo.safetensors", spec="spec.yaml", probes="trace, gini", data_root=str(tmp_path))
    assert config.checkpoint == Path("demo.safetensors") and config.spec == Path("spec.yaml")
    assert config.data_root == tmp_path and [p.name for p in config.probes] == ["trace", "gini"]
    assert [p.name for p in RunConfig(checkpoint=None, spec=_demo_spec(), probes=["lmax"]).probes] == ["lmax"]
    with pytest.raises(ConfigError, match="RunConfig checkpoint: expected a path .* got int"):
        RunConfig(checkpoint=123, spec="spec.yaml", probes="trace")
    with pytest.raises(ConfigError, match="RunConfig spec: expected a YAML path or a ModelSpec, got dict"):
        RunConfig(checkpoint=None, spec={"arch": "x"}, probes="trace")
    with pytest.raises(ConfigError, match="RunConfig probes: expected probe names"):
        RunConfig(checkpoint=None, spec="spec.yaml", probes=[1, 2])
    with pytest.raises(ConfigError, match="unknown probe 'trase'"):
        RunConfig(checkpoint=None, spec="spec.yaml", probes="trase")
    case = make_case("mlp", n=8)
    with pytest.raises(ConfigError, match="out: expected a .jsonl path .* got int"):
        flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=2, out=123)


def test_probes_as_a_mapping_are_taken_as_their_options():
    """probes={name: options}: the options are used and validated as options= is, not dropped."""
    case = make_case("mlp", n=12)
    data = (case.X, case.Y)
    given = flatcheck.measure(case.model, data, probes={"trace": {"estimator": "hutchpp", "probes_max": 12}})
    same = flatcheck.measure(case.model, data, probes="trace", options={"trace": {"estimator": "hutchpp",
                                                                                   "probes_max": 12}})
    trace = given.results["trace"]
    assert trace.value == same.results["trace"].value and trace.matvecs == same.results["trace"].matvecs
    assert trace.matvecs <= 12
    both = flatcheck.measure(case.model, data, probes={"trace": None, "lmax": {"k": 1}},
                             options={"trace": {"estimator": "exact", "matrix": "ggn"}})
    assert set(both.results) == {"trace", "lmax"} and both.results["trace"].stderr is None
    with pytest.raises(ConfigError, match="probes_mx is unknown"):
        flatcheck.measure(case.model, data, probes={"trace": {"probes_mx": 12}})
    with pytest.raises(ConfigError, match="k"):
        flatcheck.measure(case.model, data, probes={"lmax": {"k": 500}})
    with pytest.raises(ConfigError, match="probe trace: options given both in probes= and in options="):
        flatcheck.measure(case.model, data, probes={"trace": {"probes_max": 12}}, options={"trace": {"rtol": 0.1}})
    with pytest.raises(ConfigError, match=r"probes\['trace'\] must be a mapping"):
        flatcheck.measure(case.model, data, probes={"trace": 12})
    with pytest.raises(ConfigError, match=r"options\['lmax'\]: probe 'lmax' is not among probes \(trace\)"):
        flatcheck.measure(case.model, data, probes="trace", options={"lmax": {"k": 1}})


@pytest.mark.parametrize("device", ["cuda", "cuda:3", torch.device("cuda"), torch.device("cuda", 1)])
def test_a_cuda_device_without_cuda_is_the_clis_config_error(device, monkeypatch):
    """Was torch's RuntimeError ("Found no NVIDIA driver…") from saving the device's RNG state."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    case = make_case("mlp", n=8)
    with pytest.raises(ConfigError, match=rf"^device {device}: CUDA is not available on this machine"):
        flatcheck.measure(case.model, (case.X, case.Y), device=device)
    with pytest.raises(ConfigError, match="CUDA is not available"):
        flatcheck.Tracker(case.model, (case.X, case.Y), out=None, device=device)


def test_a_device_that_is_no_device_is_named():
    case = make_case("mlp", n=8)
    for bad in ("gpu", 0):
        with pytest.raises(ConfigError, match="device must be auto, cpu, cuda"):
            flatcheck.measure(case.model, (case.X, case.Y), device=bad)


def test_empty_data_is_named_as_empty():
    """Was "--samples must be a positive integer, got 0", though no samples were passed."""
    case = make_case("mlp", n=8)
    X, Y = case.X[:0], case.Y[:0]
    for data, what in (((X, Y), "data: the tensors are empty"), (TensorDataset(X, Y), "data: the data set .* is empty"),
                       (DataLoader(TensorDataset(X, Y), batch_size=4), "gave no samples"), ([], "gave no samples")):
        with pytest.raises(InputError, match=what):
            flatcheck.measure(case.model, data)
    with pytest.raises(InputError, match="test_data: the tensors are empty"):
        flatcheck.measure(case.model, (case.X, case.Y), probes="gap", test_data=(X, Y))
    with pytest.raises(ConfigError, match="^samples must be a positive integer, got 0"):
        flatcheck.measure(case.model, (case.X, case.Y), samples=0)


def test_uint8_images_are_scaled_as_the_cli_reads_them(tmp_path):
    """uint8 inputs are divided by 255 as the CLI's npz reader does (was: raw 0..255 values),
    from every kind of source, and the report says so; other integer inputs are refused."""
    import numpy as np

    g = torch.Generator().manual_seed(4)
    pixels = torch.randint(0, 256, (20, 1, 8, 8), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (20,), generator=g)
    model = _demo_spec_model()
    floats = flatcheck.measure(model, (pixels.float() / 255, labels), probes="trace", options=EXACT_TRACE)
    assert "scaled" not in floats.meta["data"]
    for data in ((pixels, labels), TensorDataset(pixels, labels), DataLoader(TensorDataset(pixels, labels),
                                                                             batch_size=8)):
        report = flatcheck.measure(model, data, probes="trace", options=EXACT_TRACE, batch_size=128)
        assert report.meta["data"]["scaled"] == "uint8 / 255", type(data).__name__
        assert report.results["trace"].value == floats.results["trace"].value, type(data).__name__
        assert report.meta["data"]["fingerprint"] == floats.meta["data"]["fingerprint"]
    # the CLI's path: the same pixels in an npz file give the same samples
    np.savez(tmp_path / "px.npz", x=pixels.numpy(), y=labels.numpy())
    config = RunConfig(checkpoint=None, spec=_demo_spec(), data=f"npz:{tmp_path / 'px.npz'}",
                       probes=probe_requests("trace", {"trace": EXACT_TRACE["trace"]}), batch_size=128)
    session = open_session(config)
    assert session.samples.fingerprint == floats.meta["data"]["fingerprint"]
    for bad in (pixels.long(), pixels.to(torch.int16)):
        with pytest.raises(InputError, match=rf"data: the batch at sample 0 has {bad.dtype} inputs; flatcheck takes "
                                             r"floats, or uint8 pixels 0..255 \(divided by 255, as the CLI reads them\)"
                                             r": pass x.float\(\)"):
            flatcheck.measure(model, (bad, labels))
    mixed = [(pixels[:10], labels[:10]), (pixels[10:].float() / 255, labels[10:])]
    with pytest.raises(InputError, match="the batch at sample 10 holds torch.float32 inputs, the first batch uint8"):
        flatcheck.measure(model, mixed)


EXACT_TRACE = {"trace": {"estimator": "exact", "matrix": "ggn"}}


def _demo_spec_model():
    from flatcheck.zoo.demo_cnn import DigitsCNN

    torch.manual_seed(0)
    return DigitsCNN()


def test_errors_name_the_call_s_own_arguments_not_the_command_line_s():
    """measure() has no spec file and no --samples flag: its errors say what to change in the call."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(InputError, match=r"samples of shape \(5,\) \(check the data's shape against the model\)"):
        flatcheck.measure(model, (torch.randn(8, 5), y), probes="gini")
    with pytest.raises(InputError, match=r"^samples=100 is more than the 8 samples data gives$"):
        flatcheck.measure(model, (x, y), probes="gini", samples=100)
    with pytest.raises(InputError, match=r"^data: a tuple of 3 tensors; pass \(x, y\)"):
        flatcheck.measure(model, (x, y, y), probes="gini")
    # the settings' own checks name the setting: the keyword here, the flag on the command line
    for kwargs, said in ((dict(seed=-1), "^seed must be an integer"), (dict(probes="trase"), "^probes: unknown probe"),
                         (dict(max_memory="lots"), "^max_memory expects a size"),
                         (dict(bn_mode="x"), "^bn_mode must be one of eval, train")):
        with pytest.raises(ConfigError, match=said):
            flatcheck.measure(model, (x, y), **kwargs)
    with pytest.raises(TypeError, match="measure\\(\\) got an unexpected keyword argument 'sed'"):
        flatcheck.measure(model, (x, y), sed=1)
    # a probe's refusal as it runs names the setting mid-sentence; a probe's own option keeps its flag
    from flatcheck.errors import setting
    from flatcheck.settings import flag_of

    refusal = ConfigError(f"probe mls needs 2 GiB ({setting('max_memory')} less what is held); raise "
                          f"{setting('max_memory')}, or --probes-max 8")
    assert str(refusal) == "probe mls needs 2 GiB (max_memory less what is held); raise max_memory, or --probes-max 8"
    assert refusal.worded(flag_of) == ("probe mls needs 2 GiB (--max-memory less what is held); raise --max-memory, "
                                       "or --probes-max 8")


def test_measure_takes_the_declared_settings_as_keywords():
    """measure()'s and open_live_session()'s keywords are the live settings of flatcheck.settings."""
    import inspect

    from flatcheck.live import open_live_session
    from flatcheck.settings import live_settings

    for fn in (flatcheck.measure, open_live_session):
        keywords = inspect.signature(fn).parameters
        assert set(live_settings()) <= set(keywords)
        assert all(keywords[name].default is how.live_default for name, how in live_settings().items())
    assert {"samples", "batch_size", "device", "dtype", "bn_mode", "seed", "params", "budget",
            "max_memory"} == set(live_settings())


class Structured(nn.Module):
    """A model whose forward returns more than logits, as the CLI's `output_key` rule reads them."""

    def __init__(self, inner: nn.Module, how: str):
        super().__init__()
        self.inner, self.how = inner, how

    def forward(self, x):
        logits = self.inner(x)
        if self.how == "dict":
            return {"features": x.flatten(1), "logits": logits}
        if self.how == "tuple":
            return (logits, x.flatten(1))
        return {"aux": x.flatten(1)[:, :4], "scores": logits}


@pytest.mark.parametrize("how, key", [("dict", None), ("tuple", None), ("named", "scores")])
def test_a_model_returning_a_structure_is_measured_on_its_logits(how, key):
    """measure raised AttributeError ('dict' object has no attribute 'ndim') where the CLI
    takes the logits by the output_key rule."""
    case = make_case("mlp", n=12)
    _, G = dense(case)
    model = Structured(case.model, how)
    r = flatcheck.measure(model, (case.X, case.Y), probes={"trace": EXACT["trace"]}, output_key=key)
    assert r.results["trace"].value == pytest.approx(torch.trace(G).item(), rel=ROUNDOFF)
    assert isinstance(model(case.X), (dict, tuple))  # the caller's forward is unchanged
    assert not model._forward_hooks
    if key is not None:
        assert r.meta["model"]["resolved_spec"]["output_key"] == key


def test_an_output_key_that_selects_nothing_is_one_line():
    case = make_case("mlp", n=12)
    with pytest.raises(SpecError, match=r"^measure\(\): keyword 'output_key' 'nope' is not in the model's output, "
                                        r"a dict with keys "
                                        r"aux, scores"):
        flatcheck.measure(Structured(case.model, "named"), (case.X, case.Y), probes=["gini"], output_key="nope")


def test_what_a_live_model_is_measured_as_is_said_when_its_own_forward_differs():
    """A train-mode model with BatchNorm measured on running statistics (Tr(H) 4.6 there where
    training's batch statistics give 18.3), and a model of two dtypes cast to one: both silent."""
    case = make_case("cnn", n=12)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2 * 1 * 2, 4))
    model.train()
    x, y = torch.randn(12, 1, 3, 4), torch.randint(0, 4, (12,))
    with pytest.warns(UserWarning, match=r"in train mode, but its BatchNorm layers are measured on their running "
                                         r"statistics \(bn_mode='eval'"):
        flatcheck.measure(model, (x, y), probes=["gini"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flatcheck.measure(model, (x, y), probes=["gini"], bn_mode="train")
        flatcheck.measure(model, (x, y), probes=["gini"], bn_mode="eval")  # chosen: nothing to say
        flatcheck.measure(model.eval(), (x, y), probes=["gini"])
    mixed = copy.deepcopy(case.model).float()
    mixed[-1].double()
    with pytest.warns(UserWarning, match=r"parameters in float32 and float64; measured as a float32 copy"):
        flatcheck.measure(mixed, (case.X.float(), case.Y), probes=["gini"])


@pytest.mark.parametrize("progress", ["stderr", print, lambda done, total: None, 1])
def test_a_wrong_progress_is_named_before_any_work(progress):
    """progress=print, "stderr" or True failed as a TypeError inside the first probe (stranger18)."""
    case = make_case("mlp")
    with pytest.raises(ConfigError, match=r"^progress must be None, True \(the command line's progress lines on "
                                          r"stderr\) or a callable progress\(desc, done, total, \*, value=None"):
        flatcheck.measure(case.model, None, progress=progress)  # data would be refused after it


def test_progress_true_writes_the_clis_lines_and_a_callable_hears_every_probe(capsys):
    case = make_case("mlp")
    options = {"trace": {"probes_max": 6, "rtol": None}, "lmax": None}
    heard = []
    report = flatcheck.measure(case.model, (case.X, case.Y), probes=options,
                               progress=lambda desc, done, total, *, value=None, stderr=None: heard.append(
                                   (desc, done, total, value)))
    assert capsys.readouterr().err == ""
    last = [h for h in heard if h[0].startswith("trace")][-1]
    assert last[1:3] == (6, 6) and last[3] == pytest.approx(report.results["trace"].value, rel=ROUNDOFF)
    assert any(h[0].startswith("lmax") for h in heard)
    again = flatcheck.measure(case.model, (case.X, case.Y), probes=options, progress=True)
    err = capsys.readouterr().err
    assert again.results["trace"].value == report.results["trace"].value  # the display changes no value
    assert err.startswith("flatcheck trace") and "\nflatcheck lmax" in err and "6/6" in err


@pytest.mark.parametrize("quiet", [None, False])
def test_progress_none_or_false_is_silent(quiet, capsys):
    """progress=False is documented as silent (it was passed on as the listener and called)."""
    case = make_case("mlp")
    report = flatcheck.measure(case.model, (case.X, case.Y), probes={"trace": {"probes_max": 4, "rtol": None}},
                               progress=quiet)
    assert report.results["trace"].value is not None and capsys.readouterr().err == ""


def test_non_finite_weights_are_named():
    """stranger20: NaN weights were told as "the model overflows in float32 (try dtype
    float64) or its weights are broken"; the tensor is named, as the CLI names a checkpoint's."""
    case = make_case("mlp", n=8)
    model = copy.deepcopy(case.model)
    first = next(iter(model.parameters()))
    with torch.no_grad():
        first.view(-1)[0] = float("nan")
    name = next(n for n, p in model.named_parameters() if p is first)
    with pytest.raises(InputError, match=rf"^model: non-finite values \(NaN/Inf\) in 1 tensors: {re.escape(name)}$"):
        flatcheck.measure(model, (case.X, case.Y), probes=("gini",))


def test_an_unknown_keyword_is_weighed_against_every_keyword_measure_takes():
    """measure(probez=...) listed only the settings (samples, seed …), leaving out probes,
    options, loss and the rest, and suggested nothing (stranger21)."""
    import inspect

    model = nn.Sequential(nn.Linear(4, 3))
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    with pytest.raises(TypeError, match=r"^measure\(\) got an unexpected keyword argument 'probez'; "
                                        r"did you mean 'probes'\?$"):
        flatcheck.measure(model, (x, y), probez=("trace",))
    with pytest.raises(TypeError) as caught:
        flatcheck.measure(model, (x, y), zzz=1)
    said = str(caught.value)
    assert "\n" not in said
    listed = said.split("; it takes ")[1].split(", ")
    takes = [p.name for p in inspect.signature(flatcheck.measure).parameters.values()
             if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert sorted(listed) == sorted(takes)
    assert {"probes", "options", "loss", "test_data", "head", "num_classes", "output_key", "progress"} <= set(listed)


def test_the_report_counts_samples_whose_softmax_saturates():
    """data.softmax_saturation: 1 − max p per sample without cancellation (Σ of the other
    classes' p), the count under 1e-3, the least and the mean; checked against float64 from the
    same logits, in a float32 run where 1 − p_max falls below float32's eps."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    with torch.no_grad():
        model[0].weight.mul_(40.0)
    X = torch.randn(24, 4)
    Y = model(X).argmax(1)
    report = flatcheck.measure(model, DataLoader(TensorDataset(X, Y), batch_size=8), probes=["gini"])
    got = report.meta["data"]["softmax_saturation"]
    with torch.no_grad():
        z = model.double()(X.double())
    p = z.softmax(1)
    share = p.sum(1) - p.max(1).values  # float64: every share here is far above its eps
    assert share.min().item() < 1e-7  # below float32's eps: 1 − p_max in float32 would read 0
    assert got["threshold"] == 1e-3 and got["samples"] == int((share < 1e-3).sum())
    assert got["least"] == pytest.approx(share.min().item(), rel=1e-5)
    assert got["mean"] == pytest.approx(share.mean().item(), rel=1e-5)
    mse = flatcheck.measure(model.float(), DataLoader(TensorDataset(X, Y), batch_size=8), probes=["gini"], loss="mse")
    assert "softmax_saturation" not in mse.meta["data"]  # no softmax in the loss


def test_allow_tf32_is_recorded_where_it_acts_only():
    """--allow-tf32 on the CPU changes no product (TF32 is CUDA float32 matmuls): the report says
    false, so a gate or a scan does not take a CPU run with the flag for another quantity."""
    import datetime

    from flatcheck import api
    from flatcheck.config import RunConfig, probe_requests

    root = Path(__file__).resolve().parents[1]
    config = RunConfig(checkpoint=root / "demo" / "digits_cnn.safetensors", spec=root / "model_specs" / "demo_digits.yaml",
                       data="digits", samples=16, probes=probe_requests("gini", {}), allow_tf32=True)
    session = api.open_session(config)
    assert session.device.type == "cpu"
    assert api._meta(session, datetime.datetime.now(datetime.timezone.utc), 0.0)["allow_tf32"] is False
