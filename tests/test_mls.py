"""MLS family against dense jacrev Jacobians and their SVD; the MLS/NMLS bounds on a trained MLP."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import jacrev

from conftest import make_case
from flatcheck.backends import ParamLayout, Problem, create_backend
from flatcheck.backends.base import model_mode
from flatcheck.data.batches import SampleSet
from flatcheck.data.preprocess import Preprocess
from flatcheck.data.registry import create_dataset
from flatcheck.models.spec import LossSpec
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options

EXACT = 1e-8


def run(backend, **opts):
    return create_probe("mls").run(ProbeContext(backend, seed=0), parse_options("mls", opts))


def tail_jacobians(model, H, start):
    """∂f/∂h for the input h of model[start] (a Sequential), one jacrev per sample: (N, C, dim h)."""
    tail = model[start:]
    with model_mode(model, "eval"):
        return torch.stack([jacrev(lambda h: tail(h.unsqueeze(0)).squeeze(0))(h) for h in H]).flatten(2)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_against_dense_svd(kind):
    case = make_case(kind)
    model, X = case.model, case.X
    J = tail_jacobians(model, X, 0)
    sv = torch.linalg.svdvals(J)
    lam = sv**2
    c, d = J.shape[1:]
    keep = sv > torch.finfo(torch.float64).eps * max(c, d) * sv[:, :1]
    d_ = run(case.backend()).details
    assert d_["mls"] == pytest.approx(sv[:, 0].mean().item(), rel=EXACT)
    assert d_["normalized_mls"] == pytest.approx((X.flatten(1).norm(dim=1) * sv[:, 0]).mean().item(), rel=EXACT)
    assert d_["log_volume"] == pytest.approx((sv.log() * keep).sum(1).mean().item(), rel=EXACT)
    assert d_["mean_rank"] == keep.sum(1).double().mean().item()
    ld = (lam.sum(1) ** 2 / (lam**2).sum(1)).mean().item()
    assert d_["local_dimensionality"] == pytest.approx(ld, rel=EXACT)
    # NMLS: the input of every Linear/Conv, with the rest of the Sequential as the map to f
    taps = [i for i, m in enumerate(model) if isinstance(m, (nn.Linear, nn.Conv2d))]
    nmls = 0.0
    with torch.no_grad(), model_mode(model, "eval"):
        inputs = {i: model[:i](X) for i in taps}
    for i in taps:
        sens = torch.linalg.matrix_norm(tail_jacobians(model, inputs[i], i), ord=2).mean().item()
        assert d_["per_layer"][str(i)]["sensitivity"] == pytest.approx(sens, rel=EXACT)
        nmls += sens
    assert d_["nmls"] == pytest.approx(nmls, rel=EXACT)
    if kind == "cnn":  # conv layers: no bound rather than a false one
        assert d_["mls_bound"] is None and d_["nmls_bound"] is None
        assert d_["per_layer"]["0"]["bound"] is None and d_["per_layer"]["7"]["bound"] is not None


def test_dense_bound_formula():
    case = make_case("mlp")
    model, X = case.model, case.X
    d_ = run(case.backend()).details
    lin = model[1]
    H = X.flatten(1)
    dz = tail_jacobians(model, lin(H), 2)  # ∂f/∂z for z = W_1 x + b
    grad_sq = dz.pow(2).sum((1, 2)) * H.pow(2).sum(1)
    bound = torch.linalg.matrix_norm(lin.weight.detach(), ord=2) * H.pow(2).sum(1).reciprocal().mean().sqrt() \
        * grad_sq.mean().sqrt()
    assert d_["mls_bound"] == pytest.approx(bound.item(), rel=EXACT)


def _trained_digits_mlp():
    data = create_dataset("digits", split="train", preprocess=Preprocess(input_size=(1, 8, 8)))
    samples = SampleSet(data, samples=256, batch_size=256, dtype=torch.float64)
    (batch,) = list(samples)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                          nn.Linear(16, 10)).double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(model(batch.x), batch.y).backward()
        opt.step()
    return model, samples, batch


def test_bounds_hold_on_trained_mlp():
    model, samples, batch = _trained_digits_mlp()
    with torch.no_grad():
        assert (model(batch.x).argmax(1) == batch.y).double().mean() > 0.9  # it did train
    problem = Problem(model, LossSpec(), samples, ParamLayout.from_model(model))
    for output in ("logits", "softmax"):
        d_ = run(create_backend("autograd", problem), output=output).details
        assert d_["mls"] <= d_["mls_bound"]
        assert d_["nmls"] <= d_["nmls_bound"]
        for layer in d_["per_layer"].values():
            assert layer["dense"] and layer["sensitivity"] <= layer["bound"]
