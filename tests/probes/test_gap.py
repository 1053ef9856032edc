"""The gap probe against a hand evaluation, and its behaviour when a split is missing."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

import flatcheck
from flatcheck.cli import app
from flatcheck.data.batches import SampleSet
from flatcheck.data.preprocess import Preprocess
from flatcheck.data.registry import create_dataset
from flatcheck.models.checkpoint import apply_state_dict, load_checkpoint
from flatcheck.zoo.demo_cnn import DigitsCNN
from tests.support.cifar import write_cifar10
from tests.support.cli import ROOT

CKPT = ROOT / "demo" / "digits_cnn.safetensors"
SPEC = ROOT / "model_specs" / "demo_digits.yaml"


def _by_hand(split: str, n: int) -> tuple[float, float]:
    model = DigitsCNN()
    apply_state_dict(model, load_checkpoint(CKPT).state_dict)
    model.eval()
    data = create_dataset("digits", split=split, preprocess=Preprocess(input_size=(1, 8, 8)))
    (batch,) = list(SampleSet(data, samples=n, batch_size=n))
    with torch.no_grad():
        logits = model(batch.x).double()
    return F.cross_entropy(logits, batch.y).item(), (logits.argmax(1) == batch.y).double().mean().item()


def test_gap_equals_hand_evaluation():
    cfg = flatcheck.RunConfig(checkpoint=CKPT, spec=SPEC, samples=300, batch_size=64,
                              probes=flatcheck.probe_requests("gap"))
    r = flatcheck.run(cfg).results["gap"]
    tr_loss, tr_acc = _by_hand("train", 300)
    te_loss, te_acc = _by_hand("test", 300)
    # float32 forward, float64 means: agreement to float32 resolution of the logits
    tol = 64 * torch.finfo(torch.float32).eps
    assert r.details["train"]["loss"] == pytest.approx(tr_loss, rel=tol)
    assert r.details["test"]["loss"] == pytest.approx(te_loss, rel=tol)
    assert r.details["train"]["accuracy"] == tr_acc and r.details["test"]["accuracy"] == te_acc
    assert r.value == pytest.approx(te_loss - tr_loss, rel=tol, abs=tol * te_loss)
    assert r.details["accuracy_gap"] == pytest.approx(tr_acc - te_acc)
    assert r.stderr is None and r.matvecs == 0


@pytest.mark.realsize
def test_missing_split_skips_in_probe_and_fails_in_gap(tmp_path, resnet_checkpoint):  # noqa: F811
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    common = ["--spec", str(ROOT / "model_specs" / "resnet18_cifar.yaml"), "--data", "cifar10", "--data-root",
              str(tmp_path), "--samples", "4", "--quiet"]
    skipped = CliRunner().invoke(app, ["probe", str(resnet_checkpoint), *common, "--probes", "gini,gap", "--json", "-"])
    assert skipped.exit_code == 0, skipped.output
    gap = json.loads(skipped.stdout)["results"]["gap"]
    assert gap["value"] is None and "test_batch" in gap["details"]["skipped"]
    failed = CliRunner().invoke(app, ["gap", str(resnet_checkpoint), *common])
    assert failed.exit_code == 2 and "test" in failed.stderr
