"""Anonymous 2025's centered decomposition ("Sharpness can be manipulated and misleading for
generalization"): per-layer terms equal the exact GGN trace of dense layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.support.dense import MODELS, dense, make_case
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
    assert d["dense_total"] == pytest.approx(d["dense_ggn_trace_weights"], rel=EXACT)


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


# -- which Tr(G) it is compared with, shared weights, and the estimate route's bias ----------

class SharedMLP(nn.Module):
    """A tanh MLP whose middle Linear is applied twice: one weight, two calls."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.inp, self.mid, self.head = nn.Linear(36, 9), nn.Linear(9, 9), nn.Linear(9, 4)

    def forward(self, x):
        h = torch.tanh(self.mid(torch.tanh(self.inp(x.flatten(1)))))
        return self.head(torch.tanh(self.mid(h)))


def shared_case(monkeypatch, n=23):
    monkeypatch.setitem(MODELS, "shared", lambda: SharedMLP().double())
    return make_case("shared", n=n)


def dense_truth(case):
    """Tr(G) over every parameter and over the weights alone, from the dense float64 GGN."""
    _, G = dense(case)
    layout = case.problem.layout
    diag = G.diagonal().split(layout.sizes)
    weights = sum(d.sum() for name, d in zip(layout.names, diag) if name.endswith("weight"))
    return G.trace().item(), weights.item()


def run_route(case, method, seed=0):
    return create_probe("decomposition").run(ProbeContext(case.backend(), seed=seed),
                                             parse_options("decomposition", {"method": method, "lanczos_iters": 3}))


def test_ggn_trace_is_over_every_parameter_and_the_weights_part_is_named():
    case = make_case("mlp")  # tanh MLP with biases: Tr(G) 1.92, its weights' part 1.00
    every, weights = dense_truth(case)
    d = run_route(case, "exact").details
    assert d["ggn_trace"] == pytest.approx(every, rel=EXACT)
    assert d["ggn_trace_weights"] == pytest.approx(weights, rel=EXACT)
    assert d["total"] == pytest.approx(weights, rel=EXACT)
    assert "ggn_trace_stderr_all_parameters" not in d


def test_estimate_route_reports_the_stderr_of_each_sampled_trace():
    case = make_case("mlp")
    every, weights = dense_truth(case)
    for seed in range(5):
        d = run_route(case, "estimate", seed).details
        assert abs(d["ggn_trace"] - every) <= 4 * d["ggn_trace_stderr"]
        assert abs(d["ggn_trace_weights"] - weights) <= 4 * d["ggn_trace_weights_stderr"]
        assert d["ggn_trace_weights_stderr"] < d["ggn_trace_stderr"]


def test_a_weight_used_twice_carries_its_cross_terms(monkeypatch):
    case = shared_case(monkeypatch)
    _, weights = dense_truth(case)
    r = run_route(case, "exact")
    d = r.details
    cross = d["shared_cross_terms"]["mid.weight"]
    # the two calls' terms alone miss the cross term (−2.4e-4 here), which the value carries
    assert abs(d["terms_total"] - weights) > 100 * EXACT * weights
    assert r.value == pytest.approx(weights, rel=EXACT) and d["exact"]
    assert d["terms_total"] + cross == pytest.approx(r.value, rel=EXACT)
    assert d["relative_difference"] <= EXACT
    est = run_route(case, "estimate")
    assert abs(est.value - r.value) <= 4 * est.stderr
    assert abs(est.details["shared_cross_terms"]["mid.weight"] - cross) <= 4 * est.stderr


@pytest.mark.statistical
@pytest.mark.parametrize("kind", ["mlp", "shared"])
def test_estimate_route_is_unbiased_over_seeds(kind, monkeypatch):
    """50 seeds against the dense weights' GGN trace: the mean within 4 standard errors of the
    mean (from the runs' own stderr), and about 95 % of the ±2·stderr intervals covering."""
    case = shared_case(monkeypatch, n=10) if kind == "shared" else make_case(kind, n=10)
    _, truth = dense_truth(case)
    runs = [run_route(case, "estimate", seed) for seed in range(50)]
    values = torch.tensor([r.value for r in runs], dtype=torch.float64)
    stderrs = torch.tensor([r.stderr for r in runs], dtype=torch.float64)
    mean_se = stderrs.pow(2).mean().sqrt() / len(runs) ** 0.5
    assert abs(values.mean().item() - truth) <= 4 * mean_se
    covered = int(((values - truth).abs() <= 2 * stderrs).sum())
    assert covered >= 43  # 95.4 % of 50 is 47.7; 43 is more than 3 binomial sds below it
