"""End to end through the CLI on the shipped CIFAR ResNet-18 spec and CIFAR-10 in its real on-disk layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flatcheck.cli import app
from tests.support.cifar import write_cifar10

pytestmark = pytest.mark.realsize

ROOT = Path(__file__).resolve().parents[2]


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
