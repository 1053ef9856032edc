"""Probes in one run do not damage each other.

Every ordered pair of registered probes runs back to back in one run, on the demo CNN (it
has a BatchNorm, a head and a test split, so every probe accepts it), and each probe's
value and standard error must equal those of the same probe run alone in a fresh session
at the same seed. After every run the model must be as it was: parameters and buffers
bitwise, training flags, requires_grad, and no hook left registered.

Tolerance: with state intact, a probe in a run repeats the float64 operations of its run
alone, so the values can differ only by summation order inside kernels (BLAS may pick its
blocking by memory alignment): a few hundred eps relative, ~1e-13, at most. Measured here:
all 193 values bitwise equal. RTOL = 1e-10 (|a − b| ≤ RTOL·max(1, |a|); the 1 keeps values
near zero from demanding a relative agreement their absolute rounding cannot give) leaves
three orders above that and is five below what damage does: adaptive-sharpness moves the
weights by ρ = 5e-4 of their size, a changed BatchNorm buffer or eps moves the values by
1e-5 relative or more, and a stale kept graph raises. The probe right after one that
rewrites the weights must match bitwise: it runs the same kernels on the same bits.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.support.dense import dense, make_case
from flatcheck.api import open_session, run
from flatcheck.config import RunConfig, probe_requests
from flatcheck.probes._head import head_batches, resolve_head
from flatcheck.probes._inputjac import iter_rows
from flatcheck.probes.registry import list_probes
from flatcheck.report.result import ProbeResult

pytestmark = pytest.mark.workflow  # whole workflows, seconds each: make test-all only


ROOT = Path(__file__).resolve().parents[2]
RTOL = 1e-10
# Few products per probe, so ~190 probe runs take about half a minute on a shared 2-core machine;
# trace and adaptive-sharpness take two blocks, so kept graphs are reused inside a probe.
OPTIONS = {
    "trace": {"probes_max": 4, "block_size": 2},
    "lmax": {"k": 1, "max_iter": 4},
    "spectrum": {"lanczos_steps": 3, "starts": 2},
    "rank": {"lanczos_steps": 3, "starts": 2},
    "adaptive-sharpness": {"noise_draws": 2, "probes_max": 2, "block_size": 1},
    "jacobian": {"projections": 2},
}
# Probes that write the weights in place and copy them back: the next probe must match bitwise.
REWRITES_WEIGHTS = {"adaptive-sharpness"}
# Probes the demo model cannot take, with the reason; each is then left out of the pairs.
CANNOT_RUN: dict[str, str] = {}


@pytest.fixture
def one_thread():
    """Intra-op threads only cost on a model this small: on a shared 2-core machine two
    threads made the same probes 30 times slower (19 s against 0.66 s of CPU time for all)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def config(names: list[str]) -> RunConfig:
    # two batches: kept first-order graphs start on the second pass (autograd._KeptPrefix);
    # the digits data has the test split that gap needs
    return RunConfig(checkpoint=ROOT / "demo" / "digits_cnn.safetensors", spec=ROOT / "model_specs" / "demo_digits.yaml",
                     data="digits", samples=32, batch_size=16, dtype="float64", device="cpu",
                     probes=probe_requests(names, {n: OPTIONS[n] for n in names if n in OPTIONS}))


def zigzag_runs(names: list[str]) -> list[list[str]]:
    """Runs without a repeated probe in which every ordered pair (a, b) of `names` occurs
    back to back: Walecki's zigzag paths k, k+1, k−1, k+2, … cover each edge of the complete
    graph on an even number of vertices once; each is run forwards and backwards. An odd
    count gets a phantom vertex, which cuts its paths in two."""
    n = len(names) + len(names) % 2
    runs = []
    for k in range(n // 2):
        path = [(k + (i + 1) // 2 * (1 if i % 2 else -1)) % n for i in range(n)]
        cut = path.index(len(names)) if len(names) < n else n
        for part in (path[:cut], path[cut + 1 :]):
            if len(part) > 1:
                runs += [[names[i] for i in part], [names[i] for i in reversed(part)]]
    return runs


def snapshot(model: nn.Module) -> dict:
    modules = dict(model.named_modules())
    return {
        "tensors": {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        "requires_grad": {k: p.requires_grad for k, p in model.named_parameters()},
        "training": {k: m.training for k, m in modules.items()},
        "bn_tracking": {k: m.track_running_stats for k, m in modules.items()
                        if isinstance(m, nn.modules.batchnorm._BatchNorm)},
        # the model source's own (the logits selector on the root) stay; a probe's must go
        "hooks": hooks(model),
    }


def hooks(model: nn.Module) -> dict[str, list[int]]:
    """Ids of every hook on the model's modules, and of the global module hooks."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    found = {f"{k}.{h}": list(getattr(m, h, {})) for k, m in model.named_modules() for h in kinds}
    glob = torch.nn.modules.module
    found.update({h: list(getattr(glob, h, {})) for h in ("_global_forward_hooks", "_global_forward_pre_hooks",
                                                          "_global_backward_hooks")})
    return found


def assert_intact(model: nn.Module, before: dict, where: str) -> None:
    after = snapshot(model)
    for k, v in before["tensors"].items():
        now = after["tensors"][k]
        assert now.dtype == v.dtype and torch.equal(now, v), f"{where}: {k} changed"
    for key in ("requires_grad", "training", "bn_tracking", "hooks"):
        assert after[key] == before[key], f"{where}: {key} changed"
    assert torch.is_grad_enabled(), f"{where}: gradient mode left off"


def run_checked(names: list[str]) -> dict[str, ProbeResult]:
    cfg = config(names)
    session = open_session(cfg)
    before = snapshot(session.model)
    results = run(cfg, session=session).results
    assert_intact(session.model, before, f"run {','.join(names)}")
    return results


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= RTOL * max(1.0, abs(a))


def test_zigzag_runs_cover_every_ordered_pair_once():
    for count in range(2, 16):
        names = [f"p{i}" for i in range(count)]
        runs = zigzag_runs(names)
        pairs = [(r[i], r[i + 1]) for r in runs for i in range(len(r) - 1)]
        assert all(len(set(r)) == len(r) for r in runs)
        assert sorted(pairs) == sorted((a, b) for a in names for b in names if a != b), count


def test_every_pair_of_probes_in_one_run_matches_each_alone(one_thread):
    start = time.perf_counter()
    names = [n for n in list_probes() if n not in CANNOT_RUN]
    alone = {n: run_checked([n])[n] for n in names}
    for n, r in alone.items():
        assert r.value is not None, f"{n} gave no value on the demo model: {r.details}"
    runs = zigzag_runs(names)
    mismatches = []
    for order in runs:
        results = run_checked(order)
        for prev, name in zip([None, *order], order):
            got, want = results[name], alone[name]
            if prev in REWRITES_WEIGHTS:
                ok = (got.value, got.stderr) == (want.value, want.stderr)
            else:
                ok = same(got.value, want.value) and same(got.stderr, want.stderr)
            if not ok:
                mismatches.append(f"{name} after {prev}: {got.value!r} ± {got.stderr!r}, "
                                  f"alone {want.value!r} ± {want.stderr!r}")
    assert not mismatches, "\n".join(mismatches)
    print(f"{len(runs)} runs, {sum(map(len, runs)) + len(names)} probe runs in {time.perf_counter() - start:.1f} s")


def test_trace_adaptive_sharpness_lmax_in_one_run(one_thread):
    """The issue's reproducer: trace keeps first-order graphs, adaptive-sharpness rewrites
    and restores the weights they saved, lmax reuses them."""
    results = run_checked(["trace", "adaptive-sharpness", "lmax"])
    assert all(r.value is not None for r in results.values())


def _move(model: nn.Module, how: str) -> None:
    conv, bn = model[0], model[1]
    with torch.no_grad():
        if how == "weight written":
            conv.weight.mul_(1.5)
        elif how == "buffer written":
            bn.running_mean.add_(0.3)
        else:
            conv.weight = nn.Parameter(conv.weight * 1.5)


@pytest.mark.parametrize("how", ["weight written", "buffer written", "weight replaced"])
def test_kept_graphs_and_primals_follow_the_model(how, one_thread):
    """The backend's kept first-order graphs and vᵀHv primals (three batches, all kept from
    the second pass) give the dense Hessian of the model as it is now after a parameter or
    buffer is rewritten or replaced, and the first numbers exactly once it is put back."""
    case = make_case("cnn", n=23, batch_size=10)
    b = case.backend("autograd")
    V = torch.randn(2, case.problem.layout.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    hv, vhv = b.hvp(V), b.vhv(V)
    assert torch.equal(b.hvp(V), hv) and torch.equal(b.vhv(V), vhv)
    assert len(b._graph_cache.items) == len(b._primal_cache.items) == 3
    saved = {k: t.detach().clone() for k, t in case.model.state_dict().items()}
    original = case.model[0].weight
    _move(case.model, how)
    H, _ = dense(case)
    want = V @ H
    tol = 1e3 * torch.finfo(torch.float64).eps
    assert ((b.hvp(V) - want).norm() / want.norm()).item() < tol
    assert ((b.vhv(V) - (V * want).sum(1)).abs().max() / (V * want).sum(1).abs().max()).item() < tol
    case.model[0].weight = original
    with torch.no_grad():
        for k, t in case.model.state_dict().items():
            t.copy_(saved[k])  # back bit for bit, which bumps every version once more
    assert torch.equal(b.hvp(V), hv) and torch.equal(b.vhv(V), vhv)


def test_a_caller_that_stops_early_leaves_no_mode_or_hook_behind():
    """The per-batch streams probes iterate (outputs, the head's features, input Jacobian
    rows) switch BatchNorm, gradients and hooks for each forward only: suspended between
    batches, as a probe that raises or stops early leaves them, the model is as it was."""
    cfg = dataclasses.replace(config(["gini"]), bn_mode="train")
    session = open_session(cfg)
    before = snapshot(session.model)
    backend = session.backend
    head = resolve_head(session.model, session.spec, None)
    streams = {"outputs": iter(backend.outputs()), "head_batches": head_batches(backend, head),
               "iter_rows": iter_rows(backend.problem, "logits", [], tap_outputs=False)}
    for name, stream in streams.items():
        next(stream)
        assert_intact(session.model, before, f"{name} suspended")
