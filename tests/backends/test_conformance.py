"""Every backend against dense float64 ground truth; the backends compared with each other
where their code differs; and every probe on a backend with only the capabilities it declares.

The autograd backend is the reference; the others must give the same products (to float64
round-off) and hence, with the same seed, the same probe results.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.support.dense import dense, make_case
from flatcheck.backends import ExactGGN, GGNVp, Hvp, HvpSums, Outputs, Vhv, create_backend, list_backends, registry
from flatcheck.backends.base import capability_name
from flatcheck.cli import app
from flatcheck.probes.registry import create_probe, list_probes, parse_options, requirements

ROOT = Path(__file__).resolve().parents[2]
EPS = torch.finfo(torch.float64).eps
BACKENDS = [b for b in list_backends() if b != "distributed"]  # distributed needs a process group
LOSSES = ["cross_entropy", "mse", "sigmoid_mse", "label_smoothing"]
CASES = [(k, loss, "eval") for k in ("mlp", "cnn") for loss in LOSSES] + [
    ("cnn", "cross_entropy", "train"), ("cnn", "mse", "train")]


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind,loss,bn_mode", CASES)
def test_products_match_dense(backend, kind, loss, bn_mode):
    case = make_case(kind, loss=loss, bn_mode=bn_mode)
    H, G = dense(case)
    b = case.backend(backend)
    V = torch.randn(5, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert _rel(b.hvp(V), V @ H) < 1e3 * EPS
    assert _rel(b.ggn_vp(V), V @ G) < 1e3 * EPS
    assert abs(b.ggn_trace().per_param.sum().item() - G.trace().item()) <= 1e3 * EPS * G.trace().item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_products_match_dense_through_layer_norm_attention_and_pooling(backend):
    """The Mixer model of test_quadform (LayerNorm with an affine weight, attention, pooling,
    an argmax-chosen token) against reverse-over-reverse dense H: torch.func.hessian of this
    loss is itself wrong (docs/internals.md, "Things about torch worth knowing"), the jvp∘grad products
    of the func backend are not."""
    from tests.support.dense import mixer_case

    case = mixer_case()
    H, G = dense(case, reverse=True)
    b = case.backend(backend)
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert _rel(b.hvp(V), V @ H) < 1e3 * EPS
    assert _rel(b.ggn_vp(V), V @ G) < 1e3 * EPS


def test_func_chunks_blocks():
    case = make_case("mlp")
    H, _ = dense(case)
    b = case.backend("func")
    b.chunk = 2  # 5 vectors → chunks of 2, 2, 1
    V = torch.randn(5, H.shape[0], dtype=torch.float64)
    assert _rel(b.hvp(V), V @ H) < 1e3 * EPS


# Fast settings for every probe; probes added later run with their defaults.
FAST = {
    "trace": ["-o", "trace.probes_max=8"],
    "lmax": ["-o", "lmax.k=2", "-o", "lmax.max_iter=20"],
    "spectrum": ["-o", "spectrum.lanczos_steps=8", "-o", "spectrum.starts=2"],
    "rank": ["-o", "rank.lanczos_steps=8", "-o", "rank.starts=2"],
    "adaptive-sharpness": ["-o", "adaptive-sharpness.noise_draws=2", "-o", "adaptive-sharpness.probes_max=4"],
}
# runs that take the other matrix's products
GGN = {"trace": ["-o", "trace.probes_max=8", "-o", "trace.matrix=ggn"],
       "lmax": ["-o", "lmax.k=2", "-o", "lmax.max_iter=20", "-o", "lmax.matrix=ggn"]}


def _options(probe: str, args: list[str]):
    raw = dict(a.split(".", 1)[1].split("=", 1) for a in args[1::2])
    return parse_options(probe, raw)


def _needs(probe: str, args: list[str]) -> frozenset[type]:
    return requirements(create_probe(probe), _options(probe, args))


def _run(probe: str, args: list[str], backend: str) -> float | None:
    if backend == "autograd":  # the reference value two tests of each probe compare with
        return _reference(probe, tuple(args))
    return _invoke(probe, args, backend)


@functools.cache
def _reference(probe: str, args: tuple[str, ...]) -> float | None:
    return _invoke(probe, list(args), "autograd")


def _invoke(probe: str, args: list[str], backend: str) -> float | None:
    result = CliRunner().invoke(app, [
        "probe", str(ROOT / "demo" / "digits_cnn.safetensors"), "--spec", str(ROOT / "model_specs" / "demo_digits.yaml"),
        "--samples", "24", "--batch-size", "16", "--dtype", "float64", "--probes", probe, *args,
        "--backend", backend, "--json", "-", "--quiet",
    ])
    assert result.exit_code == 0, (backend, result.stderr)
    return _values(json.loads(result.stdout))[probe]


def _values(d: dict) -> dict[str, float]:
    return {k: r["value"] for k, r in d["results"].items()}


# Where the backends' code differs: the Hessian and GGN products (double backward against
# jvp∘grad, streamed sums against (k, P) products). Probes that need only `outputs` or the
# exact GGN trace run the same code (Problem.outputs, flatcheck.engines.ggn_trace) on every
# backend, so comparing them across backends could not fail; the contract test below
# covers them instead.
PRODUCT_RUNS = [(p, args) for p in list_probes() for args in (FAST.get(p, []), *([GGN[p]] if p in GGN else []))
                if _needs(p, args) & {Hvp, GGNVp}]


@pytest.mark.parametrize("probe,args", PRODUCT_RUNS, ids=[f"{p}{'-ggn' if a in GGN.values() else ''}"
                                                          for p, a in PRODUCT_RUNS])
def test_probes_on_products_agree_across_backends(probe, args):
    runs = {backend: _run(probe, args, backend) for backend in BACKENDS}
    ref = runs["autograd"]
    for backend, value in runs.items():
        # same seed, same draws: only float64 round-off separates the backends
        assert math.isclose(value, ref, rel_tol=1e-8, abs_tol=1e-12), (backend, value, ref)


def _restricted(needs: frozenset[type]):
    """A backend factory whose backends have exactly the capabilities in `needs` (taken from
    the autograd reference): a probe that uses anything it did not declare fails on it."""
    methods = {capability_name(cap) for cap in needs}

    def factory(problem):
        inner = create_backend("autograd", problem)
        attrs = {m: (lambda m: lambda self, *a, **k: getattr(inner, m)(*a, **k))(m) for m in methods}
        if Vhv in needs:
            attrs["vhv_error"] = property(lambda self: inner.vhv_error)
        backend = type("Restricted", (), attrs)()
        backend.name, backend.problem = "restricted", problem
        return backend

    return factory


@pytest.mark.parametrize("probe", list_probes())
def test_every_probe_runs_on_a_backend_with_only_what_it_requires(probe, monkeypatch):
    """The contract: `requirements(probe, options)` names every capability the probe uses.
    On a backend with those alone it runs and gives the reference backend's value."""
    args = FAST.get(probe, [])
    needs = _needs(probe, args)
    assert needs and all(isinstance(make_case("mlp").backend("autograd"), cap) for cap in needs)
    monkeypatch.setitem(registry._LEAVES, "restricted", registry._Leaf(_restricted(needs), {}))
    value, ref = _run(probe, args, "restricted"), _run(probe, args, "autograd")
    if ref is None:
        assert value is None
    else:
        assert math.isclose(value, ref, rel_tol=1e-8, abs_tol=1e-12), (value, ref)


def test_a_probe_needing_what_the_backend_lacks_is_refused(monkeypatch):
    """trace --estimator exact needs the GGN trace; a backend without it is refused before
    anything runs, naming the capability (and a Hessian Hutchinson trace does not need it)."""
    assert _needs("trace", []) == {Hvp} and _needs("trace", ["-o", "trace.estimator=exact"]) == {ExactGGN}
    monkeypatch.setitem(registry._LEAVES, "restricted", registry._Leaf(_restricted(frozenset({Hvp, Outputs})), {}))
    result = CliRunner().invoke(app, [
        "probe", str(ROOT / "demo" / "digits_cnn.safetensors"), "--spec", str(ROOT / "model_specs" / "demo_digits.yaml"),
        "--samples", "8", "--probes", "trace", "-o", "trace.estimator=exact", "--backend", "restricted", "--quiet"])
    assert result.exit_code == 2
    assert "probe trace needs ggn_trace, which backend restricted lacks" in result.stderr


STREAMING = [b for b in BACKENDS if isinstance(make_case("mlp").backend(b), HvpSums)]


@pytest.mark.parametrize("backend", STREAMING)
@pytest.mark.parametrize("kind,bn_mode", [("mlp", "eval"), ("cnn", "eval"), ("cnn", "train")])
def test_streamed_hvp_sums_match_dense(backend, kind, bn_mode):
    """Per-parameter sums of v ⊙ Hv without the (k, P) product, from float rows and from int8 signs."""
    case = make_case(kind, bn_mode=bn_mode)
    H, _ = dense(case)
    b = case.backend(backend)
    layout = case.problem.layout
    S = torch.randint(0, 2, (4, H.shape[0]), generator=torch.Generator().manual_seed(7), dtype=torch.int8) * 2 - 1
    V = S.to(torch.float64)
    want = layout.param_sum_matrix(V * (V @ H))
    scale = (V.abs() * (V @ H).abs()).sum().item()  # round-off is relative to the terms summed, not the sum
    for block in (V, S):
        got = b.hvp_sums(block)
        assert got.shape == (4, len(layout.names)) and got.dtype == torch.float64
        assert (got - want).abs().max().item() <= 1e3 * EPS * scale


def test_func_halves_its_chunk_on_cuda_out_of_memory(monkeypatch):
    """A block too large for the device: the chunk halves until it fits, says so, and the
    products are unchanged (tests/backends/test_cuda.py meets a real CUDA OOM where a GPU exists)."""
    case = make_case("mlp")
    H, _ = dense(case)
    b = case.backend("func")
    real = b._hv_block

    def small_device(params, frozen, x, y, W):
        if next(iter(W.values())).shape[0] > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(params, frozen, x, y, W)

    monkeypatch.setattr(b, "_hv_block", small_device)
    V = torch.randn(7, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with pytest.warns(UserWarning, match="CUDA out of memory; retrying with 8 vectors per pass") as record:
        got = b.hvp(V)
    assert [str(w.message) for w in record][-1].endswith("retrying with 2 vectors per pass")
    assert b.chunk == 2
    assert _rel(got, V @ H) < 1e3 * EPS
