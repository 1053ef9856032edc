"""CUDA: every backend on the GPU against dense float64 ground truth computed on the CPU.

The GPU tests are skipped where torch sees no GPU (the CI machine); run them on a lent GPU machine
with `python -m pytest tests/backends/test_cuda.py`. The OOM-halving logic itself is tested on the
CPU in test_conformance.py; here it meets a real CUDA out-of-memory error.

A test whose body does not depend on CUDA is parametrized by device and runs on the CPU too, in
the fast tier, against the same truth with the same tolerances: its helpers (a problem moved to
the device, a probe given a memory allowance) call the library's API, and CI, without a GPU,
would otherwise not see that API change under them until the next GPU run.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import TensorDataset
from typer.testing import CliRunner

from tests.support.dense import dense, make_case
from flatcheck.backends import ParamLayout, create_backend, list_backends
from flatcheck.problem import Problem
from flatcheck.cli import app
from flatcheck.data.batches import SampleSet
from flatcheck.linalg.thick_restart import restart_bytes
from flatcheck.probes import ProbeContext, create_probe, parse_options

# a GPU test is real-size (`make test-all`) and skipped where torch sees no GPU
ON_GPU = (pytest.mark.realsize, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))
DEVICES = ["cpu", pytest.param("cuda", marks=ON_GPU)]


def gpu_only(test):
    """A test of what only a GPU has (its allocator, TF32, the CLI's --device cuda)."""
    for mark in ON_GPU:
        test = mark(test)
    return test


ROOT = Path(__file__).resolve().parents[2]
EPS64 = torch.finfo(torch.float64).eps
EPS32 = torch.finfo(torch.float32).eps
BACKENDS = [b for b in list_backends() if b != "distributed"]
CASES = [("mlp", "cross_entropy", "eval"), ("cnn", "cross_entropy", "eval"), ("cnn", "mse", "eval"),
         ("cnn", "cross_entropy", "train")]
# every case on the GPU; on the CPU the mlp alone: there the CNNs' dense Hessians take 5–30 s a
# test, tests/backends already hold the CPU's products against them, and what a CPU run here
# guards is that this file's own paths still run (they drifted unseen while CI had no GPU)
CASE_RUNS = ([pytest.param(*CASES[0], "cpu", id="-".join(CASES[0]) + "-cpu")]
             + [pytest.param(*c, "cuda", marks=ON_GPU, id="-".join(c) + "-cuda") for c in CASES])


def _on_device(case, device: str, dtype=torch.float64) -> Problem:
    """The same problem as `case` (model, data, batching, loss), moved to `device` in `dtype`."""
    model = case.model.to(device=device, dtype=dtype)
    samples = SampleSet(TensorDataset(case.X, case.Y), samples=case.X.shape[0],
                        batch_size=case.problem.samples.batch_size, device=torch.device(device), dtype=dtype)
    return Problem(model=model, loss=case.problem.loss, samples=samples, layout=ParamLayout.from_model(model),
                   bn_mode=case.problem.bn_mode)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double().cpu() - b).norm() / b.norm()).item()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind,loss,bn_mode,device", CASE_RUNS)
def test_products_on_cuda_match_dense(backend, kind, loss, bn_mode, device):
    case = make_case(kind, loss=loss, bn_mode=bn_mode)
    H, G = dense(case)  # on the CPU, before the model moves
    b = create_backend(backend, _on_device(case, device))
    V = torch.randn(5, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    Vc = V.to(device)
    assert _rel(b.hvp(Vc), V @ H) < 1e3 * EPS64
    assert _rel(b.ggn_vp(Vc), V @ G) < 1e3 * EPS64
    got = b.ggn_trace().per_param.sum().item()
    assert abs(got - G.trace().item()) <= 1e3 * EPS64 * G.trace().item()


@pytest.mark.parametrize("kind,loss,bn_mode,device", CASE_RUNS)
def test_vhv_by_forward_tangents_on_cuda_matches_dense(kind, loss, bn_mode, device):
    """The total-only trace route (backends/quadform.py) traced and run on the GPU."""
    case = make_case(kind, loss=loss, bn_mode=bn_mode)
    H, _ = dense(case)
    b = create_backend("autograd", _on_device(case, device))
    S = (torch.randint(0, 2, (4, H.shape[0]), generator=torch.Generator().manual_seed(3)) * 2 - 1).to(torch.int8)
    got = b.vhv(S.to(device))
    assert b.vhv_error is None
    want = ((S.double() @ H) * S.double()).sum(1)
    assert (got.cpu() - want).abs().max().item() <= 1e3 * EPS64 * H.abs().sum().item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_on_cuda_is_float32_accurate(backend, device):
    """TF32 (10 mantissa bits, ~5e-4 relative) is off unless asked for: products stay near float32 round-off."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    case = make_case("cnn")
    H, _ = dense(case)
    b = create_backend(backend, _on_device(case, device, torch.float32))
    V = torch.randn(4, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert _rel(b.hvp(V.float().to(device)), V.float().double() @ H) < 1e3 * EPS32


# compiling takes seconds of CPU: the CPU's run is in `make test-all`, as test_compile.py's are
@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.process), *DEVICES[1:]])
def test_compiled_hvp_on_cuda_matches_dense(device):
    case = make_case("cnn")
    H, _ = dense(case)
    b = create_backend("func", _on_device(case, device), compile=True)
    V = torch.randn(3, H.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    # an eager fallback would hide a broken compile, so none may happen; torch's own warnings
    # while compiling are not turned into errors, which would break the compile they describe
    # (Inductor warns that it splits a softmax reduction, then compiles it)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = b.hvp(V.to(device))
    assert b.compile_error is None
    assert not [w for w in seen if "--compile" in str(w.message)]
    assert _rel(got, V @ H) < 1e3 * EPS64


@gpu_only
def test_a_real_cuda_out_of_memory_halves_the_chunk():
    """A block that does not fit in a capped allocator is cut until it does, and the result is unchanged."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.Tanh(), torch.nn.Linear(2048, 10)).cuda()
    X, Y = torch.randn(64, 2048), torch.randint(0, 10, (64,))
    samples = SampleSet(TensorDataset(X, Y), samples=64, batch_size=64, device=torch.device("cuda"))
    from flatcheck.models.spec import LossSpec

    problem = Problem(model, LossSpec("cross_entropy"), samples, ParamLayout.from_model(model))
    P = problem.layout.dim  # ~4.2M parameters: one vector is 17 MB, a 64-vector chunk several GB of tangents
    V = torch.randn(64, P, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    ref = create_backend("autograd", problem).hvp(V[:2])
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    allowed = torch.cuda.memory_allocated() + 1.5 * 2**30
    torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total))
    try:
        b = create_backend("func", problem)
        b.chunk = 64
        with pytest.warns(UserWarning, match="CUDA out of memory; retrying with \\d+ vectors per pass"):
            out = b.hvp(V)
        assert b.chunk < 64
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert _rel(out[:2], ref.double().cpu()) < 1e3 * EPS32


def _trace_json(tmp_path, device: str, *extra: str) -> dict:
    out = tmp_path / f"{device.replace(':', '_')}.json"
    args = ["trace", str(ROOT / "demo/digits_cnn.safetensors"), "--spec", str(ROOT / "model_specs/demo_digits.yaml"),
            "--data", "digits", "--samples", "200", "--batch-size", "64", "--dtype", "float64", "--device", device,
            "--max-probes", "8", "--json", str(out), "-q", *extra]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


@gpu_only
@pytest.mark.parametrize("backend", BACKENDS)
def test_cli_on_cuda_equals_cpu(tmp_path, backend):
    """Same seed, same probes, same data: the GPU's trace is the CPU's to float64 round-off."""
    cpu = _trace_json(tmp_path, "cpu", "--backend", backend)
    gpu = _trace_json(tmp_path, "cuda", "--backend", backend)
    a, b = cpu["results"]["trace"]["value"], gpu["results"]["trace"]["value"]
    assert gpu["device"].startswith("cuda")
    assert abs(a - b) <= 1e6 * EPS64 * abs(a)
    assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.allow_tf32 is False


def _probe_on(case, device: str, probe: str, allowance: int, **opts):
    """`probe` run on `case` moved to `device`, its working set allowed `allowance` bytes: what
    api.run leaves a probe of the process's --max-memory (ProbeContext.memory_allowance), given
    here directly so the plan does not depend on what the process happens to hold."""
    ctx = ProbeContext(create_backend("func", _on_device(case, device)), seed=0, memory_allowance=allowance)
    return create_probe(probe).run(ctx, parse_options(probe, opts))


@pytest.mark.parametrize("device", DEVICES)
def test_restarted_lmax_on_cuda_matches_dense(device):
    """The thick-restarted basis (an allowance too small for the full one) on the GPU: the top
    two eigenvalues within the Kato–Temple bound of their reported residuals."""
    case = make_case("mlp")
    H, _ = dense(case)
    per, fixed = restart_bytes(0, H.shape[0], torch.float64)
    # lmax plans a restarted basis in half its allowance (probes/lmax.py): 12 rows fit
    res = _probe_on(case, device, "lmax", 2 * (fixed + 12 * per) + 1, k=2, tol=1e-9)
    d = res.details
    assert d["basis"] == "thick-restart" and d["basis_rows"] == 12 and all(d["converged"])
    ev = torch.linalg.eigvalsh(H).flip(0)
    gap = (ev[1] - ev[2]).item()
    for value, r, truth in zip(d["eigenvalues"], d["residuals"], ev[:2].tolist()):
        assert abs(value - truth) <= r * r / gap + 1e-12 * abs(truth)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("probe,opts", [("trace", {"rtol": "none", "probes_max": 12, "block_size": 4}),
                                        ("spectrum", {"lanczos_steps": 12})])
def test_a_small_max_memory_on_cuda_gives_the_unchunked_values(probe, opts, device):
    """Micro-batches planned against a small device allowance change no value (float64, 1e-12)."""
    case = make_case("mlp")
    whole = _probe_on(case, device, probe, 2**40, **opts)
    memory = whole.details["memory"]
    assert memory["limit_bytes"] == 2**40 and memory["microbatch_samples"] is None
    cut = _probe_on(case, device, probe, memory["stored_vector_bytes"] + 2 * memory["graph_bytes_per_sample"] + 1,
                    **opts)
    assert cut.details["memory"]["microbatch_samples"] == 2
    assert abs(cut.value - whole.value) <= 1e-12 * abs(whole.value)


@gpu_only
def test_max_memory_on_cuda_caps_what_the_device_holds(tmp_path):
    """--max-memory on a GPU is device memory: what torch holds there (model, samples) is taken
    off it, and a cap the device already holds more than is one line, exit 2."""
    report = _trace_json(tmp_path, "cuda", "--max-memory", "2G")
    memory = report["results"]["trace"]["details"]["memory"]
    assert memory["max_memory_bytes"] == 2 * 2**30 and 0 < memory["process_held_bytes"] < 2**30
    args = ["trace", str(ROOT / "demo/digits_cnn.safetensors"), "--spec", str(ROOT / "model_specs/demo_digits.yaml"),
            "--data", "digits", "--samples", "200", "--device", "cuda", "--max-memory", "1000", "-q"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "--max-memory 1,000 bytes" in res.output and "leaves no room" in res.output


def _demo_report(**kw) -> dict:
    from flatcheck.api import run
    from flatcheck.config import RunConfig, probe_requests

    probes = probe_requests(["trace", "lmax"], {"trace": {"probes_max": 12, "rtol": "none"}})
    return run(RunConfig(checkpoint=ROOT / "demo/digits_cnn.safetensors", spec=ROOT / "model_specs/demo_digits.yaml",
                         data="digits", samples=600, dtype="float64", device="cuda", probes=probes, **kw)).to_dict()


@gpu_only
def test_the_batch_grows_on_cuda_and_measures_what_a_chosen_one_does():
    """On a GPU the default batch grows when the memory plan fits it (the demo's 600 samples:
    one batch), the report says so, and the values are a chosen batch's to round-off, far
    inside each probe's own error; --bn-mode train keeps the default."""
    grown = _demo_report()
    data = grown["data"]
    assert data["batch_size"] == 600 and "grown from 128" in data["batch_size_reason"]
    chosen = _demo_report(batch_size=100)
    kept = chosen["data"]
    assert kept["batch_size"] == 100 and kept["batch_size_reason"] == "chosen by the user"
    for name, a in chosen["results"].items():
        b = grown["results"][name]
        own = a["stderr"] or a["error_bound"]
        assert own and abs(a["value"] - b["value"]) <= 1e-6 * own, name
    report = _demo_report(bn_mode="train")
    data = report["data"]
    assert data["batch_size"] == 128 and "--bn-mode train" in data["batch_size_reason"]
