"""Anonymous 2025's centered decomposition ("Sharpness can be manipulated and misleading for
generalization"): per-layer terms equal the exact GGN trace of dense layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.support.dense import make_case
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options

EXACT = 1e-8


def relu_mlp_case(loss="cross_entropy"):
    case = make_case("mlp", loss=loss)
    case.model[2] = nn.ReLU()  # the tiny MLP's Tanh → a pure ReLU chain
    return case


def run(backend):
    return create_probe("decomposition").run(ProbeContext(backend, seed=0), parse_options("decomposition", {}))


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_terms_sum_to_exact_ggn_trace_of_dense_layers(loss):
    case = relu_mlp_case(loss)
    backend = case.backend()
    r = run(backend)
    ggn = dict(zip(case.problem.layout.names, backend.ggn_trace().per_param.tolist()))
    d = r.details
    assert d["exact"] and set(d["per_layer"]) == {"1", "3", "5"}
    for key, layer in d["per_layer"].items():
        assert layer["exact"]
        assert layer["term"] == pytest.approx(ggn[f"{key}.weight"], rel=EXACT)
        assert layer["term"] <= layer["bound"]
    weights = sum(ggn[f"{k}.weight"] for k in ("1", "3", "5"))
    assert r.value == pytest.approx(weights, rel=EXACT)
    assert d["relative_difference"] <= EXACT
    assert r.value <= d["bound"]


def test_parts_against_a_hand_computation():
    case = relu_mlp_case()
    model, X = case.model, case.X
    d = run(case.backend()).details["per_layer"]["5"]  # the head: ∂f/∂z = I, so M = I, λmax = 1
    with torch.no_grad():
        a = model[:5](X)
        p = model(X).softmax(-1)
    assert d["lambda_max"] == pytest.approx(1.0, rel=EXACT)
    assert d["s"] == pytest.approx(a.pow(2).sum(1).mean().item(), rel=EXACT)
    assert d["centered"] == pytest.approx((1 - p.pow(2).sum(1)).mean().item(), rel=EXACT)  # Gini (App. A.2)


def test_conv_layers_are_flagged_approximate():
    case = make_case("cnn")
    d = run(case.backend()).details
    assert not d["exact"]
    assert [v["exact"] for v in d["per_layer"].values()] == [False, False, True]
    assert d["dense_total"] == pytest.approx(d["dense_ggn_trace"], rel=EXACT)


# -- the matrix-free route against the exact one ------------------------------

@pytest.mark.parametrize("kind,loss", [("mlp", "cross_entropy"), ("cnn", "cross_entropy"), ("mlp", "sigmoid_mse")])
def test_estimate_route_within_its_reported_error(kind, loss):
    z = 4.0
    case = make_case(kind, loss=loss)

    def run(**opts):
        return create_probe("decomposition").run(ProbeContext(case.backend(), seed=0),
                                                 parse_options("decomposition", opts))

    exact, est = run(method="exact"), run(method="estimate", lanczos_iters=3)
    assert exact.details["route"] == "exact" and est.details["route"] == "estimate"
    assert abs(est.value - exact.value) <= z * est.stderr
    for name, layer in exact.details["per_layer"].items():
        e = est.details["per_layer"][name]
        assert abs(e["centered"] - layer["centered"]) <= z * e["centered_stderr"] + 1e-12, name
        assert abs(e["term"] - layer["term"]) <= z * e["term_stderr"] + 1e-12, name
        assert abs(e["lambda_max"] - layer["lambda_max"]) <= e["lambda_max_error_bound"] + 1e-12, name
        assert abs(e["bound"] - layer["bound"]) <= e["bound_error_bound"] + 1e-12, name
    # the Tr(G) it is compared with is class-sampled on this route, exact on the other
    assert est.details["ggn_class_samples"] == 8 and est.seed == 0 and exact.stderr is None
