"""--compile: torch.compile of the func backend's HVP, and its clean fallback to eager."""

from __future__ import annotations

import warnings

import pytest
import torch

from flatcheck.backends import create_backend
from flatcheck.backends.compile_choice import compile_pays
from flatcheck.errors import ConfigError
from tests.support.dense import dense, make_case

pytestmark = pytest.mark.process

EPS = torch.finfo(torch.float64).eps


def test_compile_needs_a_func_backend():
    case = make_case("mlp")
    for name in ("autograd", "distributed"):
        with pytest.raises(ConfigError, match="--compile needs --backend func"):
            create_backend(name, case.problem, compile=True)


def test_a_compiler_failure_falls_back_to_eager_and_says_so(monkeypatch):
    import flatcheck.backends.func as func

    def broken(fn, **_kw):
        def run(*args, **kwargs):
            raise RuntimeError("no C++ compiler here\nsecond line")

        return run

    monkeypatch.setattr(func.torch, "compile", broken)
    case = make_case("mlp")
    V = torch.randn(3, case.problem.layout.dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    eager = create_backend("func", case.problem).hvp(V)
    backend = create_backend("func", case.problem, compile=True)
    with pytest.warns(UserWarning, match="--compile: torch.compile could not run the HVP .*no C\\+\\+ compiler"):
        got = backend.hvp(V)
    assert torch.equal(got, eager)
    assert backend.compile_error == "RuntimeError: no C++ compiler here"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not on every product
        assert torch.equal(backend.hvp(V), eager)


def test_compiled_hvp_matches_the_dense_hessian_and_the_eager_one():
    case = make_case("mlp")
    H, _ = dense(case)
    V = torch.randn(2, H.shape[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    backend = create_backend("func", case.problem, compile=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a fallback would hide a broken compile path
        got = backend.hvp(V)
    assert backend.compile_error is None
    want = V @ H
    assert torch.allclose(got, want, rtol=0, atol=1e3 * EPS * H.abs().max().item() * H.shape[0] ** 0.5)
    # the same sums in the same order, fused: equal to the eager products to 1e-12
    eager = create_backend("func", case.problem).hvp(V)
    assert torch.allclose(got, eager, rtol=0, atol=1e-12 * eager.abs().max().item())


def choose(**kw):
    args = dict(device_type="cuda", planned_products=100, eager_seconds=0.5, compiled_seconds=0.1, compile_seconds=18.0)
    return compile_pays(**{**args, **kw})


def test_compiling_is_chosen_when_the_planned_products_repay_it():
    c = choose()  # 100 × 0.4 s = 40 s saved against 18 s of compiling
    assert c.compile and c.reason.startswith("compiled: 100 planned products")
    c = choose(planned_products=40)  # 16 s saved: not enough
    assert not c.compile and c.reason.startswith("eager: 40 planned products") and "16 s" in c.reason
    assert not choose(compiled_seconds=0.5).compile  # no gain per product: never


def test_compiling_must_beat_the_faster_eager_route():
    """ViT-B/16 on an H200 (benchmarks/results/compile_costs_h200.md): autograd 0.769 s, func eager
    1.09 s, compiled 0.831 s. Against eager func, 300 products would repay the 152 s compile; against
    autograd, the route that runs otherwise, no count does."""
    costs = dict(compiled_seconds=0.831, compile_seconds=152.0, planned_products=10**4)
    assert choose(eager_seconds=1.092, eager_route="func", **costs).compile
    c = choose(eager_seconds=0.769, eager_route="autograd", **costs)
    assert not c.compile and "eager (autograd)" in c.reason


@pytest.mark.parametrize("kw, words", [
    (dict(device_type="cpu"), "CUDA device only"),
    (dict(planned_products=0), "no products planned"),
    (dict(compiled_seconds=None), "not known"),
    (dict(compile_seconds=None), "not known"),
])
def test_eager_without_a_cuda_device_or_known_costs(kw, words):
    c = choose(**{"planned_products": 10**6, **kw})  # with a huge count, these still never compile
    assert not c.compile and words in c.reason

