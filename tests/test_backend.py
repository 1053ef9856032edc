"""The reference backend against dense float64 ground truth."""

from __future__ import annotations

import pytest
import torch

from conftest import dense, make_case

LOSSES = ["cross_entropy", "mse", "sigmoid_mse", "label_smoothing"]
EPS = torch.finfo(torch.float64).eps


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


CASES = [(k, loss, "eval") for k in ("mlp", "cnn") for loss in LOSSES] + [
    ("cnn", "cross_entropy", "train"), ("cnn", "sigmoid_mse", "train"),  # only the CNN has BatchNorm
]


@pytest.mark.parametrize("kind,loss,bn_mode", CASES)
def test_products_match_dense(kind, loss, bn_mode):
    case = make_case(kind, loss=loss, bn_mode=bn_mode)
    H, G = dense(case)
    backend = case.backend()
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    # float64 round-off of a P-term sum: a few hundred ulps of the result's scale
    tol = 1e3 * EPS
    assert _rel(backend.hvp(V), V @ H) < tol
    assert _rel(backend.ggn_vp(V), V @ G) < tol
    per_param = backend.ggn_trace().per_param
    assert per_param.shape == (len(case.problem.layout.names),)
    assert abs(per_param.sum().item() - G.trace().item()) <= tol * abs(G.trace().item())


def test_multi_batch_hvp_equals_whole_set():
    """Batches of 7 over 23 samples (last batch has 2) give the same HVP as one batch of 23."""
    whole = make_case("mlp", n=23, batch_size=23)
    parts = make_case("mlp", n=23, batch_size=7)
    assert parts.problem.samples.num_batches == 4
    assert [b.x.shape[0] for b in parts.problem.samples] == [7, 7, 7, 2]
    V = torch.randn(2, whole.problem.layout.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a, b = whole.backend().hvp(V), parts.backend().hvp(V)
    assert _rel(b, a) < 1e3 * EPS
    assert _rel(parts.backend().ggn_vp(V), whole.backend().ggn_vp(V)) < 1e3 * EPS
    assert torch.allclose(parts.backend().ggn_trace().per_param.sum(), whole.backend().ggn_trace().per_param.sum(), rtol=1e3 * EPS, atol=0)


def test_single_batch_graph_is_reused_and_still_exact():
    case = make_case("cnn", n=16, batch_size=16)
    H, _ = dense(case)
    backend = case.backend()
    V = torch.randn(2, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    first, second = backend.hvp(V), backend.hvp(V.flip(0))
    assert _rel(first, V @ H) < 1e3 * EPS
    assert _rel(second, V.flip(0) @ H) < 1e3 * EPS


def test_train_mode_leaves_running_stats_bit_identical():
    case = make_case("cnn", bn_mode="train")
    before = {k: v.clone() for k, v in case.model.state_dict().items()}
    backend = case.backend()
    V = torch.randn(2, case.problem.layout.dim, dtype=torch.float64)
    backend.hvp(V)
    backend.ggn_vp(V)
    backend.ggn_trace().per_param
    list(backend.outputs())
    after = case.model.state_dict()
    for k, v in before.items():
        assert torch.equal(v, after[k]), k  # bitwise, buffers and num_batches_tracked included
    assert all(m.track_running_stats for m in case.model.modules() if hasattr(m, "track_running_stats"))


def test_bn_mode_changes_the_numbers():
    """The two modes are different functions (Granziol 2020 reports 10^3× gaps); make sure both are honoured."""
    eval_tr = make_case("cnn", bn_mode="eval").backend().ggn_trace().per_param.sum()
    train_tr = make_case("cnn", bn_mode="train").backend().ggn_trace().per_param.sum()
    assert not torch.isclose(eval_tr, train_tr, rtol=1e-3)


def test_params_subset_is_the_matching_block():
    case = make_case("mlp")
    H, _ = dense(case)
    from flatcheck.backends import ParamLayout, Problem, create_backend

    layout = ParamLayout.from_model(case.model, ("5.*",))  # the last Linear
    assert layout.names == ("5.weight", "5.bias")
    sub = create_backend("autograd", Problem(case.model, case.problem.loss, case.problem.samples, layout))
    start = case.problem.layout.dim - layout.dim
    V = torch.randn(2, layout.dim, dtype=torch.float64)
    assert _rel(sub.hvp(V), V @ H[start:, start:]) < 1e3 * EPS


def test_dropout_is_off():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 6), torch.nn.Dropout(0.5), torch.nn.Linear(6, 4)).double()
    case = make_case("mlp")
    from flatcheck.backends import ParamLayout, Problem, create_backend

    wrapped = torch.nn.Sequential(torch.nn.Flatten(), model)
    problem = Problem(wrapped, case.problem.loss, case.problem.samples, ParamLayout.from_model(wrapped))
    backend = create_backend("autograd", problem)
    V = torch.randn(1, problem.layout.dim, dtype=torch.float64)
    assert torch.equal(backend.hvp(V), backend.hvp(V))


def _forwards(model) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_first_order_graphs_are_kept_across_products():
    """Three batches whose graphs fit the budget: none is kept by the first call (a single
    pass would hold them for nothing), all by the second, and the third runs no forward;
    every call gives the same numbers, which equal the dense Hessian's."""
    from conftest import dense

    case = make_case("cnn", n=23, batch_size=10)
    H, _ = dense(case)
    b = case.backend("autograd")
    calls = _forwards(case.model)
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    first = b.hvp(V)
    assert calls[0] == 3 and len(b._graph_cache.items) == 0
    assert torch.equal(b.hvp(V), first) and calls[0] == 6 and len(b._graph_cache.items) == 3
    assert torch.equal(b.hvp(V), first) and calls[0] == 6
    sums = b.problem.layout.param_sum_matrix(V * first)
    assert torch.allclose(b.hvp_sums(V), sums, rtol=0, atol=1e3 * torch.finfo(torch.float64).eps * sums.abs().max().item())
    assert calls[0] == 6
    assert ((first - V @ H).norm() / (V @ H).norm()).item() < 1e3 * torch.finfo(torch.float64).eps


def test_graphs_beyond_the_budget_are_rebuilt(monkeypatch):
    import flatcheck.backends.autograd as ag
    from conftest import dense

    case = make_case("mlp", n=23, batch_size=10)
    H, _ = dense(case)
    probe = case.backend("autograd")
    _, held = probe._grad_with_graph(next(iter(case.problem.samples)))
    # the estimate (twice the leaf modules' outputs, plus the gradients) is at least the gradients
    assert held >= H.shape[0] * 8
    monkeypatch.setattr(ag, "GRAPH_CACHE_BYTES", held + held // 2)  # room for one batch's graph, not two
    b = case.backend("autograd")
    calls = _forwards(case.model)
    V = torch.randn(2, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    first = b.hvp(V)
    assert len(b._graph_cache.items) == 0 and calls[0] == 3
    b.hvp(V)
    assert len(b._graph_cache.items) == 1 and calls[0] == 6
    second = b.hvp(V)
    assert calls[0] == 8  # batches 1 and 2 again, batch 0 from its kept graph
    assert torch.allclose(second, first, rtol=0, atol=1e3 * torch.finfo(torch.float64).eps * first.abs().max().item())
    assert ((second - V @ H).norm() / (V @ H).norm()).item() < 1e3 * torch.finfo(torch.float64).eps
