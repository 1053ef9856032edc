"""Data a caller holds in memory — (x, y) tensors, a DataLoader, any re-iterable of (x, y)
batches, or a map-style data set — as the map-style data set a SampleSet reads.

Every estimator assumes the loss is the same function on every pass. A shuffling loader or
random augmentation breaks that, so an iterable is read once, up to `samples`, and held in
memory when that fits the data cache (`cached`: later passes never touch the loader again).
When it does not fit, the source is re-iterated on each pass and the SampleSet's per-batch
digests refuse a source whose batches differ between passes, with the same message the CLI
gives for a data set that changes.

Inputs are floating point, or uint8 pixels 0..255, which are divided by 255 as each sample is
read: the rule of the CLI's npz and image readers, so the same images measure the same from a
file and from memory (the report's data.scaled says so). Other integer inputs are refused, as
the CLI's npz reader refuses them: their scale cannot be told.
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
# what the report's data.scaled says of uint8 inputs
SCALED = "uint8 / 255"


@dataclass(frozen=True)
class MemoryData:
    dataset: Dataset  # map-style: dataset[i] -> (x_i, y_i); `name` and `split` label it
    source: str  # "tensors", "dataset", "DataLoader" or "iterable"
    cached: bool  # read once and held here: later passes do not re-read the caller's source
    scaled: bool = False  # uint8 inputs, divided by 255 as they are read

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "cached": self.cached, **({"scaled": SCALED} if self.scaled else {})}


class _Pairs(Dataset):
    """(x[i], y[i]) of two tensors of the same length."""

    def __init__(self, x: Tensor, y: Tensor, name: str, split: str):
        self.x, self.y, self.name, self.split = x, y, name, split

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return _scaled(self.x[i]), self.y[i]


class _Labelled(Dataset):
    """A caller's map-style data set with the name and split a SampleSet reports."""

    def __init__(self, dataset: Dataset, name: str, split: str, what: str):
        self.dataset, self.name, self.split, self.what = dataset, name, split, what

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        x, y = self.dataset[i]
        x = torch.as_tensor(x)
        _check_inputs(x, self.what, f"sample {i}")
        return _scaled(x), y


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
        return _scaled(x[i - self._start]), y[i - self._start]


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
        return MemoryData(_Pairs(x, y, "tensors", split), "tensors", cached=False, scaled=x.dtype == torch.uint8)
    if isinstance(data, Tensor):
        raise InputError(f"{what}: a tensor alone has no labels; pass (x, y), a DataLoader or batches of (x, y)")
    if isinstance(data, tuple) and data and all(isinstance(t, Tensor) for t in data):
        # (x, y, w) and the like: read as batches, it would be refused as "the batch at sample 0"
        raise InputError(f"{what}: a tuple of {len(data)} tensors; pass (x, y), inputs and integer labels, a "
                         "DataLoader or batches of (x, y)")
    if isinstance(data, Dataset) and not isinstance(data, DataLoader) and hasattr(data, "__len__") \
            and hasattr(data, "__getitem__") and not hasattr(data, "__iter__"):
        name = getattr(data, "name", type(data).__name__)
        if not len(data):
            raise InputError(f"{what}: the data set {name} is empty; give at least one sample")
        item = data[0]  # its inputs' dtype, for the report; a malformed item is the SampleSet's to name
        first = torch.as_tensor(item[0]) if isinstance(item, (tuple, list)) and len(item) == 2 else None
        if first is not None:
            _check_inputs(first, what, "sample 0")
        return MemoryData(_Labelled(data, name, getattr(data, "split", split), what), "dataset", cached=False,
                          scaled=first is not None and first.dtype == torch.uint8)
    if not isinstance(data, Iterable):
        raise InputError(f"{what}: expected (x, y) tensors, a DataLoader or an iterable of (x, y) batches, "
                         f"got {type(data).__name__}")
    source = "DataLoader" if isinstance(data, DataLoader) else "iterable"
    label = f"{what} ({source})"
    once = iter(data) is data  # a generator or iterator: there is no second pass to read
    held, n, nbytes, scaled = _read_once(data, samples, label, cache_bytes)
    if held is not None:
        x, y = held
        return MemoryData(_Pairs(x, y, source, split), source, cached=True, scaled=scaled)
    if once:
        raise InputError(f"{label}: an iterator can be read only once and its {n} samples "
                         f"({nbytes / 2**30:.1f} GiB) do not fit the {cache_bytes / 2**30:g} GiB data cache; "
                         f"pass a DataLoader or a list of batches, or fewer samples")
    return MemoryData(_Streamed(data, n, label, source, split), source, cached=False, scaled=scaled)


def _read_once(data: Iterable, samples: int | None, what: str,
               cache_bytes: int) -> tuple[tuple[Tensor, Tensor] | None, int, int, bool]:
    """One pass: (x, y) held in memory when they fit `cache_bytes`, else None; the number
    of samples (capped at `samples`) and their bytes; whether the inputs are uint8."""
    xs: list[Tensor] | None = []
    ys: list[Tensor] = []
    n = nbytes = 0
    scaled = None
    for item in data:
        if samples is not None and n >= samples:
            break
        x, y = _pair(item, what, n)
        if scaled is None:
            scaled = x.dtype == torch.uint8
        elif scaled != (x.dtype == torch.uint8):  # joined, uint8 would be promoted unscaled
            first = "uint8" if scaled else "floating-point"
            raise InputError(f"{what}: the batch at sample {n} holds {x.dtype} inputs, the first batch {first} ones; "
                             f"give every batch in one form (uint8 0..255 or floats)")
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
        return None, n, nbytes, bool(scaled)
    return (_cat(xs, what), torch.cat(ys)), n, nbytes, bool(scaled)


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
    _check_inputs(x, what, f"the batch at sample {first}")
    return x.detach().cpu(), y.detach().cpu()


def _check_inputs(x: Tensor, what: str, where: str) -> None:
    if x.dtype.is_floating_point or x.dtype == torch.uint8:
        return
    if x.dtype.is_complex or x.dtype == torch.bool:
        raise InputError(f"{what}: inputs must be real numbers, got {x.dtype}")
    raise InputError(f"{what}: {where} has {x.dtype} inputs; flatcheck takes floats, or uint8 pixels 0..255 "
                     f"(divided by 255, as the CLI reads them): pass x.float() for values as they are, or "
                     f"x.to(torch.uint8) for 0..255 pixels")


def _scaled(x: Tensor) -> Tensor:
    """A sample as the model sees it: uint8 pixels divided by 255 (float32), as the CLI's
    readers do; floats as they are."""
    return x.float().div(255.0) if x.dtype == torch.uint8 else x


def default_batch_size(data: Any) -> int | None:
    """The caller's own batch size, when the source has one."""
    size = getattr(data, "batch_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
