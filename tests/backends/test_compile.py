"""--compile: torch.compile of the func backend's HVP, and its clean fallback to eager."""

from __future__ import annotations

import warnings

import pytest
import torch

from flatcheck.backends import create_backend
from flatcheck.errors import ConfigError
from tests.support.dense import dense, make_case

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


def test_compiled_hvp_matches_the_dense_hessian():
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
