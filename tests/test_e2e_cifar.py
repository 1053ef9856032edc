"""End to end through the CLI on the shipped CIFAR ResNet-18 spec and CIFAR-10 in its real on-disk layout."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from flatcheck.cli import app
from flatcheck.models.sources import build_model
from flatcheck.models.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="module")
def resnet_checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = build_model(load_spec(ROOT / "model_specs" / "resnet18_cifar.yaml"))
    path = tmp_path_factory.mktemp("ckpt") / "resnet18.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def test_trace_on_cifar10_resnet18(tmp_path, resnet_checkpoint):
    write_cifar10(tmp_path)
    result = CliRunner().invoke(app, [
        "trace", str(resnet_checkpoint), "--spec", str(ROOT / "model_specs" / "resnet18_cifar.yaml"),
        "--data", "cifar10", "--data-root", str(tmp_path), "--samples", "6", "--batch-size", "4",
        "--params", "fc.*", "--probes-max", "4", "--json", "-", "--quiet",
    ])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["data"]["name"] == "cifar10" and report["data"]["samples"] == 6
    assert report["data"]["batches"] == 2  # 4 + an uneven last batch of 2
    trace = report["results"]["trace"]
    assert trace["value"] > 0 and trace["stderr"] > 0 and trace["matvecs"] == 4
    assert report["model"]["probed_parameters"] == 512 * 10 + 10


def test_cifar10_missing_root_names_the_expected_folder(tmp_path, resnet_checkpoint):
    result = CliRunner().invoke(app, [
        "trace", str(resnet_checkpoint), "--spec", str(ROOT / "model_specs" / "resnet18_cifar.yaml"),
        "--data", "cifar10", "--data-root", str(tmp_path), "--samples", "2", "--quiet",
    ])
    assert result.exit_code == 2
    assert "cifar-10-batches-py" in result.stderr and "Traceback" not in result.stderr
