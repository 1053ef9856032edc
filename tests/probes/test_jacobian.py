"""Input-Jacobian norms against dense torch.func.jacrev Jacobians and their SVD (float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import jacrev
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import TensorDataset

from tests.support.dense import make_case
from flatcheck.settings import flag_of
from flatcheck.backends import ParamLayout, create_backend
from flatcheck.problem import Problem, model_mode
from flatcheck.data.batches import SampleSet
from flatcheck.errors import ConfigError
from flatcheck.models.spec import LossSpec
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options

EXACT = 1e-8  # float64 exact paths: rounding only
Z = 4


def dense_jacobians(model, X, output, bn_mode="eval"):
    """(N, C, *x) input Jacobians, one jacrev per sample."""
    def f(x):
        out = model(x.unsqueeze(0)).squeeze(0)
        return out.softmax(-1) if output == "softmax" else out

    with model_mode(model, bn_mode):
        return torch.stack([jacrev(f)(x) for x in X])


def run(backend, **opts):
    return create_probe("jacobian").run(ProbeContext(backend, seed=0), parse_options("jacobian", opts))


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("output", ["logits", "softmax"])
def test_exact_norms_match_dense_svd(kind, output):
    case = make_case(kind)
    J = dense_jacobians(case.model, case.X, output).flatten(2)
    fro, spec = J.norm(dim=(1, 2)), torch.linalg.matrix_norm(J, ord=2)
    r = run(case.backend(), output=output, method="exact")
    d = r.details
    assert d["method"] == "exact" and r.stderr is None and r.seed is None
    assert r.value == pytest.approx(fro.mean().item(), rel=EXACT)
    assert d["frobenius"]["max"] == pytest.approx(fro.max().item(), rel=EXACT)
    assert d["frobenius"]["argmax"] == int(fro.argmax())
    assert d["spectral"]["mean"] == pytest.approx(spec.mean().item(), rel=EXACT)
    assert d["spectral"]["max"] == pytest.approx(spec.max().item(), rel=EXACT)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_estimate_within_standard_errors(kind):
    case = make_case(kind)
    J = dense_jacobians(case.model, case.X, "softmax").flatten(2)
    fro_sq = J.pow(2).sum((1, 2))
    r = run(case.backend(), output="softmax", method="estimate", projections=32, lanczos_tol=1e-9)
    d = r.details
    assert d["method"] == "estimate" and r.seed == 0 and r.stderr > 0
    assert abs(d["frobenius_sq_mean"] - fro_sq.mean().item()) <= Z * d["frobenius_sq_mean_stderr"]
    # the mean of square roots carries an O(se²) bias on top of its delta-method stderr
    assert abs(r.value - fro_sq.sqrt().mean().item()) <= Z * r.stderr + (r.stderr**2 * case.X.shape[0])
    assert d["spectral"]["unconverged"] == 0


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_estimate_spectral_norm_is_within_its_error_bound(kind):
    """σ_max by Lanczos on J Jᵀ against the dense Jacobian's, within the r/σ bound it reports;
    the sample's start vectors are mls's for x, so the two probes report the same σ."""
    case = make_case(kind)
    J = dense_jacobians(case.model, case.X, "logits").flatten(2)
    spec = torch.linalg.matrix_norm(J, ord=2)
    # few steps, so the Ritz values are not yet exact and the bound is what holds them
    r = run(case.backend(), method="estimate", projections=4, lanczos_iters=3, lanczos_tol=1e-12)
    d = r.details["spectral"]
    assert d["lanczos_iterations"] == 3 and d["unconverged"] > 0
    assert abs(d["max"] - spec.max().item()) <= d["max_error_bound"] + EXACT * spec.max().item()
    full = run(case.backend(), method="estimate", projections=4, lanczos_tol=1e-10).details["spectral"]
    assert full["unconverged"] == 0 and full["lanczos_iterations"] <= J.shape[1]
    assert full["mean"] == pytest.approx(spec.mean().item(), rel=1e-8)
    assert full["max"] == pytest.approx(spec.max().item(), rel=1e-8)


def test_exclude_region_matches_dense_masked_sum():
    case = make_case("cnn")  # inputs 1×6×6
    J = dense_jacobians(case.model, case.X, "logits")  # (N, C, 1, 6, 6)
    mask = torch.ones(6, 6, dtype=torch.bool)
    mask[1:4, 2:4] = False  # y=1, x=2, h=3, w=2
    out_sq = (J.pow(2) * mask).sum((1, 2, 3, 4))
    expected = (out_sq / (36 - 6)).sqrt() * 6**0.5
    r = run(case.backend(), method="exact", exclude_region="1,2,3,2")
    ex = r.details["excluded"]
    assert (ex["n_out"], ex["n_region"]) == (30, 6)
    assert ex["mean"] == pytest.approx(expected.mean().item(), rel=EXACT)
    assert ex["max"] == pytest.approx(expected.max().item(), rel=EXACT)
    est = run(case.backend(), method="estimate", exclude_region="1,2,3,2", projections=32).details["excluded"]
    assert abs(est["mean"] - expected.mean().item()) <= Z * est["mean_stderr"] + est["mean_stderr"] ** 2 * 23


def test_bad_region_and_train_bn_refused():
    for bad in ["1,2,3", "a,b,c,d", "0,0,0,2", "-1,0,2,2"]:
        with pytest.raises(ConfigError) as caught:
            parse_options("jacobian", {"exclude_region": bad})
        assert str(caught.value).startswith("exclude_region expects y,x,h,w")  # a Python caller's words
        assert caught.value.worded(flag_of).startswith("--exclude-region expects y,x,h,w")  # the CLI's
    with pytest.raises(ConfigError, match="does not fit"):
        run(make_case("cnn").backend(), exclude_region="4,4,3,3")
    with pytest.raises(ConfigError, match="bn_mode train"):
        run(make_case("cnn", bn_mode="train").backend())


class _LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_thousand_classes_estimate_in_bounded_memory():
    torch.manual_seed(3)
    n, shape, classes = 6, (3, 16, 16), 1000
    d = 3 * 16 * 16
    model = nn.Sequential(nn.Flatten(), nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, classes)).double()
    X = torch.randn(n, *shape, dtype=torch.float64)
    Y = torch.randint(0, classes, (n,))
    samples = SampleSet(TensorDataset(X, Y), samples=n, batch_size=n, dtype=torch.float64)
    problem = Problem(model, LossSpec(), samples, ParamLayout.from_model(model))
    backend = create_backend("autograd", problem)
    with _LargestTensor() as seen:
        r = run(backend, output="softmax", projections=16)
    assert r.details["method"] == "estimate"
    # the largest intermediate is a batch of inputs, of outputs or a weight (and its gradient),
    # or, in the C-dimensional output space, the Lanczos basis or the block of projections:
    # far below one sample's C×D Jacobian
    basis = n * (r.details["spectral"]["lanczos_iterations"] + 1) * classes
    projections = 16 * n * classes
    assert seen.largest <= max(n * d, projections, basis, *(p.numel() for p in model.parameters()))
    assert seen.largest < classes * d
    exact = dense_jacobians(model, X, "softmax").flatten(2).pow(2).sum((1, 2)).mean().item()
    assert abs(r.details["frobenius_sq_mean"] - exact) <= Z * r.details["frobenius_sq_mean_stderr"]


def test_estimate_route_agrees_with_mls_draw_for_draw():
    """jacobian and mls estimate ‖J_x‖²_F and ‖J_x‖₂ from the same per-sample draws (the
    Rademacher projections and the Lanczos starts of sample n): two implementations of one
    quantity, equal to round-off, whatever their chunking."""
    torch.manual_seed(5)
    n, classes = 7, 200
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, classes)).double()
    X = torch.randn(n, 1, 3, 4, dtype=torch.float64)
    samples = SampleSet(TensorDataset(X, torch.randint(0, classes, (n,))), samples=n, batch_size=4,
                        dtype=torch.float64)
    problem = Problem(model, LossSpec(), samples, ParamLayout.from_model(model))
    opts = {"projections": 8, "lanczos_tol": 1e-6}
    jac = run(create_backend("autograd", problem), **opts).details
    mls = create_probe("mls").run(ProbeContext(create_backend("autograd", problem), seed=0),
                                  parse_options("mls", {**opts, "nmls": False})).details
    assert jac["route"] == mls["route"] == "estimate"
    assert jac["frobenius_sq_mean"] == pytest.approx(mls["frobenius_sq_mean"], rel=1e-12)
    assert jac["frobenius_sq_mean_stderr"] == pytest.approx(mls["frobenius_sq_mean_stderr"], rel=1e-12)
    assert jac["spectral"]["mean"] == pytest.approx(mls["mls"], rel=1e-12)
