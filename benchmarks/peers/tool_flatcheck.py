"""flatcheck's side: every task, on one backend (`flatcheck:NAME`, `+parts`, `+compile`)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from peers.measure import Counter, sync, timed
from peers.problem import Setup, flat_params
from peers.rows import Row
from peers.tasks import ONE_PCT, Task


def run(row: Row, setup: Setup, task: Task, tool: str, hints: dict) -> None:
    from flatcheck.backends import ExactGGN, Vhv, create_backend
    from flatcheck.linalg import density, hutchinson, lanczos_top, slq
    from flatcheck.linalg.trace import default_block
    from flatcheck.operators import CurvatureOperator, LayoutParts
    from flatcheck.probes.trace import TraceOptions

    from flatcheck.engines.quadform import preload

    # "func+compile": the func backend, torch.compiled; "autograd+parts": a trace with per-layer parts
    name, _, flag = tool.split(":", 1)[1].partition("+")
    preload()  # imports stay out of the timing, as the peers' do
    compile_ = flag == "compile"
    o, p = task.opts, setup.problem
    gen = torch.Generator().manual_seed(0)
    state: dict[str, Any] = {}

    def op_count() -> int:
        return state["op"].matvecs if "op" in state else 0

    def make_op(matrix: str = "hessian"):
        state["op"] = CurvatureOperator(create_backend(name, p), matrix)
        return state["op"]

    if task.kind == "trace":
        parts = flag == "parts"

        def go():
            op = make_op()
            return hutchinson(op, generator=gen, max_probes=o["probes"], block_size=TraceOptions().block_size,
                              split=LayoutParts(op.layout) if parts else None)

        est = timed(row, setup, op_count, go)
        # what `flatcheck trace` uses (with --no-layers for the rows without parts)
        op = state["op"]
        block = TraceOptions().block_size or default_block(op, parts=parts)
        if parts:
            how = ("per-layer parts (`flatcheck trace`): vᵀHv and its parts by double-backward HVPs from int8 signs"
                   if op.streams_quadratic else "per-layer parts: (k, P) products")
        elif isinstance(op.backend, Vhv) and op.streams_total:
            why = op.backend.vhv_error
            how = ("total only (`--no-layers`): vᵀHv by forward tangents against first-order adjoints, no HVP"
                   if why is None else f"total only: vᵀHv by HVPs, forward tangents FAILED: {why}")
        else:
            how = "total only: (k, P) products"
        row.value = f"{est.value:.5g} ± {est.stderr:.2g}"
        row.notes = f"blocks of {block}, {how}; backend built inside the timing"
        row.extra.update(value=est.value, stderr=est.stderr)
    elif task.kind == "eig":
        res = timed(row, setup, op_count, lambda: lanczos_top(make_op(), o["k"], generator=gen, tol=o["tol"],
                                                               max_iter=o["max_iter"]))
        rel = [r / abs(v) for v, r in zip(res.values, res.residuals)]
        bound = [b.value / abs(v) for v, b in zip(res.values, res.bounds)]
        row.value = ", ".join(f"{v:.7g}" for v in res.values)
        row.notes = (f"Lanczos {res.iterations} steps, {res.stop_reason}; true rel. residual ≤ {max(rel):.1e}, "
                     f"rel. error bound ≤ {max(bound):.1e} (stops on the bound r²/δ, or r without a gap, "
                     f"≤ tol·|λ|)")
        row.extra.update(values=res.values, steps=res.iterations, converged=all(res.converged))
    elif task.kind == "slq":
        def go():
            r = slq(make_op(), steps=o["steps"], starts=o["starts"], generator=gen)
            return r, density(r)

        res, _ = timed(row, setup, op_count, go)
        tr = res.moment(1)
        row.value = f"Tr≈{tr.mean():.4g}; nodes [{res.nodes_min:.3g}, {res.nodes_max:.3g}]"
        row.notes = "full reorthogonalisation; Tr = P·Σ w θ of the Gauss rules"
        row.extra.update(lo=res.nodes_min, hi=res.nodes_max)
    elif task.kind == "hvpgrad":
        g = gradient_seconds(setup)
        backend = create_backend(name, p, compile=compile_)
        V = torch.randn(o["block"], p.layout.dim, generator=gen, dtype=torch.float64).to(setup.device, setup.dtype)
        t0 = time.perf_counter()
        # warm-up with the timed block's shape (torch.compile compiles for it); with one batch
        # this also builds the kept first-order graph
        backend.hvp(V)
        sync(setup.device)
        warm = time.perf_counter() - t0
        calls = Counter()

        def go():
            calls.add(V.shape[0])
            return backend.hvp(V)

        timed(row, setup, calls, go)
        per = row.seconds / V.shape[0]
        row.value = f"{per / g:.2f}"
        row.notes = f"gradient {g:.3g} s, HVP {per:.3g} s per vector (block of {V.shape[0]})"
        if p.samples.num_batches == 1:
            row.notes += "; first-order graph kept from the warm-up"
        if compile_:
            err = getattr(backend, "compile_error", None)
            row.notes += (f"; torch.compile FAILED, ran eagerly: {err}" if err else
                          f"; torch.compile, first call (compiling) {warm:.3g} s")
        row.extra.update(ratio=per / g, grad_s=g, hvp_s=per)
    elif task.kind == "block":
        backend = create_backend(name, p)
        V = torch.randn(o["block"], p.layout.dim, generator=gen, dtype=torch.float64).to(setup.device, setup.dtype)
        backend.hvp(V[:1])
        sync(setup.device)
        calls = Counter()

        def loop():
            for i in range(V.shape[0]):
                calls.add()
                backend.hvp(V[i:i + 1])

        t0 = time.perf_counter()
        loop()
        sync(setup.device)
        t_loop = time.perf_counter() - t0

        def block():
            calls.add(V.shape[0])
            return backend.hvp(V)

        timed(row, setup, lambda: calls.n, block)
        row.value = f"{t_loop / row.seconds:.2f}× throughput"
        row.notes = f"loop of {V.shape[0]} single HVPs {t_loop:.3g} s, one block {row.seconds:.3g} s (time shown)"
        row.extra.update(speedup=t_loop / row.seconds)
    elif task.kind == "ggn":
        backend = create_backend(name, p)
        if not isinstance(backend, ExactGGN):
            raise RuntimeError(f"backend {name} has no ggn_trace")
        g = gradient_seconds(setup)
        op = CurvatureOperator(backend, "ggn")
        t0 = time.perf_counter()
        est = hutchinson(op, generator=gen, max_probes=o["probes"], block_size=TraceOptions().block_size)  # the CLI's default
        sync(setup.device)
        t_h = time.perf_counter() - t0
        exact = timed(row, setup, lambda: 0, lambda: backend.ggn_trace())
        tr = exact.per_param.sum().item()
        need = max(1, math.ceil((est.stderr * math.sqrt(est.probes) / (ONE_PCT * abs(est.value))) ** 2))
        t_need = need * t_h / est.probes
        row.hvps = None
        row.value = f"exact {tr:.5g}; Hutchinson {est.value:.5g} ± {est.stderr:.2g}"
        row.notes = (f"exact {row.seconds:.3g} s = {row.seconds / g:.1f} gradients ({exact.columns} VJPs); "
                     f"Hutchinson on G needs {need} probes ≈ {t_need:.3g} s for {ONE_PCT:.0%} stderr "
                     f"(measured {est.probes} in {t_h:.3g} s) → exact {t_need / row.seconds:.1f}× faster")
        row.extra.update(exact_in_grads=row.seconds / g, probes_needed=need, hutch_needed_s=t_need,
                         speedup=t_need / row.seconds)
    else:
        raise ValueError(task.kind)


def gradient_seconds(setup: Setup, repeats: int = 3) -> float:
    """Median time of one eager gradient of the whole-sample-set loss (after a warm-up)."""
    from flatcheck.problem import model_mode
    from flatcheck.losses import per_sample_loss

    p = setup.problem
    params = flat_params(setup)

    def grad():
        with model_mode(p.model, p.bn_mode):
            for b in p.samples:
                loss = per_sample_loss(p.model(b.x), b.y, p.loss).mean() * b.weight
                torch.autograd.grad(loss, params)
        sync(setup.device)

    grad()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        grad()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]
