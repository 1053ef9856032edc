"""The one place that iterates data: fixed-order, verified-identical batches, every pass.

Every estimator in flatcheck (Hessian-vector products, Hutchinson traces, Lanczos)
averages over many passes and silently assumes that the loss is the same function each
time. A data set whose samples differ between passes (random augmentation, a shuffling
sampler) breaks that assumption without any visible symptom, so a SampleSet proves the
contrary: batch 0 is read twice at construction and compared bit for bit, and every
batch's digest from the first full pass is re-checked on every later streamed pass.
The first pass also refuses non-finite inputs: it is the one pass that reads every sample,
and the digests guarantee that later passes read the same finite values.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import Tensor
from torch.utils.data import Dataset

from flatcheck.errors import ConfigError, DataError, setting

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class Batch:
    x: Tensor  # on the SampleSet's device and dtype
    y: Tensor  # int64 labels, same device
    weight: float  # len(batch) / n: a weighted sum of per-batch means is the mean over all n
    index: int
    first: int  # index in the data set of the batch's first sample, for naming a bad one


class SampleSet:
    """The first `samples` items of a data set, in index order, cut into batches.

    When n x (bytes per sample) <= cache_bytes, all batches are moved to the device once
    and the same tensors are yielded on every pass (callers must not modify them in
    place); otherwise batches are re-read from the data set on each pass and checked
    against the digests of the first pass.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        samples: int | None,
        batch_size: int,
        device: torch.device | str = _CPU,
        dtype: torch.dtype = torch.float32,
        cache_bytes: int = 2**30,
    ) -> None:
        self.dataset = dataset
        self.name: str = getattr(dataset, "name", type(dataset).__name__)
        self.split: str = getattr(dataset, "split", "?")
        self.device = torch.device(device)
        self.dtype = dtype
        self.rounded = False  # float64 inputs read as float32 (a float32 run): the report says so
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"{setting('batch_size')} must be an integer >= 1, got {batch_size!r}")
        available = len(dataset)  # type: ignore[arg-type]
        if samples is None:
            samples = available
        elif isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ConfigError(f"{setting('samples')} must be an integer >= 1, got {samples!r}")
        elif samples > available:
            raise DataError(
                f"{setting('samples')} {samples} is more than the {available} samples of data '{self.name}' split '{self.split}'"
            )
        if samples < 1:
            raise DataError(f"data '{self.name}' split '{self.split}' has no samples")
        self.n = samples
        self.batch_size = batch_size
        self.num_batches = math.ceil(self.n / batch_size)
        self._weights = [len(self._range(k)) / self.n for k in range(self.num_batches)]
        self._first_pass(cache_bytes)

    # ------------------------------------------------------------------ construction

    def _first_pass(self, cache_bytes: int) -> None:
        first = self._read(0)
        self.sample_shape: tuple[int, ...] = tuple(first[0].shape[1:])
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        per_sample = math.prod(self.sample_shape) * itemsize + 8  # + the int64 label
        self.cached = self.n * per_sample <= cache_bytes

        hx, hy = hashlib.blake2b(digest_size=16), hashlib.blake2b(digest_size=16)
        self._digests: list[bytes] = []
        cache: list[tuple[Tensor, Tensor]] = []
        for k in range(self.num_batches):
            x, y = self._read(k)
            if k == 0 and not (_same_bits(first[0], x) and torch.equal(first[1], y)):
                raise self._changed(0)
            self._check_finite(k, x)
            self._digests.append(_digest(x, y))
            # fed sample by sample in order, so the fingerprint does not depend on batch size
            hx.update(_bytes(x))
            hy.update(_bytes(y))
            if self.cached:
                cache.append(self._to_device(x, y))
        meta = f"{self.n}|{self.sample_shape}".encode()
        self.fingerprint = hashlib.blake2b(hx.digest() + hy.digest() + meta, digest_size=8).hexdigest()
        self._cache = cache if self.cached else None

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[Batch]:
        for k in range(self.num_batches):
            if self._cache is not None:
                x, y = self._cache[k]
            else:
                xc, yc = self._read(k)
                if _digest(xc, yc) != self._digests[k]:
                    raise self._changed(k)
                x, y = self._to_device(xc, yc)
            yield Batch(x=x, y=y, weight=self._weights[k], index=k, first=self._range(k).start)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "split": self.split,
            "samples": self.n,
            "batch_size": self.batch_size,
            "batches": self.num_batches,
            "fingerprint": self.fingerprint,
            # grey ↔ RGB for the model's channels, when the data set had to be converted
            **({"channels": conv} if (conv := getattr(self.dataset, "channel_conversion", None)) else {}),
            # images resized to the spec's input size ("32×32 → 224×224, bilinear")
            **({"resized": size} if (size := getattr(self.dataset, "resize", None)) else {}),
            # float64 inputs measured as their float32 rounding (the fingerprint is of what was measured)
            **({"rounded": "float64 inputs → float32 (--dtype float64 keeps them)"} if self.rounded else {}),
        }

    def __repr__(self) -> str:
        mode = "cached" if self.cached else "streamed"
        return f"SampleSet({self.name!r}, split={self.split!r}, n={self.n}, batch_size={self.batch_size}, {mode})"

    # ------------------------------------------------------------------ helpers

    def _range(self, k: int) -> range:
        return range(k * self.batch_size, min(self.n, (k + 1) * self.batch_size))

    def _read(self, k: int) -> tuple[Tensor, Tensor]:
        """Batch k on the CPU as float32 (float64 kept in a float64 run) / int64: the form digests are taken of."""
        ref = getattr(self, "sample_shape", None)
        span = self._range(k)
        # a data set that gives a batch at once (data.registry's PreparedDataset over samples in one tensor)
        # gives each sample as its [i] would: no Python step per sample
        whole = getattr(self.dataset, "items", None)
        got = whole(span.start, span.stop) if whole is not None else None
        if got is not None:
            x, y = got
            if ref is not None and tuple(x.shape[1:]) != ref:
                raise DataError(
                    f"data '{self.name}' gives samples of different shapes: {ref} and {tuple(x.shape[1:])} "
                    f"at index {span.start}; set input_size in the model spec to resize them"
                )
            return self._as_read(x), y.to(torch.int64)
        xs, ys = [], []
        for i in span:
            x, y = self.dataset[i]
            x = torch.as_tensor(x)
            if ref is None:
                ref = tuple(x.shape)
            elif tuple(x.shape) != ref:
                raise DataError(
                    f"data '{self.name}' gives samples of different shapes: {ref} and {tuple(x.shape)} "
                    f"at index {i}; set input_size in the model spec to resize them"
                )
            xs.append(x)
            ys.append(int(y))
        return self._as_read(torch.stack(xs)), torch.tensor(ys, dtype=torch.int64)

    def _as_read(self, x: Tensor) -> Tensor:
        # float64 inputs of a float64 run stay float64: read through float32 they would be
        # rounded, and the run would measure another loss than the caller's (flatcheck.measure).
        # A float32 run computes in float32 throughout, so it rounds them (and describe says so).
        # The fingerprint is of the values read: it tells a float64 file from its float32 copy
        # exactly where the two are measured differently, and keeps float32 data's as it was.
        read = torch.float64 if x.dtype == torch.float64 and self.dtype == torch.float64 else torch.float32
        self.rounded = self.rounded or (x.dtype == torch.float64 and read == torch.float32)
        return x.to(read).contiguous()

    def _to_device(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        return x.to(device=self.device, dtype=self.dtype), y.to(device=self.device)

    def _check_finite(self, k: int, x: Tensor) -> None:
        # x is as read, in the run's dtype or float32 (narrower), so finite here is finite on the device
        bad = ~torch.isfinite(x.flatten(1)).all(1)
        if bool(bad.any()):
            row = int(bad.nonzero()[0])
            value = x[row][~torch.isfinite(x[row])][0].item()
            raise DataError(
                f"data '{self.name}' split '{self.split}': sample {self._range(k).start + row} has non-finite "
                f"inputs ({value}); flatcheck needs finite inputs, so fix or drop that sample"
            )

    def _changed(self, k: int) -> DataError:
        return DataError(
            f"data '{self.name}' changed between passes (batch {k}): random augmentation? "
            f"flatcheck needs a deterministic data set"
        )


def _bytes(t: Tensor) -> memoryview:
    return memoryview(t.contiguous().numpy()).cast("B")


def _digest(x: Tensor, y: Tensor) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(_bytes(x))
    h.update(_bytes(y))
    return h.digest()


def _same_bits(a: Tensor, b: Tensor) -> bool:
    # torch.equal says NaN != NaN, yet a NaN that comes back as the same NaN is stable data
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))
