"""Data a caller holds in memory — (x, y) tensors, a DataLoader, any re-iterable of (x, y)
batches, or a map-style data set — as the map-style data set a SampleSet reads.

Every estimator assumes the loss is the same function on every pass. A shuffling loader or
random augmentation breaks that, so an iterable is read once, up to `samples`, and held in
memory when that fits the data cache (`cached`: later passes never touch the loader again).
When it does not fit, the source is re-iterated on each pass and the SampleSet's per-batch
digests refuse a source whose batches differ between passes, with the same message the CLI
gives for a data set that changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from flatcheck.errors import InputError

# as SampleSet's device cache: the bytes of the held copy (inputs as read, labels int64)
CACHE_BYTES = 2**30


@dataclass(frozen=True)
class MemoryData:
    dataset: Dataset  # map-style: dataset[i] -> (x_i, y_i); `name` and `split` label it
    source: str  # "tensors", "dataset", "DataLoader" or "iterable"
    cached: bool  # read once and held here: later passes do not re-read the caller's source

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "cached": self.cached}


class _Pairs(Dataset):
    """(x[i], y[i]) of two tensors of the same length."""

    def __init__(self, x: Tensor, y: Tensor, name: str, split: str):
        self.x, self.y, self.name, self.split = x, y, name, split

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.x[i], self.y[i]


class _Labelled(Dataset):
    """A caller's map-style data set with the name and split a SampleSet reports."""

    def __init__(self, dataset: Dataset, name: str, split: str):
        self.dataset, self.name, self.split = dataset, name, split

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        return self.dataset[i]


class _Streamed(Dataset):
    """A re-iterable of batches read sample by sample in order, as a SampleSet does on each
    pass; going back (a new pass) iterates the source again from its start."""

    def __init__(self, source: Iterable, n: int, what: str, name: str, split: str):
        self.source, self.n, self.what, self.name, self.split = source, n, what, name, split
        self._it: Iterator | None = None
        self._batch: tuple[Tensor, Tensor] | None = None
        self._start = 0  # index of the current batch's first sample
        self._pass = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if self._it is None or i < self._start:
            self._it, self._batch, self._start, self._pass = iter(self.source), None, 0, self._pass + 1
        while self._batch is None or i >= self._start + len(self._batch[0]):
            if self._batch is not None:
                self._start += len(self._batch[0])
            item = next(self._it, None)
            if item is None:
                raise InputError(f"{self.what} gave {self._start} samples on pass {self._pass}, fewer than the "
                                 f"{self.n} of its first pass: flatcheck needs the same data on every pass")
            self._batch = _pair(item, self.what, self._start)
        x, y = self._batch
        return x[i - self._start], y[i - self._start]


def memory_data(data: Any, *, samples: int | None, what: str = "data", split: str = "train",
                cache_bytes: int | None = None) -> MemoryData:
    """`data` as a map-style data set of at most `samples` items (all of them when None).

    `what` names the argument in error messages ("data", "test_data"); cache_bytes defaults
    to CACHE_BYTES."""
    cache_bytes = CACHE_BYTES if cache_bytes is None else cache_bytes
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, Tensor) for t in data):
        x, y = _pair(tuple(data), what, 0)
        if not len(x):
            raise InputError(f"{what}: the tensors are empty (x of shape {tuple(x.shape)}); give at least one sample")
        return MemoryData(_Pairs(x, y, "tensors", split), "tensors", cached=False)
    if isinstance(data, Tensor):
        raise InputError(f"{what}: a tensor alone has no labels; pass (x, y), a DataLoader or batches of (x, y)")
    if isinstance(data, Dataset) and not isinstance(data, DataLoader) and hasattr(data, "__len__") \
            and hasattr(data, "__getitem__") and not hasattr(data, "__iter__"):
        name = getattr(data, "name", type(data).__name__)
        if not len(data):
            raise InputError(f"{what}: the data set {name} is empty; give at least one sample")
        return MemoryData(_Labelled(data, name, getattr(data, "split", split)), "dataset", cached=False)
    if not isinstance(data, Iterable):
        raise InputError(f"{what}: expected (x, y) tensors, a DataLoader or an iterable of (x, y) batches, "
                         f"got {type(data).__name__}")
    source = "DataLoader" if isinstance(data, DataLoader) else "iterable"
    label = f"{what} ({source})"
    once = iter(data) is data  # a generator or iterator: there is no second pass to read
    held, n, nbytes = _read_once(data, samples, label, cache_bytes)
    if held is not None:
        x, y = held
        return MemoryData(_Pairs(x, y, source, split), source, cached=True)
    if once:
        raise InputError(f"{label}: an iterator can be read only once and its {n} samples "
                         f"({nbytes / 2**30:.1f} GiB) do not fit the {cache_bytes / 2**30:g} GiB data cache; "
                         f"pass a DataLoader or a list of batches, or fewer samples")
    return MemoryData(_Streamed(data, n, label, source, split), source, cached=False)


def _read_once(data: Iterable, samples: int | None, what: str,
               cache_bytes: int) -> tuple[tuple[Tensor, Tensor] | None, int, int]:
    """One pass: (x, y) held in memory when they fit `cache_bytes`, else None; and the
    number of samples (capped at `samples`) and their bytes."""
    xs: list[Tensor] | None = []
    ys: list[Tensor] = []
    n = nbytes = 0
    for item in data:
        if samples is not None and n >= samples:
            break
        x, y = _pair(item, what, n)
        if samples is not None and n + len(x) > samples:
            x, y = x[: samples - n], y[: samples - n]
        n += len(x)
        nbytes += x.numel() * x.element_size() + 8 * len(y)
        if xs is not None and nbytes <= cache_bytes:
            xs.append(x.detach().clone())  # the loader may reuse its buffers
            ys.append(y.detach().clone())
        else:
            xs = None
    if n == 0:
        raise InputError(f"{what} gave no samples")
    if samples is not None and n < samples:
        raise InputError(f"samples={samples} is more than the {n} samples {what} gives")
    if xs is None:
        return None, n, nbytes
    return (_cat(xs, what), torch.cat(ys)), n, nbytes


def _cat(xs: list[Tensor], what: str) -> Tensor:
    shapes = {tuple(x.shape[1:]) for x in xs}
    if len(shapes) > 1:
        raise InputError(f"{what} gives batches of samples of different shapes: {sorted(shapes)}")
    return torch.cat(xs)


def _pair(item: Any, what: str, first: int) -> tuple[Tensor, Tensor]:
    """A batch as (x, y) on the CPU: x floating, y integer class indices of shape (B,)."""
    if isinstance(item, dict) or not isinstance(item, (tuple, list)) or len(item) != 2:
        kind = type(item).__name__ + (f" of {len(item)}" if isinstance(item, (tuple, list)) else "")
        raise InputError(f"{what}: the batch at sample {first} is a {kind}; flatcheck needs (x, y) pairs "
                         "of inputs and integer labels")
    x, y = (torch.as_tensor(t) for t in item)
    if x.ndim < 1 or y.ndim != 1 or len(x) != len(y):
        raise InputError(f"{what}: the batch at sample {first} has x of shape {tuple(x.shape)} and y of shape "
                         f"{tuple(y.shape)}; y must be one label per sample")
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise InputError(f"{what}: labels must be integer class indices, got {y.dtype} (soft or one-hot "
                         "labels are not supported)")
    if not (x.dtype.is_floating_point or x.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32,
                                                       torch.int64)):
        raise InputError(f"{what}: inputs must be real numbers, got {x.dtype}")
    return x.detach().cpu(), y.detach().cpu()


def default_batch_size(data: Any) -> int | None:
    """The caller's own batch size, when the source has one."""
    size = getattr(data, "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
