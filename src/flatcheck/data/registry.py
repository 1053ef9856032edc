"""Named data sources, looked up by URI (`cifar10`, `npz:/x/y.npz`), in the style of timm.

A source is a factory registered with `@register_dataset`; it returns raw samples in
[0, 1]. `create_dataset` resolves the URI, the root and the split, and wraps the result in
a `PreparedDataset` that applies the model's `Preprocess` per item, so that no other part
of flatcheck needs to know where data came from.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils.data import Dataset

import flatcheck.data.builtin  # noqa: F401  (registers the built-in sources)
from flatcheck.data.catalogue import (
    _REGISTRY, SPLITS, DataSource, MissingSplitError, _canonical, register_dataset,
)
from flatcheck.data.preprocess import Preprocess
from flatcheck.data.roots import ROOT_ENV
from flatcheck.data.transform import (apply_preprocess, apply_preprocess_batch, channel_conversion, elementwise,
                                      image_resize)
from flatcheck.errors import DataError, InternalError

_AS_IS = Preprocess()  # frozen, so one shared default is safe


def list_datasets(pattern: str = "*") -> list[str]:
    """Registered names matching the fnmatch `pattern` (case-insensitive), sorted."""
    pat = pattern.lower()
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pat))


def _usage() -> str:
    return ", ".join(f"{n}:PATH" if _REGISTRY[n].takes_path else n for n in sorted(_REGISTRY))


def parse_uri(uri: str) -> tuple[str, str | None]:
    """`name` or `name:PATH` -> (canonical name, path or None); DataError for unknown names."""
    name, sep, path = uri.partition(":")
    key = _canonical(name)
    if key not in _REGISTRY:
        hint = ""
        if not sep and (os.sep in uri or "." in uri):
            kind = "npz" if uri.lower().endswith(".npz") else "imagefolder"
            hint = f" (did you mean {kind}:{uri}?)"
        raise DataError(f"unknown data set '{uri}'{hint}; available: {_usage()}")
    entry = _REGISTRY[key]
    if entry.takes_path and not path:
        raise DataError(f"data set '{key}' needs a path: expected {key}:PATH, got '{uri}'")
    if not entry.takes_path and sep:
        raise DataError(f"data set '{key}' takes no path: expected '{key}', got '{uri}'")
    return key, (path if entry.takes_path else None)


def resolve_root(root: str | Path | None) -> Path | None:
    """Explicit root, else $FLATCHECK_DATA_ROOT, else None."""
    if root is None or str(root) == "":
        root = os.environ.get(ROOT_ENV) or None
    return Path(root).expanduser() if root is not None else None


def create_dataset(
    uri: str,
    *,
    root: str | Path | None = None,
    split: str = "train",
    preprocess: Preprocess = _AS_IS,
    num_classes: int | None = None,
    seed: int = 0,
) -> PreparedDataset:
    """Build the data set named by `uri` for `split`, preprocessed for the model.

    num_classes is the model's output count: sources without an inherent class count
    (synthetic) use it, and a source with more classes than the model is refused, since
    its labels would index past the logits.
    """
    key, path = parse_uri(uri)
    if split not in SPLITS:
        raise DataError(f"data set '{key}': split '{split}' is not available; expected one of {', '.join(SPLITS)}")
    source = _REGISTRY[key].factory(
        root=resolve_root(root),
        split=split,
        path=path,
        num_classes=num_classes,
        input_size=tuple(preprocess.input_size) if preprocess.input_size is not None else None,
        seed=seed,
    )
    name = f"{key}:{path}" if path is not None else key
    if num_classes is not None and source.num_classes is not None and source.num_classes > num_classes:
        raise DataError(
            f"data '{name}' has {source.num_classes} classes but the model has {num_classes} outputs"
        )
    return PreparedDataset(name, split, source, preprocess)


class PreparedDataset(Dataset):
    """A source's split with the model's preprocessing applied lazily to every item.

    Item 0 is prepared at construction so that a data set which cannot fit the model
    fails when it is created, not half-way through a run.
    """

    def __init__(self, name: str, split: str, source: DataSource, preprocess: Preprocess) -> None:
        self.name = name
        self.split = split
        self.source = source
        self.preprocess = preprocess
        self.description = source.description
        self.num_classes = source.num_classes
        self._len = len(source.dataset)  # type: ignore[arg-type]
        if self._len == 0:
            raise MissingSplitError(f"data '{name}' split '{split}' has no samples ({source.description})")
        x0, _ = self[0]
        self.sample_shape: tuple[int, ...] = tuple(x0.shape)
        # the report says when the images' channels were converted for the model (transform.py)
        raw = _as_tensor(source.dataset[0][0], name)
        size = preprocess.input_size
        self.channel_conversion = (channel_conversion(raw.shape[0], size[0])
                                   if size is not None and len(size) == 3 and raw.dim() == 3 else None)
        # a source that decodes to the model's channels itself (imagefolder through PIL) says so
        self.channel_conversion = self.channel_conversion or getattr(source.dataset, "channel_conversion", None)
        # a resize to the spec's input size changes what the model sees (a 32-px CIFAR image
        # upscaled to a torchvision model's 224): the report records it, and stderr says it once
        self.resize = image_resize(raw, size, preprocess.interpolation)
        # whether items() can prepare a range at once: decided here, before any batch is read
        self._batched = hasattr(source.dataset, "items") and elementwise(preprocess, tuple(raw.shape))
        if self.resize is not None:
            _say_resize(name, self.resize)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        x, y = self.source.dataset[index]
        x = _as_tensor(x, self.name)
        return apply_preprocess(x, self.preprocess, source=self.name), int(y)

    def items(self, start: int, stop: int) -> tuple[Tensor, Tensor] | None:
        """Samples start … stop − 1 prepared at once — what __getitem__ gives each, stacked, with
        int64 labels — where the source holds them in one tensor (ArrayDataset.items) and the
        preprocessing is elementwise; None otherwise, and the caller reads them one by one."""
        if not self._batched:
            return None
        x, y = self.source.dataset.items(start, stop)
        x = apply_preprocess_batch(_as_tensor(x, self.name), self.preprocess, source=self.name)
        return None if x is None else (x, y)

    def __repr__(self) -> str:
        return f"PreparedDataset({self.name!r}, split={self.split!r}, n={self._len}, shape={self.sample_shape})"


def _say_resize(name: str, resize: str) -> None:
    # a warning, shown once per message (the test split of `gap` resizes alike): where others go
    warnings.warn(f"data '{name}': images resized {resize}, to the model's input size (input_size, from the spec "
                  f"or --input-size; another --input-size C,H,W measures them at that size, if the model takes it)", stacklevel=3)


def _as_tensor(x: Any, name: str) -> Tensor:
    # third-party factories may hand back numpy arrays; integer pixels would mean the
    # factory forgot to scale to [0, 1], which preprocessing cannot guess
    t = x if isinstance(x, Tensor) else torch.as_tensor(x)
    if not t.is_floating_point():
        raise DataError(f"data '{name}' gives {t.dtype} samples; a source must give float values in [0, 1]")
    return t
