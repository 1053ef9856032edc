"""The catalogue of data sources: what a registered factory returns and the decorator that
registers it. Factories (builtin.py, users' own) import this module; the lookup side
(registry.py) imports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch.utils.data import Dataset

from flatcheck.errors import DataError, InternalError

SPLITS = ("train", "test")


class MissingSplitError(DataError):
    """The source has no such split. A factory raises it rather than serve another split's
    samples under the name; `flatcheck probe` then skips `gap`, where any other DataError
    (an unreadable file, bad values) stops the run."""


@dataclass(frozen=True)
class DataSource:
    """What a registered factory returns.

    dataset[i] -> (x, y): x float tensor in [0, 1], (C,H,W) image or (D,) vector; y int.
    """

    dataset: Dataset
    num_classes: int | None
    description: str


@dataclass(frozen=True)
class _Entry:
    factory: Callable[..., DataSource]
    takes_path: bool


_REGISTRY: dict[str, _Entry] = {}


def _canonical(name: str) -> str:
    # users type fashion_mnist, Fashion-MNIST, fashionmnist ...; one spelling is stored
    return name.strip().lower().replace("_", "-")


def register_dataset(name: str, *, takes_path: bool = False) -> Callable:
    """Decorator registering `fn(*, root, split, path, num_classes, input_size, seed) -> DataSource`."""
    key = _canonical(name)

    def decorate(fn: Callable[..., DataSource]) -> Callable[..., DataSource]:
        if key in _REGISTRY and _REGISTRY[key].factory is not fn:
            raise InternalError(f"data set '{key}' is registered twice")
        _REGISTRY[key] = _Entry(fn, takes_path)
        return fn

    return decorate
