"""The batch that fills the device: grown only on CUDA, never under --bn-mode train nor past a
batch the user chose, and values unchanged by the growth (float64, the demo model)."""

from __future__ import annotations

import pytest

from flatcheck.engines.batchfill import fill_batch, grown_batch, rebatched
from tests.support.dense import make_case

pytestmark = pytest.mark.workflow  # whole workflows, seconds each: make test-all only


GIB = 2**30


def grow(**kw):
    args = dict(default=128, samples=1000, device_type="cuda", per_sample=10 * 2**20, limit=20 * GIB,
                bn_train=False, chosen=False)
    return grown_batch(**{**args, **kw})


def test_a_cuda_device_with_room_grows_the_batch_into_equal_batches():
    g = grow()
    assert g.size == 1000 and g.grown and "grown from 128" in g.reason  # 2,048 fit: all in one batch
    g = grow(limit=6 * GIB)  # 614 fit: two equal batches of 500, not 614 + 386
    assert g.size == 500 and "2 batches of 500" in g.reason
    assert g.size * 10 * 2**20 <= 6 * GIB


@pytest.mark.parametrize("kw, words", [
    (dict(device_type="cpu"), "CUDA device only"),
    (dict(bn_train=True), "--bn-mode train"),
    (dict(chosen=True), "chosen by the user"),
    (dict(samples=100), "one batch holds all 100"),
    (dict(limit=None), "cannot be read"),
    (dict(limit=1 * GIB), "does not fit"),  # 102 fit, fewer than the default
])
def test_the_batch_is_kept_and_says_why(kw, words):
    g = grow(**kw)
    assert g.size == 128 and not g.grown and words in g.reason


def test_bn_train_never_grows_even_with_a_cuda_device_and_room():
    case = make_case("cnn", n=40, batch_size=8, bn_mode="train")
    g = fill_batch(case.problem, default=8, chosen=False, max_memory=None, device_type="cuda", limit=64 * GIB)
    assert g.size == 8 and "--bn-mode train" in g.reason
    eval_case = make_case("cnn", n=40, batch_size=8)
    g = fill_batch(eval_case.problem, default=8, chosen=False, max_memory=None, device_type="cuda", limit=64 * GIB)
    assert g.size == 40  # the same model on running statistics grows


def test_on_a_cpu_nothing_is_measured_or_grown():
    case = make_case("mlp", n=40, batch_size=8)
    g = fill_batch(case.problem, default=8, chosen=False, max_memory=None, limit=64 * GIB)
    assert g.size == 8 and "not cpu" in g.reason


def test_the_planner_sizes_the_batch_by_the_measured_graph():
    case = make_case("mlp", n=40, batch_size=8)
    big = fill_batch(case.problem, default=8, chosen=False, max_memory=None, device_type="cuda", limit=64 * GIB)
    assert big.size == 40
    # a limit that holds 20 samples' graphs: two batches of 20
    from flatcheck.engines.microbatch import GRAPH_FACTOR, forward_bytes_per_sample

    per_sample = GRAPH_FACTOR * forward_bytes_per_sample(case.problem)
    g = fill_batch(case.problem, default=8, chosen=False, max_memory=None, device_type="cuda",
                   limit=20 * per_sample + 1)
    assert g.size == 20
    samples = rebatched(case.problem.samples, g.size)
    assert samples.batch_size == 20 and samples.num_batches == 2 and samples.n == 40


def demo_run(probes_only=("trace", "lmax", "adaptive-sharpness"), **kw):
    from flatcheck.api import run
    from flatcheck.config import RunConfig, probe_requests
    from tests.support.cli import ROOT

    options = {"trace": {"probes_max": 12, "rtol": "none"}, "adaptive-sharpness": {"probes_max": 8, "noise_draws": 4}}
    probes = probe_requests(list(probes_only), {k: v for k, v in options.items() if k in probes_only})
    config = RunConfig(checkpoint=ROOT / "demo" / "digits_cnn.safetensors", spec=ROOT / "model_specs" / "demo_digits.yaml",
                       data="digits", samples=200, dtype="float64", device="cpu", probes=probes, **kw)
    return run(config).to_dict()


def test_the_default_batch_and_the_grown_one_agree(monkeypatch):
    """The demo in float64 at the default batch (128: two batches of 200 samples) and grown,
    as on a CUDA device with 64 GiB for a probe (one batch of 200): each value equal to
    round-off, far inside the probe's own error; under --bn-mode train the batch is kept."""
    import flatcheck.engines.batchfill as batchfill

    base = demo_run()
    assert base["data"]["batch_size"] == 128 and base["data"]["batches"] == 2
    assert "batch_size_reason" not in base["data"]  # on a CPU nothing was decided
    real = batchfill.fill_batch
    monkeypatch.setattr(batchfill, "fill_batch",
                        lambda problem, **kw: real(problem, **{**kw, "device_type": "cuda", "limit": 64 * GIB}))
    grown = demo_run()
    assert grown["data"]["batch_size"] == 200 and grown["data"]["batches"] == 1
    assert "grown from 128" in grown["data"]["batch_size_reason"]
    kept = demo_run(bn_mode="train", probes_only=("trace",))
    assert kept["data"]["batch_size"] == 128 and kept["data"]["batches"] == 2
    chosen = demo_run(batch_size=64, probes_only=("trace",))  # a batch the user gave is theirs
    assert chosen["data"]["batch_size"] == 64
    for name, a in base["results"].items():
        b = grown["results"][name]
        assert a["matvecs"] == b["matvecs"]
        # the same sums in another grouping: round-off, a millionth of the probe's own error
        # (a difference of losses, as adaptive sharpness's Monte Carlo, carries the loss's
        # round-off, not the value's, so ulps of the value are no measure)
        own = a["stderr"] or a["error_bound"]
        assert own and abs(a["value"] - b["value"]) <= 1e-6 * own, name
