"""The reference backend against dense float64 ground truth."""

from __future__ import annotations

import pytest
import torch

from tests.support.dense import dense, make_case

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
    from flatcheck.backends import ParamLayout, create_backend
    from flatcheck.problem import Problem

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
    from flatcheck.backends import ParamLayout, create_backend
    from flatcheck.problem import Problem

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
    from tests.support.dense import dense

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
    import flatcheck.engines.kept as kept
    from tests.support.dense import dense

    case = make_case("mlp", n=23, batch_size=10)
    H, _ = dense(case)
    probe = case.backend("autograd")
    _, held = probe._grad_with_graph(next(iter(case.problem.samples)))
    # the estimate (twice the leaf modules' outputs, plus the gradients) is at least the gradients
    assert held >= H.shape[0] * 8
    monkeypatch.setattr(kept, "GRAPH_CACHE_BYTES", held + held // 2)  # room for one batch's graph, not two
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


# ---------------------------------------------------------------- the contract and the registry


def test_capabilities_are_the_methods_a_backend_has():
    from flatcheck.backends import Backend, ExactGGN, GGNVp, Hvp, HvpSums, Outputs, Vhv

    case = make_case("mlp")
    autograd, func = case.backend("autograd"), case.backend("func")
    for cap in (Backend, Hvp, GGNVp, Outputs, HvpSums, Vhv, ExactGGN):
        assert isinstance(autograd, cap), cap.__name__
    assert isinstance(func, Backend) and isinstance(func, ExactGGN)
    # func's Hutchinson takes vmapped (k, P) products: it has neither streamed route
    assert not isinstance(func, HvpSums) and not isinstance(func, Vhv)
    assert not isinstance(object(), Hvp)


def test_backends_are_found_by_module_name():
    from flatcheck.backends import list_backends

    assert list_backends() == ["autograd", "distributed", "func"]


def test_unknown_backend_and_option_are_refused_naming_the_choices():
    from flatcheck.backends import create_backend
    from flatcheck.errors import ConfigError

    case = make_case("mlp")
    for name in ("nope", "autograd:func", "distributed:distributed", "distributed:nope"):
        with pytest.raises(ConfigError, match=f"--backend '{name}' is unknown; available: autograd, distributed, "
                                              "func, distributed:autograd, distributed:func"):
            create_backend(name, case.problem)
    with pytest.raises(ConfigError, match=r"--compile needs --backend func or distributed:func \(it compiles "):
        create_backend("autograd", case.problem, compile=True)


def _wrapper(monkeypatch):
    """A wrapper registered for the test, as distributed is: `wrap:INNER` builds INNER over the
    same problem and records what it was given."""
    from flatcheck.backends import registry

    built = []

    def wrap(problem, make):
        inner = make(problem)
        built.append(inner)
        return inner

    monkeypatch.setitem(registry._WRAPPERS, "wrap", registry._Wrapper(wrap, "autograd"))
    return built


@pytest.mark.workflow
def test_rebuild_keeps_the_wrapper_the_inner_backend_and_its_options(monkeypatch):
    """gap, head-trace and adaptive-sharpness ask for a backend over another sample set,
    layout or loss; what --backend and --compile chose stays chosen."""
    from dataclasses import replace

    from flatcheck.backends import ParamLayout, create_backend, rebuild
    from flatcheck.backends.func import FuncBackend
    from flatcheck.models.spec import LossSpec

    built = _wrapper(monkeypatch)
    case = make_case("mlp")
    H, _ = dense(case)
    backend = create_backend("wrap:func", case.problem, compile=True)
    assert backend.spec.name == "wrap:func" and dict(backend.spec.options) == {"compile": True}
    assert isinstance(built[-1], FuncBackend) and built[-1]._hv is not None  # compiled

    layout = ParamLayout.from_model(case.model, ("5.*",))
    head = rebuild(backend, layout=layout)
    assert len(built) == 2 and isinstance(head, FuncBackend) and head._hv is not None
    assert head.spec == backend.spec and head.problem.layout == layout

    # products of the rebuilt backend are those of its problem (no compiling here: slow)
    sub = rebuild(create_backend("wrap:func", case.problem), layout=layout)
    start = case.problem.layout.dim - layout.dim
    V = torch.randn(2, layout.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert _rel(sub.hvp(V), V @ H[start:, start:]) < 1e3 * EPS

    other = rebuild(create_backend("wrap", case.problem), loss=LossSpec("mse"))
    assert other.spec.name == "wrap" and other.problem.loss.name == "mse"
    assert other.problem == replace(case.problem, loss=LossSpec("mse"))
    assert type(built[-1]).__name__ == "AutogradBackend"


def test_a_sharded_backend_has_the_capabilities_of_the_one_it_shards(monkeypatch):
    from flatcheck.backends import ExactGGN, HvpSums, Vhv, create_backend
    import flatcheck.backends.distributed as distributed

    monkeypatch.setattr(distributed, "ensure_process_group", lambda device: (0, 1))
    monkeypatch.setattr(distributed.DistributedBackend, "_sum", lambda self, t: t)  # one rank: the sum is itself
    case = make_case("mlp")
    H, G = dense(case)
    ref, fn = create_backend("distributed", case.problem), create_backend("distributed:func", case.problem)
    assert isinstance(ref, HvpSums) and isinstance(ref, Vhv) and isinstance(ref, ExactGGN)
    assert not isinstance(fn, HvpSums) and not isinstance(fn, Vhv) and isinstance(fn, ExactGGN)
    assert ref.spec.name == "distributed" and fn.spec.name == "distributed:func"
    V = torch.randn(2, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for b in (ref, fn):
        assert _rel(b.hvp(V), V @ H) < 1e3 * EPS and _rel(b.ggn_vp(V), V @ G) < 1e3 * EPS
        assert abs(b.ggn_trace().per_param.sum().item() - G.trace().item()) <= 1e3 * EPS * G.trace().item()


@pytest.mark.parametrize("batch_size", [23, 7])
def test_products_fill_every_entry_of_an_unzeroed_result(monkeypatch, batch_size):
    """hvp writes its result into torch.empty_like, which on a fresh CPU allocation is often
    zero anyway: with NaN in it instead, over one batch and over several, every entry must
    still be the product's."""
    real = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: real(*a, **k).fill_(float("nan")))
    case = make_case("mlp", n=23, batch_size=batch_size)
    H, _ = dense(case)
    V = torch.randn(2, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert _rel(case.backend().hvp(V), V @ H) < 1e3 * EPS
