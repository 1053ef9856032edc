"""The batch that fills the device: grown only on CUDA, never under --bn-mode train nor past a
batch the user chose, and values unchanged by the growth (float64, the demo model)."""

from __future__ import annotations

import pytest

from flatcheck.engines.batchfill import GROWTH_SHARE, fill_batch, grown_batch, rebatched
from tests.support.dense import make_case

GIB = 2**30


def grow(**kw):
    args = dict(default=128, samples=1000, device_type="cuda", per_sample=10 * 2**20, limit=40 * GIB,
                bn_train=False, chosen=False)
    return grown_batch(**{**args, **kw})


def test_a_cuda_device_with_room_grows_the_batch_into_equal_batches():
    g = grow()
    fits = int(40 * GIB * GROWTH_SHARE) // (10 * 2**20)  # 2048: all 1,000 samples in one batch
    assert fits >= 1000 and g.size == 1000 and g.grown and "grown from 128" in g.reason
    g = grow(limit=12 * GIB)  # 614 fit: two equal batches of 500, not 614 + 386
    assert g.size == 500 and "2 batches of 500" in g.reason
    assert g.size * 10 * 2**20 <= GROWTH_SHARE * 12 * GIB


@pytest.mark.parametrize("kw, words", [
    (dict(device_type="cpu"), "CUDA device only"),
    (dict(bn_train=True), "--bn-mode train"),
    (dict(chosen=True), "chosen by the user"),
    (dict(samples=100), "one batch holds all 100"),
    (dict(limit=None), "cannot be read"),
    (dict(limit=2 * GIB), "does not fit"),  # 102 fit, fewer than the default
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
    # a limit that holds 20 samples' graphs at GROWTH_SHARE: two batches of 20
    from flatcheck.engines.microbatch import GRAPH_FACTOR, forward_bytes_per_sample

    per_sample = GRAPH_FACTOR * forward_bytes_per_sample(case.problem)
    g = fill_batch(case.problem, default=8, chosen=False, max_memory=None, device_type="cuda",
                   limit=int(20 * per_sample / GROWTH_SHARE) + 1)
    assert g.size == 20
    samples = rebatched(case.problem.samples, g.size)
    assert samples.batch_size == 20 and samples.num_batches == 2 and samples.n == 40
