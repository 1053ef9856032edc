"""Data sources, preprocessing and the batches every probe iterates over.

The names below are loaded on first use, so that a torch-free module of the package
(data.roots, which the entry point reads before importing torch) imports no torch."""

from importlib import import_module
from typing import Any

_WHERE = {
    "Batch": "batches", "SampleSet": "batches", "Preprocess": "preprocess",
    "DataSource": "registry", "PreparedDataset": "registry", "create_dataset": "registry",
    "list_datasets": "registry", "register_dataset": "registry", "apply_preprocess": "transform",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'flatcheck.data' has no attribute {name!r}")
    return getattr(import_module(f"flatcheck.data.{_WHERE[name]}"), name)
