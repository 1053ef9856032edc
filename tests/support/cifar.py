"""CIFAR-10 in its real on-disk layout, written small."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def write_cifar10(root: Path, per_file: int = 3) -> np.ndarray:
    """cifar-10-batches-py/ as the official tarball unpacks it: pickled dicts of uint8 rows."""
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    first = None
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_file, 3072), dtype=np.uint8)
        first = data if first is None else first
        entry = {"batch_label": name, "labels": rng.integers(0, 10, per_file).tolist(), "data": data,
                 "filenames": [f"{name}_{i}.png" for i in range(per_file)]}
        (base / name).write_bytes(pickle.dumps(entry, protocol=2))
    meta = {"label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
            "num_cases_per_batch": per_file, "num_vis": 3072}
    (base / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return first
