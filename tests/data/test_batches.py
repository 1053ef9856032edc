"""SampleSet: fixed order, exact weights, and refusal of data that changes between passes."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from flatcheck.data import Batch, Preprocess, SampleSet, create_dataset
from flatcheck.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def digits():
    return create_dataset("digits", preprocess=Preprocess(input_size=(64,)))


class Noisy(torch.utils.data.Dataset):
    """Random augmentation: new noise on every read."""

    def __init__(self, base, after_reads: int = 0):
        self.base, self.name, self.split = base, "noisy", "train"
        self.after_reads, self.reads = after_reads, 0

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        self.reads += 1
        x, y = self.base[i]
        if self.reads > self.after_reads:
            x = x + 1e-3 * torch.randn_like(x)
        return x, y


class Mutating(torch.utils.data.Dataset):
    """Deterministic until item `index` is read a third time: slips past the batch-0 check."""

    def __init__(self, base, index: int):
        self.base, self.index, self.count, self.name, self.split = base, index, 0, "mutating", "test"

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        if i == self.index:
            self.count += 1
            if self.count >= 3:
                x = x.clone()
                x[0] += 1.0
        return x, y


def test_weights_sum_to_one_with_uneven_last_batch(digits):
    s = SampleSet(digits, samples=None, batch_size=100)
    batches = list(s)
    assert (s.n, s.num_batches) == (1437, 15) and [b.index for b in batches] == list(range(15))
    assert [len(b.y) for b in batches] == [100] * 14 + [37]
    assert batches[-1].weight == 37 / 1437 and math.isclose(sum(b.weight for b in batches), 1.0)
    assert isinstance(batches[0], Batch) and batches[0].x.shape == (100, 64)
    assert batches[0].x.dtype == torch.float32 and batches[0].y.dtype == torch.int64


def test_first_n_in_fixed_order_every_pass(digits):
    s = SampleSet(digits, samples=250, batch_size=64, cache_bytes=0)
    assert not s.cached and s.num_batches == 4
    first, second = list(s), list(s)
    want = torch.stack([digits[i][0] for i in range(250)])
    assert torch.equal(torch.cat([b.x for b in first]), want)
    assert torch.cat([b.y for b in first]).tolist() == [digits[i][1] for i in range(250)]
    assert all(torch.equal(a.x, b.x) and torch.equal(a.y, b.y) for a, b in zip(first, second, strict=True))


def test_cache_and_stream_give_identical_batches(digits):
    cached = SampleSet(digits, samples=300, batch_size=128)
    streamed = SampleSet(digits, samples=300, batch_size=128, cache_bytes=300 * (64 * 4 + 8) - 1)
    assert cached.cached and not streamed.cached
    for a, b in zip(cached, streamed, strict=True):
        assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and (a.weight, a.index) == (b.weight, b.index)
    assert cached.describe() == streamed.describe()


def test_describe_and_fingerprint(digits):
    s = SampleSet(digits, samples=200, batch_size=32)
    d = s.describe()
    assert d == {"name": "digits", "split": "train", "samples": 200, "batch_size": 32, "batches": 7,
                 "fingerprint": d["fingerprint"]}
    assert isinstance(d["fingerprint"], str) and len(d["fingerprint"]) == 16
    int(d["fingerprint"], 16)
    # a property of the samples, not of batching, device dtype or a fresh process
    assert SampleSet(digits, samples=200, batch_size=7, dtype=torch.float64).fingerprint == s.fingerprint
    again = create_dataset("digits", preprocess=Preprocess(input_size=(64,)))
    assert SampleSet(again, samples=200, batch_size=32).fingerprint == s.fingerprint
    assert SampleSet(digits, samples=199, batch_size=32).fingerprint != s.fingerprint
    test = create_dataset("digits", split="test", preprocess=Preprocess(input_size=(64,)))
    assert SampleSet(test, samples=200, batch_size=32).fingerprint != s.fingerprint


def test_dtype_is_applied(digits):
    b = next(iter(SampleSet(digits, samples=10, batch_size=4, dtype=torch.float64)))
    assert b.x.dtype == torch.float64 and b.y.dtype == torch.int64 and b.x.device.type == "cpu"


def test_random_augmentation_is_refused(digits):
    with pytest.raises(DataError) as e:
        SampleSet(Noisy(digits), samples=100, batch_size=32)
    assert str(e.value) == ("data 'noisy' changed between passes (batch 0): random augmentation? "
                            "flatcheck needs a deterministic data set")


def test_change_on_a_later_pass_is_caught_while_streaming(digits):
    s = SampleSet(Mutating(digits, index=70), samples=100, batch_size=32, cache_bytes=0)
    list(s)  # second read of item 70: still the same
    with pytest.raises(DataError, match=r"changed between passes \(batch 2\)"):
        list(s)


def test_cached_set_never_rereads(digits):
    ds = Noisy(digits, after_reads=10**9)
    s = SampleSet(ds, samples=50, batch_size=16)
    reads = ds.reads
    list(s), list(s)
    assert s.cached and ds.reads == reads == 50 + 16  # one full pass plus batch 0 twice


def test_sample_and_batch_size_errors(digits):
    from flatcheck.settings import flag_of

    # the setting is named in code as its keyword; the CLI says it as its flag
    with pytest.raises(DataError) as e:
        SampleSet(digits, samples=5000, batch_size=8)
    assert "samples 5000" in str(e.value) and "1437" in str(e.value)
    assert "--samples 5000" in e.value.worded(flag_of)
    for bad in (0, -3, 2.5):
        with pytest.raises(ConfigError, match="batch_size") as e:
            SampleSet(digits, samples=10, batch_size=bad)
        assert "--batch-size" in e.value.worded(flag_of)
    with pytest.raises(ConfigError, match="samples") as e:
        SampleSet(digits, samples=0, batch_size=8)
    assert "--samples" in e.value.worded(flag_of)


def test_batch_larger_than_samples(digits):
    s = SampleSet(digits, samples=5, batch_size=64)
    (b,) = list(s)
    assert s.num_batches == 1 and b.weight == 1.0 and len(b.x) == 5


def test_samples_of_different_shapes_are_refused():
    class Ragged(torch.utils.data.Dataset):
        name, split = "ragged", "train"

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(3, 4 + (i == 2), 4), 0

    with pytest.raises(DataError, match=r"different shapes: \(3, 4, 4\) and \(3, 5, 4\) at index 2"):
        SampleSet(Ragged(), samples=None, batch_size=2)


class OneByOne(torch.utils.data.Dataset):
    """The same data set read sample by sample: its batch reader (items) hidden."""

    def __init__(self, base):
        self.base, self.name, self.split = base, base.name, base.split

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        return self.base[i]


@pytest.mark.parametrize("pre, batched", [
    (Preprocess(), True),
    (Preprocess(input_size=(1, 8, 8), mean=(0.3,), std=(0.7,)), True),
    (Preprocess(input_size=(64,), mean=(0.1,), std=(0.3,)), True),
    (Preprocess(input_size=(1, 12, 12)), False),  # a resize: one by one
    (Preprocess(input_size=(3, 8, 8)), False),  # a channel conversion: one by one
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_batch_read_at_once_is_the_samples_read_one_by_one(pre, batched, dtype):
    """A data set held in one tensor is read a batch at a time where its preprocessing is
    elementwise: the same bits, labels and fingerprint as reading each sample."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the resize's notice
        data = create_dataset("digits", preprocess=pre)
    assert (data.items(0, 3) is not None) == batched
    whole = SampleSet(data, samples=333, batch_size=100, dtype=dtype)
    single = SampleSet(OneByOne(data), samples=333, batch_size=100, dtype=dtype)
    assert whole.fingerprint == single.fingerprint
    bits = torch.int32 if dtype == torch.float32 else torch.int64
    for a, b in zip(whole, single, strict=True):
        assert a.x.dtype == b.x.dtype == dtype and a.x.shape == b.x.shape and a.x.is_contiguous()
        assert torch.equal(a.x.view(bits), b.x.view(bits)) and a.y.dtype == b.y.dtype and torch.equal(a.y, b.y)


def _npz_pair(tmp_path):
    """x in float64 (values float32 cannot hold) saved as-is and as its float32 copy."""
    rng = np.random.default_rng(3)
    x, y = rng.random((10, 4)), rng.integers(0, 3, 10)
    np.savez(tmp_path / "d64.npz", x=x, y=y)
    np.savez(tmp_path / "d32.npz", x=x.astype(np.float32), y=y)
    return x


def _npz_set(tmp_path, name, dtype, pre=Preprocess(), one_by_one=False):
    data = create_dataset(f"npz:{tmp_path / name}", preprocess=pre)
    return SampleSet(OneByOne(data) if one_by_one else data, samples=None, batch_size=4, dtype=dtype)


@pytest.mark.parametrize("one_by_one", [False, True])
@pytest.mark.parametrize("pre", [Preprocess(), Preprocess(input_size=(4,), mean=(0.3,), std=(0.7,))])
def test_float64_data_reaches_a_float64_run_unrounded(tmp_path, pre, one_by_one):
    x = torch.from_numpy(_npz_pair(tmp_path))
    want = x if pre.mean is None else (x - 0.3) / 0.7  # the spec's normalisation, in float64
    samples = _npz_set(tmp_path, "d64.npz", torch.float64, pre, one_by_one)
    assert torch.equal(torch.cat([b.x for b in samples]), want)
    assert "rounded" not in samples.describe()


def test_a_float32_run_rounds_float64_data_and_says_so(tmp_path):
    x = _npz_pair(tmp_path)
    samples = _npz_set(tmp_path, "d64.npz", torch.float32)
    assert torch.equal(torch.cat([b.x for b in samples]), torch.from_numpy(x.astype(np.float32)))
    assert samples.describe()["rounded"].startswith("float64 inputs → float32")
    assert "rounded" not in _npz_set(tmp_path, "d32.npz", torch.float32).describe()


def test_the_fingerprint_tells_float64_data_from_its_float32_copy_where_they_are_measured_apart(tmp_path):
    _npz_pair(tmp_path)
    fp = {(name, dtype): _npz_set(tmp_path, name, dtype).fingerprint
          for name in ("d64.npz", "d32.npz") for dtype in (torch.float32, torch.float64)}
    assert fp["d64.npz", torch.float64] != fp["d32.npz", torch.float64]
    assert fp["d64.npz", torch.float64] == _npz_set(tmp_path, "d64.npz", torch.float64).fingerprint  # a rerun
    # a float32 run measures both as the same float32 values; float32 data reads alike in any run,
    # so its baselines keep their fingerprint
    assert fp["d64.npz", torch.float32] == fp["d32.npz", torch.float32] == fp["d32.npz", torch.float64]


def test_uint8_pixels_are_divided_in_float32_in_a_float64_run(tmp_path):
    """As torchvision's to_tensor and flatcheck.measure divide them: the values models are trained on."""
    u8 = np.random.default_rng(4).integers(0, 256, (6, 3, 2, 2), dtype=np.uint8)
    np.savez(tmp_path / "u8.npz", x=u8, y=np.zeros(6, dtype=np.int64))
    samples = _npz_set(tmp_path, "u8.npz", torch.float64)
    assert torch.equal(torch.cat([b.x for b in samples]), torch.from_numpy(u8).float().div(255).double())
