"""Function-preserving rescalings: the function stays, curvature moves exactly as D⁻¹HD⁻¹ says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from tests.support.dense import dense, make_case
from flatcheck.backends import create_backend
from flatcheck.problem import Problem
from flatcheck.cli import app
from flatcheck.errors import ConfigError
from flatcheck.workflows.rescale import apply_rescaling, find_rescaling

ROOT = Path(__file__).resolve().parents[2]
EPS64 = torch.finfo(torch.float64).eps


def _diag_factors(case, r):
    """Per-coordinate factor f with H' = diag(1/s) H diag(1/s), i.e. diag(H')_i = diag(H)_i / s_i²."""
    f = []
    for name, size in zip(case.problem.layout.names, case.problem.layout.sizes):
        if name in (f"{r.up}.weight", f"{r.up}.bias"):
            f.append(torch.full((size,), r.alpha**-2, dtype=torch.float64))
        elif r.kind == "relu-pair" and name == f"{r.down}.weight":
            f.append(torch.full((size,), r.alpha**2, dtype=torch.float64))
        else:
            f.append(torch.ones(size, dtype=torch.float64))
    return torch.cat(f)


def test_relu_pair_keeps_function_and_moves_hessian_trace_as_predicted():
    case = make_case("mlp")  # Flatten, Linear, Tanh, Linear, ReLU, Linear: the ReLU pair is 3 → 5
    r = find_rescaling(case.model, 10.0)
    assert (r.kind, r.up, r.down) == ("relu-pair", "3", "5")
    H, G = dense(case)
    with torch.no_grad():
        before = case.model(case.X)
    apply_rescaling(case.model, r)
    with torch.no_grad():
        after = case.model(case.X)
    assert (after - before).abs().max() <= 1e3 * EPS64 * before.abs().max()
    H2, G2 = dense(case)
    f = _diag_factors(case, r)
    for M, M2 in ((H, H2), (G, G2)):
        predicted = (M.diagonal() * f).sum()
        assert abs(M2.trace() - predicted) <= 1e3 * EPS64 * abs(predicted)
        assert not torch.isclose(M2.trace(), M.trace(), rtol=1e-3)  # it did move
    # the exact GGN trace of the backend sees the same thing
    backend = create_backend("autograd", Problem(case.model, case.problem.loss, case.problem.samples,
                                                 case.problem.layout))
    assert abs(backend.ggn_trace().per_param.sum() - G2.trace()) <= 1e3 * EPS64 * G2.trace()


@pytest.mark.parametrize("bn_mode", ["train", "eval"])
def test_before_batchnorm_is_exact(bn_mode):
    case = make_case("cnn", bn_mode=bn_mode)
    model = case.model
    r = find_rescaling(model, 7.0, layer="0")  # Conv → BatchNorm
    assert r.kind == "before-bn" and r.down == "1"
    from flatcheck.problem import model_mode

    # BN adds its eps to α²σ² instead of σ², so the rescaling is exact only for eps → 0;
    # torch refuses eps = 0 in training, 1e-30 is below float64 resolution of any σ² here
    model[1].eps = 1e-30
    with model_mode(model, bn_mode), torch.no_grad():
        before = model(case.X)
        apply_rescaling(model, r)
        after = model(case.X)
    assert (after - before).abs().max() <= 1e3 * EPS64 * before.abs().max()


def test_no_rescalable_layer_and_bad_alpha_are_refused():
    with pytest.raises(ConfigError, match="--alpha"):
        find_rescaling(nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)), -1.0)
    with pytest.raises(ConfigError, match="no function-preserving rescaling"):
        find_rescaling(nn.Sequential(nn.Linear(2, 2), nn.Tanh(), nn.Linear(2, 2)), 10.0)


def test_invariance_command_on_the_demo():
    result = CliRunner().invoke(app, [
        "invariance", str(ROOT / "demo" / "digits_cnn.safetensors"), "--spec", str(ROOT / "model_specs" / "demo_digits.yaml"),
        "--samples", "64", "--dtype", "float64", "--probes", "trace,gini", "-o", "trace.estimator=exact",
        "--alpha", "10", "--json", "-", "--quiet",
    ])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["predictions"]["function_preserved"] and d["predictions"]["argmax_agreement"] == 1.0
    rows = {c["probe"]: c for c in d["comparison"]}
    assert rows["trace"]["moved"] and not rows["gini"]["moved"]
    assert abs(rows["trace"]["rescaled"] - rows["trace"]["predicted"]) <= 1e3 * EPS64 * rows["trace"]["rescaled"]
    assert d["rescaling"] == {"kind": "relu-pair", "up": "features.3", "down": "features.6", "alpha": 10.0}


def test_a_rescaling_that_moves_the_outputs_is_never_taken():
    """The order of modules suggests rescalings the computation does not allow (a ViT's qkv and
    proj have a softmax between them): each is tried on the outputs and undone bit for bit, and
    a model with none that preserves them is exit 2 naming what was tried, not a table of n/a."""
    from tests.support.cli import invoke

    res = invoke("invariance", "--model", "timm:test_vit", "--random-init", "--num-classes", "10", "--input-size",
                 "3,32,32", "--data", "synthetic", "--samples", "8", "--probes", "gini")
    assert res.exit_code == 2, res.output
    assert "no rescaling the modules suggest preserves the model's outputs" in res.stderr
    assert "blocks.0.attn.qkv" in res.stderr and "outputs moved by" in res.stderr


def test_a_trial_rescaling_is_undone_bit_for_bit():
    from flatcheck.workflows.rescale import candidate_rescalings, trial

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3), nn.BatchNorm1d(3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    (first, *_) = candidate_rescalings(model, 3.7)
    with trial(model, first):
        assert not torch.equal(model[0].weight, before["0.weight"])
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
