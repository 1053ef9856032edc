"""Data sources, preprocessing and the batches every probe iterates over."""

from flatcheck.data.batches import Batch, SampleSet
from flatcheck.data.preprocess import Preprocess
from flatcheck.data.registry import (
    DataSource,
    PreparedDataset,
    create_dataset,
    list_datasets,
    register_dataset,
)
from flatcheck.data.transform import apply_preprocess

__all__ = [
    "Batch",
    "DataSource",
    "PreparedDataset",
    "Preprocess",
    "SampleSet",
    "apply_preprocess",
    "create_dataset",
    "list_datasets",
    "register_dataset",
]
