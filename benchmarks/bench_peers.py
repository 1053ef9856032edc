"""flatcheck against PyHessian, curvlinops and hessian-eigenthings, side by side, in one run.

Same model, data, batch size, probe count / Lanczos steps, dtype and device for every tool:

  trace     Hutchinson trace of the Hessian with the same number of Rademacher probes (HVPs)
  top-eig   top eigenvalue(s) to the same tolerance (flatcheck: Lanczos, true relative residual;
            PyHessian: power iteration, relative change of λ; hessian-eigenthings: power
            iteration, relative change and relative residual; curvlinops: scipy eigsh (ARPACK))
  slq       spectral density by stochastic Lanczos quadrature with the same steps and starts
  hvp/grad  flatcheck only: time of one HVP (in a block) ÷ time of one gradient, same data
  block     flatcheck only: 16 probes in one block against a loop of 16 single HVPs
  ggn       flatcheck only: exact GGN trace against Hutchinson (on G) at 1 % relative stderr

flatcheck runs once per backend in flatcheck.backends.list_backends() ("distributed" skipped).
Every row runs in its own process (forked from a server that has torch imported), so peak memory
is that row's own: the rise of the process's resident-set high-water mark over its resident set
just before the timed work (CPU), or torch.cuda.max_memory_allocated over the allocation before
it (CUDA). HVPs are products of the whole-sample-set Hessian with one vector (one product over
8 batches is one HVP): flatcheck counts them in its operator; for the peers they are counted by
wrapping the peer's own product function (PyHessian: hessian_vector_product and
dataloader_hv_product; curvlinops: columns passed to _matmat; hessian-eigenthings:
HessianOperator.matvec). A peer that fails is a row with its error, never dropped. With
--repeat N every row runs N times, the tools of a task taking turns, and each tool's row is its
run of median time (ratios are then of medians; HVP ÷ gradient, block and GGN rows: of median
ratio, speed-up, gradient-times) with the largest peak memory of its runs.

    python benchmarks/bench_peers.py [--models demo,resnet18,vit] [--device cpu|cuda|auto]
                                     [--full] [--save] [--backends autograd,func] [--peers ...]
                                     [--repeat N]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import json
import math
import multiprocessing as mp
import os
import pkgutil
import platform
import resource
import shlex
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PEERS = ("pyhessian", "curvlinops", "eigenthings")
PEER_TITLES = {"pyhessian": "PyHessian", "curvlinops": "curvlinops", "eigenthings": "hessian-eigenthings"}
PEER_MODULES = {"pyhessian": "pyhessian", "curvlinops": "curvlinops", "eigenthings": "hessian_eigenthings"}
PEER_DISTS = {"pyhessian": "pyhessian", "curvlinops": "curvlinops-for-pytorch", "eigenthings": "hessian-eigenthings"}
SKIPPED_BACKENDS = ("distributed",)
LANCZOS_ONLY = ("pyhessian", "curvlinops", "eigenthings:lanczos")  # hessian-eigenthings without power iteration
ONE_PCT = 0.01  # relative standard error Hutchinson must reach in the exact-GGN comparison


# ================================================================== plan: what to run


@dataclass(frozen=True)
class DataCfg:
    """A sample set: `samples` items cut into batches of `batch`, in `dtype`."""

    samples: int
    batch: int
    dtype: str = "float32"

    @property
    def batches(self) -> int:
        return math.ceil(self.samples / self.batch)

    def label(self) -> str:
        n = self.batches
        return f"{n} batch{'es' if n > 1 else ''} of {self.batch}" + ("" if self.dtype == "float32" else f", {self.dtype}")


@dataclass(frozen=True)
class Task:
    kind: str  # trace, eig, slq, hvpgrad, block, ggn
    data: DataCfg
    opts: dict = field(default_factory=dict)
    peers: tuple[str, ...] = PEERS  # peers that run this task (flatcheck always does)

    def title(self) -> str:
        o = self.opts
        head = {
            "trace": lambda: f"Hutchinson trace, {o['probes']} probes",
            "eig": lambda: f"top-{o['k']} eigenvalue{'s' if o['k'] > 1 else ''}, tol {o['tol']:g}",
            "slq": lambda: f"SLQ density, {o['starts']}×{o['steps']} steps",
            "hvpgrad": lambda: f"HVP ÷ gradient (block of {o['block']})",
            "block": lambda: f"{o['block']} probes: one block vs loop",
            "ggn": lambda: f"exact Tr(GGN) vs Hutchinson at {ONE_PCT:.0%} stderr",
        }[self.kind]()
        return f"{head} · {self.data.label()}"


@dataclass(frozen=True)
class ModelCfg:
    key: str
    title: str
    spec: str
    data: str
    checkpoint: str | None
    tasks: tuple[Task, ...]


def plan(models: list[str], full: bool) -> list[ModelCfg]:
    """Default sizes finish in a few minutes on a 2-core CPU; --full sizes are for a GPU."""
    out = []
    for key in models:
        if key == "demo":
            one = DataCfg(1000, 1000)
            # float64 convolutions are slow on the CPU (~0.5 s per HVP at 1000 samples)
            one64 = DataCfg(1000, 1000, "float64") if full else DataCfg(250, 250, "float64")
            eig = dict(tol=1e-6, max_iter=300, power_iter=1000)
            tasks = (
                Task("trace", one, dict(probes=100 if full else 20)),
                # hessian-eigenthings' power iteration needs 100s of HVPs at this tolerance: --full
                Task("eig", one64, dict(k=1, **eig), peers=PEERS if full else LANCZOS_ONLY),
                Task("eig", one64, dict(k=5, **eig), peers=PEERS if full else LANCZOS_ONLY),
                # the CLI's default batching: each step a product over 8 batches (flatcheck keeps
                # their first-order graphs; PyHessian's dataloader mode rebuilds them every step)
                Task("eig", DataCfg(1000, 128), dict(k=1, tol=1e-4, max_iter=100, power_iter=200),
                     peers=PEERS if full else ("pyhessian",)),
                Task("slq", one, dict(steps=80 if full else 15, starts=3 if full else 2)),
                Task("hvpgrad", DataCfg(1000, 125), dict(block=16, compile=True)),
                Task("block", one, dict(block=16)),
                Task("block", DataCfg(1000, 128), dict(block=16)),  # the CLI's default batching
                Task("ggn", one, dict(probes=20)),
            )
            out.append(ModelCfg(key, "demo DigitsCNN (demo/digits_cnn.safetensors, digits)", "demo_digits.yaml",
                                "digits", "demo/digits_cnn.safetensors", tasks))
        elif key == "resnet18":
            # On a 2-core CPU one ResNet-18 HVP at batch 64 takes ~4 s (a gradient ~1.7 s), so the
            # CPU defaults are one batch of 16 and 8 batches of 8; --full has the GPU sizes.
            one = DataCfg(256, 256) if full else DataCfg(16, 16)
            eight = DataCfg(8 * 256, 256) if full else DataCfg(64, 8)
            probes = 100 if full else 10
            tasks = [
                Task("trace", one, dict(probes=probes)),
                # curvlinops and hessian-eigenthings make one forward per product and batch; on the
                # CPU they would take minutes here: --full runs them.
                Task("trace", eight, dict(probes=probes if full else 5), peers=PEERS if full else ("pyhessian",)),
                # torch.compile of a ResNet-18 HVP takes minutes on this CPU: --full compiles it
                Task("hvpgrad", one, dict(block=8 if full else 4, compile=full)),
                Task("hvpgrad", eight, dict(block=8 if full else 4, compile=full)),
                Task("ggn", one, dict(probes=probes)),
            ]
            if full:  # the demo has these on the CPU
                tasks += [Task("eig", one, dict(k=1, tol=1e-3, max_iter=100, power_iter=100)),
                          Task("slq", one, dict(steps=80, starts=3))]
            out.append(ModelCfg(key, "ResNet-18 CIFAR (random weights, synthetic 32×32, 10 classes)",
                                "resnet18_cifar.yaml", "synthetic", None, tuple(tasks)))
        elif key == "vit":
            b = 32 if full else 4
            one = DataCfg(b, b)
            tasks = [Task("trace", one, dict(probes=20 if full else 4)), Task("hvpgrad", one, dict(block=8 if full else 2))]
            if full:
                tasks += [Task("eig", one, dict(k=1, tol=1e-3, max_iter=100, power_iter=100)),
                          Task("slq", one, dict(steps=40, starts=1))]
            out.append(ModelCfg(key, "ViT-S/16 at 224 (timm, random weights, synthetic, 1000 classes)",
                                "vit_small_patch16_224.yaml", "synthetic", None, tuple(tasks)))
        else:
            raise SystemExit(f"--models: unknown model {key!r}; choose from demo, resnet18, vit")
    return out


# ================================================================== the problem every tool sees


@dataclass
class Setup:
    model: torch.nn.Module
    problem: Any  # flatcheck Problem
    batches: list  # [(x, y)] the same tensors flatcheck iterates
    criterion: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    n: int


def build_setup(model: ModelCfg, data: DataCfg, device: str) -> Setup:
    from flatcheck.api import resolve_device
    from flatcheck.backends import ParamLayout, Problem
    from flatcheck.data.batches import SampleSet
    from flatcheck.data.registry import create_dataset
    from flatcheck.models.checkpoint import apply_state_dict, load_checkpoint
    from flatcheck.models.sources import build_model, resolve_preprocess
    from flatcheck.models.spec import load_spec

    spec = load_spec(ROOT / "model_specs" / model.spec)
    if spec.loss.name != "cross_entropy":
        raise ValueError(f"{model.spec}: the peers are given torch's CrossEntropyLoss, but the spec's loss is {spec.loss.name}")
    torch.manual_seed(0)
    net = build_model(spec)  # timm models: flatcheck calls timm.layers.set_fused_attn(False) first
    if model.checkpoint is not None:
        apply_state_dict(net, load_checkpoint(ROOT / model.checkpoint).state_dict)
    pre = resolve_preprocess(spec, net)
    ds = create_dataset(model.data, split="train", preprocess=pre, num_classes=spec.num_classes, seed=0)
    dev = resolve_device(device)
    if dev.type == "cuda":
        # flatcheck's default (TF32 rounds to 10 mantissa bits); torch leaves cuDNN's TF32 on,
        # so without this the peers' convolutions would run in TF32 and flatcheck's would not
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, data.dtype)
    net.to(device=dev, dtype=dtype).eval()
    samples = SampleSet(ds, samples=data.samples, batch_size=data.batch, device=dev, dtype=dtype)
    batches = [(b.x, b.y) for b in samples]
    problem = Problem(net, spec.loss, samples, ParamLayout.from_model(net), bn_mode="eval")
    return Setup(net, problem, batches, torch.nn.CrossEntropyLoss(), dev, dtype, samples.n)


def flat_params(setup: Setup) -> list[torch.Tensor]:
    return setup.problem.layout.params(setup.model)


def reference_hvp(setup: Setup, v: torch.Tensor) -> torch.Tensor:
    """H v with the reference backend: checks a peer's eigenvector, outside its timing and count."""
    from flatcheck.backends import create_backend

    return create_backend("autograd", setup.problem).hvp(v.reshape(1, -1).to(setup.dtype))[0]


def relative_residual(setup: Setup, lam: float, vec) -> float:
    v = vec if isinstance(vec, torch.Tensor) else torch.cat([t.reshape(-1) for t in vec])
    v = v.detach().reshape(-1).to(device=setup.device, dtype=setup.dtype)
    v = v / torch.linalg.vector_norm(v)
    hv = reference_hvp(setup, v)
    rq = torch.dot(v, hv).item()
    return torch.linalg.vector_norm(hv - rq * v).item() / abs(rq if rq != 0 else lam)


# ================================================================== memory and timing


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of the timed work only.

    CUDA: max_memory_allocated over the allocation before. CPU: the resident-set high-water mark
    is reset to the current RSS (/proc/self/clear_refs, "5") and its rise read from VmHWM; where
    that is refused, getrusage's ru_maxrss rise (which misses peaks below earlier ones).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.how = ""

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.how = "cuda max_memory_allocated"
            return self
        self.base = _status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.how = "VmHWM − VmRSS"
        except OSError:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.how = "ru_maxrss rise"
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mib = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        elif self.how == "VmHWM − VmRSS":
            self.mib = ((_status_kib("VmHWM") or 0) - (self.base or 0)) / 1024
        else:
            self.mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.base) / 1024
        return False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Budget(Exception):
    pass


class Counter:
    def __init__(self, cap: int | None = None):
        self.n, self.cap = 0, cap

    def add(self, k: int = 1) -> None:
        self.n += k
        if self.cap is not None and self.n > self.cap:
            raise Budget(f"stopped after {self.cap} HVPs without converging")


# ================================================================== one row


@dataclass
class Row:
    model: str
    task: str
    task_kind: str
    tool: str  # "flatcheck[autograd]", "PyHessian", ...
    seconds: float | None = None
    hvps: int | None = None
    value: str = ""
    peak_mib: float | None = None
    notes: str = ""
    error: str | None = None
    extra: dict = field(default_factory=dict)  # numbers the summary needs

    @property
    def is_flatcheck(self) -> bool:
        return self.tool.startswith("flatcheck")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


def run_row(model: ModelCfg, task: Task, tool: str, device: str, hints: dict) -> dict:
    """Build the problem, warm up, run one (tool, task) and return the Row as a dict."""
    warnings.filterwarnings("ignore")
    row = Row(model.key, task.title(), task.kind, display_name(tool))
    default_dtype = torch.get_default_dtype()
    try:
        if task.data.dtype == "float64":
            # PyHessian and the eigenthings draw random vectors in the default dtype
            torch.set_default_dtype(torch.float64)
        setup = build_setup(model, task.data, device)
        with torch.no_grad():  # lazy initialisation (oneDNN, cuDNN) outside every timing
            setup.model(setup.batches[0][0][:2])
        sync(setup.device)
        fn = TOOLS[tool.split(":")[0]]
        fn(row, setup, task, tool, hints)
    except Exception as exc:  # noqa: BLE001 — a failure is a row, not a crash
        row.error = one_line(exc)
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
    finally:
        torch.set_default_dtype(default_dtype)  # rows may run in the caller's process (tests)
    return row.__dict__


def display_name(tool: str) -> str:
    if tool.startswith("flatcheck:"):
        return f"flatcheck[{tool.split(':', 1)[1]}]"
    if tool == "eigenthings:lanczos":
        return "hessian-eigenthings (Lanczos)"
    return PEER_TITLES.get(tool, tool)


def _timed(row: Row, setup: Setup, counter: Counter | Callable[[], int], fn: Callable[[], Any]) -> Any:
    """Run fn under timing and peak memory; on failure keep time and HVPs until it, then raise."""
    get = counter if callable(counter) else (lambda: counter.n)
    mem = PeakMemory(setup.device)
    t0 = time.perf_counter()
    try:
        with mem:
            out = fn()
            sync(setup.device)
    finally:
        row.seconds = time.perf_counter() - t0
        row.hvps = get()
        row.peak_mib = getattr(mem, "mib", None)
    return out


# ---------------------------------------------------------------- flatcheck


def flatcheck_row(row: Row, setup: Setup, task: Task, tool: str, hints: dict) -> None:
    from flatcheck.backends import create_backend
    from flatcheck.linalg import density, hutchinson, lanczos_top, slq
    from flatcheck.linalg.trace import default_block
    from flatcheck.operators import CurvatureOperator, LayoutParts
    from flatcheck.probes.trace import TraceOptions

    from flatcheck.backends.quadform import preload

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

        est = _timed(row, setup, op_count, go)
        # what `flatcheck trace` uses (with --no-layers for the rows without parts)
        op = state["op"]
        block = TraceOptions().block_size or default_block(op, parts=parts)
        if parts:
            how = ("per-layer parts (`flatcheck trace`): vᵀHv and its parts by double-backward HVPs from int8 signs"
                   if op.streams_quadratic else "per-layer parts: (k, P) products")
        elif "vhv" in op.backend.capabilities and op.streams_total:
            why = getattr(op.backend, "vhv_error", None)
            how = ("total only (`--no-layers`): vᵀHv by forward tangents against first-order adjoints, no HVP"
                   if why is None else f"total only: vᵀHv by HVPs, forward tangents FAILED: {why}")
        else:
            how = "total only: (k, P) products"
        row.value = f"{est.value:.5g} ± {est.stderr:.2g}"
        row.notes = f"blocks of {block}, {how}; backend built inside the timing"
        row.extra.update(value=est.value, stderr=est.stderr)
    elif task.kind == "eig":
        res = _timed(row, setup, op_count, lambda: lanczos_top(make_op(), o["k"], generator=gen, tol=o["tol"],
                                                               max_iter=o["max_iter"]))
        rel = [r / abs(v) for v, r in zip(res.values, res.residuals)]
        row.value = ", ".join(f"{v:.7g}" for v in res.values)
        row.notes = (f"Lanczos {res.iterations} steps, {res.stop_reason}; true rel. residual ≤ {max(rel):.1e} "
                     f"(stops on ‖Hq−λq‖ ≤ tol·|λ|)")
        row.extra.update(values=res.values, steps=res.iterations, converged=all(res.converged))
    elif task.kind == "slq":
        def go():
            r = slq(make_op(), steps=o["steps"], starts=o["starts"], generator=gen)
            return r, density(r)

        res, _ = _timed(row, setup, op_count, go)
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

        _timed(row, setup, calls, go)
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

        _timed(row, setup, lambda: calls.n, block)
        row.value = f"{t_loop / row.seconds:.2f}× throughput"
        row.notes = f"loop of {V.shape[0]} single HVPs {t_loop:.3g} s, one block {row.seconds:.3g} s (time shown)"
        row.extra.update(speedup=t_loop / row.seconds)
    elif task.kind == "ggn":
        backend = create_backend(name, p)
        if "ggn_trace" not in backend.capabilities:
            raise RuntimeError(f"backend {name} has no ggn_trace")
        g = gradient_seconds(setup)
        op = CurvatureOperator(backend, "ggn")
        t0 = time.perf_counter()
        est = hutchinson(op, generator=gen, max_probes=o["probes"], block_size=TraceOptions().block_size)  # the CLI's default
        sync(setup.device)
        t_h = time.perf_counter() - t0
        exact = _timed(row, setup, lambda: 0, lambda: backend.ggn_trace())
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
    from flatcheck.backends.base import model_mode
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


# ---------------------------------------------------------------- PyHessian


def pyhessian_row(row: Row, setup: Setup, task: Task, tool: str, hints: dict) -> None:
    import pyhessian  # noqa: F401  (the package re-exports the class under the module's name)

    ph = sys.modules["pyhessian.hessian"]

    o = task.opts
    counter = Counter()
    plain = ph.hessian_vector_product

    def counted_hvp(gradsH, params, v):
        counter.add()
        return plain(gradsH, params, v)

    ph.hessian_vector_product = counted_hvp  # the name hessian.py calls
    one = len(setup.batches) == 1
    cuda = setup.device.type == "cuda"
    state: dict[str, Any] = {}

    def make():
        if one:
            h = ph.hessian(setup.model, setup.criterion, data=setup.batches[0], cuda=cuda)
        else:
            h = ph.hessian(setup.model, setup.criterion, dataloader=setup.batches, cuda=cuda)
        full = h.dataloader_hv_product

        def counted_full(v):
            counter.add()
            return full(v)

        h.dataloader_hv_product = counted_full
        state["h"] = h
        return h

    torch.manual_seed(0)
    mode = "single-batch mode (graph kept)" if one else "dataloader mode"
    if task.kind == "trace":
        # trace() stops once the running mean changes by < tol relatively; -inf: exactly maxIter probes
        vals = _timed(row, setup, counter, lambda: make().trace(maxIter=o["probes"], tol=float("-inf")))
        m = len(vals)
        mean = sum(vals) / m
        se = (sum((x - mean) ** 2 for x in vals) / (m - 1)) ** 0.5 / m**0.5 if m > 1 else float("nan")
        row.value = f"{mean:.5g} ± {se:.2g}"
        row.notes = f"{mode}; hessian(...).trace(maxIter={o['probes']}, tol=-inf)"
    elif task.kind == "eig":
        vals, vecs = _timed(row, setup, counter,
                            lambda: make().eigenvalues(maxIter=o["power_iter"], tol=o["tol"], top_n=o["k"]))
        res = max(relative_residual(setup, lam, v) for lam, v in zip(vals, vecs))
        row.value = ", ".join(f"{v:.7g}" for v in vals)
        row.notes = (f"power iteration, {mode}; stops on |Δλ|/|λ| < tol (not a residual), maxIter "
                     f"{o['power_iter']} per eigenvalue; true rel. residual after: {res:.1e}")
        row.extra.update(values=vals)
    elif task.kind == "slq":
        _timed(row, setup, counter, lambda: make().density(iter=o["steps"], n_v=o["starts"]))
        row.value = "ok"
        row.notes = f"density(iter={o['steps']}, n_v={o['starts']})"
    else:
        raise ValueError(task.kind)


# ---------------------------------------------------------------- curvlinops


def curvlinops_row(row: Row, setup: Setup, task: Task, tool: str, hints: dict) -> None:
    import curvlinops
    from scipy.sparse.linalg import eigsh

    o = task.opts
    counter = Counter(cap=o.get("power_iter") if task.kind == "eig" else None)
    params = flat_params(setup)

    def make():
        # check_deterministic=False and num_data given: no extra passes over the data at construction
        A = curvlinops.HessianLinearOperator(setup.model, setup.criterion, params, setup.batches,
                                             check_deterministic=False, num_data=setup.n)
        plain = A._matmat

        def counted(M):
            counter.add(M[0].shape[-1])  # list format: trailing axis holds the columns
            return plain(M)

        A._matmat = counted
        return A

    torch.manual_seed(0)
    if task.kind == "trace":
        tr = _timed(row, setup, counter, lambda: curvlinops.hutchinson_trace(make(), o["probes"]))
        row.value = f"{float(tr):.5g}"
        row.notes = "hutchinson_trace: A @ G, all probes in one vmapped block per batch; no stderr returned"
    elif task.kind == "eig":
        def go():
            return eigsh(make().to_scipy(), k=o["k"], which="LA", tol=o["tol"])

        vals, vecs = _timed(row, setup, counter, go)
        order = list(reversed(range(len(vals))))
        res = max(relative_residual(setup, float(vals[i]), torch.from_numpy(vecs[:, i].copy())) for i in order)
        row.value = ", ".join(f"{float(vals[i]):.7g}" for i in order)
        row.notes = f"scipy eigsh(to_scipy(), k={o['k']}, which='LA', tol={o['tol']:g}); true rel. residual after: {res:.1e}"
    elif task.kind == "slq":
        bounds = hints.get("bounds")

        def go():
            return curvlinops.lanczos_approximate_spectrum(make(), o["steps"], num_points=1024,
                                                           num_repeats=o["starts"], boundaries=bounds)

        grid, dens = _timed(row, setup, counter, go)
        grid, dens = grid.double().cpu(), dens.double().cpu()
        dim = sum(p.numel() for p in params)
        tr = dim * torch.trapezoid(grid * dens, grid).item()
        row.value = f"Tr≈{tr:.4g}"
        row.notes = ("lanczos_approximate_spectrum (Papyan 2020, no reorthogonalisation); "
                     + ("boundaries given from flatcheck's nodes, so no eigsh HVPs" if bounds
                        else "boundaries by eigsh (HVPs counted)"))
    else:
        raise ValueError(task.kind)


# ---------------------------------------------------------------- hessian-eigenthings


def eigenthings_row(row: Row, setup: Setup, task: Task, tool: str, hints: dict) -> None:
    import hessian_eigenthings as he

    o = task.opts
    counter = Counter()

    def make():
        op = he.HessianOperator(setup.model, setup.batches, he.supervised_loss(setup.criterion), full_dataset=True)
        plain = op.matvec

        def counted(v):
            counter.add()
            return plain(v)

        op.matvec = counted
        return op

    variant = tool.split(":", 1)[1] if ":" in tool else ""
    if task.kind == "trace":
        res = _timed(row, setup, counter, lambda: he.hutchinson(make(), num_samples=o["probes"], seed=0))
        row.value = f"{res.estimate:.5g} ± {res.stderr:.2g}"
        row.notes = "hutchinson(HessianOperator): one forward + double backward per probe and batch"
    elif task.kind == "eig" and variant == "lanczos":
        steps = max(hints.get("steps", 2 * o["k"]), o["k"])
        res = _timed(row, setup, counter, lambda: he.lanczos(make(), k=o["k"], max_iter=steps, tol=o["tol"],
                                                             which="LA", seed=0, reorthogonalize=True))
        vals = res.eigenvalues.tolist()
        true = max(relative_residual(setup, v, res.eigenvectors[i]) for i, v in enumerate(vals))
        row.value = ", ".join(f"{v:.7g}" for v in vals)
        row.notes = (f"lanczos with flatcheck's step count ({steps}; it has no stopping rule), "
                     f"{int(res.converged.sum())}/{len(vals)} converged by its estimate; true rel. residual {true:.1e}")
    elif task.kind == "eig":
        res = _timed(row, setup, counter, lambda: he.deflated_power_iteration(
            make(), k=o["k"], max_iter=o["power_iter"], tol=o["tol"], seed=0))
        vals = res.eigenvalues.tolist()
        true = max(relative_residual(setup, v, res.eigenvectors[i]) for i, v in enumerate(vals))
        row.value = ", ".join(f"{v:.7g}" for v in vals)
        row.notes = (f"deflated power iteration (stops on rel. change and rel. residual < tol), "
                     f"{int(res.converged.sum())}/{len(vals)} converged within {o['power_iter']}; "
                     f"true rel. residual {true:.1e}")
    elif task.kind == "slq":
        res = _timed(row, setup, counter, lambda: he.spectral_density(make(), num_runs=o["starts"],
                                                                      lanczos_steps=o["steps"], seed=0))
        nodes, w = res.raw_eigenvalues.double().nan_to_num(0.0), res.raw_weights.double()
        dim = sum(p.numel() for p in flat_params(setup))
        row.value = f"Tr≈{dim * (nodes * w).sum(1).mean().item():.4g}"
        row.notes = "spectral_density (full reorthogonalisation)"
    else:
        raise ValueError(task.kind)


TOOLS = {"flatcheck": flatcheck_row, "pyhessian": pyhessian_row, "curvlinops": curvlinops_row,
         "eigenthings": eigenthings_row}


# ================================================================== orchestration


def discover_backends() -> tuple[list[str], dict[str, str]]:
    """Import every module of flatcheck.backends (each registers itself) and list the backends.

    A module that fails to import is reported, not fatal.
    """
    import flatcheck.backends as fb
    from flatcheck.backends import list_backends

    broken = {}
    for info in pkgutil.iter_modules(fb.__path__):
        if info.name in ("base", "layout") or info.name in SKIPPED_BACKENDS:
            continue
        try:
            importlib.import_module(f"flatcheck.backends.{info.name}")
        except Exception as exc:  # noqa: BLE001
            broken[info.name] = one_line(exc)
    names = [b for b in list_backends() if b not in SKIPPED_BACKENDS]
    return names, {k: v for k, v in broken.items() if k not in names}


def peer_available(peer: str) -> str | None:
    """None when importable, else the reason."""
    try:
        importlib.import_module(PEER_MODULES[peer])
        return None
    except Exception as exc:  # noqa: BLE001
        return one_line(exc)


def tools_for(task: Task, backends: list[str], peers: list[str]) -> list[str]:
    tools = [f"flatcheck:{b}" for b in backends]
    if task.kind == "trace" and "autograd" in backends:
        # `flatcheck trace` with its per-layer table: parts need Hv, so HVPs (the plain rows
        # are `--no-layers`, the total alone, which takes vᵀHv by forward tangents)
        tools.insert(backends.index("autograd") + 1, "flatcheck:autograd+parts")
    if task.kind == "hvpgrad" and task.opts.get("compile") and "func" in backends:
        tools.append("flatcheck:func+compile")
    if task.kind in ("hvpgrad", "block", "ggn"):
        return tools
    for peer in peers:
        if peer not in task.peers:
            continue
        if peer == "eigenthings" and task.kind == "eig":
            tools += ["eigenthings", "eigenthings:lanczos"]
        else:
            tools.append(peer)
    if task.kind == "eig" and "eigenthings" in peers and "eigenthings:lanczos" in task.peers:
        tools.append("eigenthings:lanczos")  # Lanczos only (its power iteration is slow here)
    return tools


def _child(conn, model, task, tool, device, hints, threads):
    if threads:
        torch.set_num_threads(threads)
    try:
        conn.send(run_row(model, task, tool, device, hints))
    finally:
        conn.close()


class Runner:
    """Runs rows in fresh processes forked from a server with torch imported (or inline)."""

    def __init__(self, inline: bool, timeout: float, threads: int | None, preload: list[str] = ()):
        self.inline, self.timeout, self.threads = inline, timeout, threads
        if not inline:
            self.ctx = mp.get_context("forkserver")
            # imported once by the server (an ImportError there is ignored), not once per row
            self.ctx.set_forkserver_preload(["torch", "flatcheck.api", "flatcheck.linalg", *preload])

    def __call__(self, model: ModelCfg, task: Task, tool: str, device: str, hints: dict) -> Row:
        if self.inline:
            return Row(**run_row(model, task, tool, device, hints))
        parent, child = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_child, args=(child, model, task, tool, device, hints, self.threads))
        t0 = time.perf_counter()
        proc.start()
        child.close()
        result, error = None, None
        try:
            if parent.poll(self.timeout):
                result = parent.recv()
            else:
                error = f"timed out after {self.timeout:.0f} s (--row-timeout)"
        except EOFError:
            pass
        if proc.is_alive():
            proc.kill()
        proc.join()
        if result is not None:
            return Row(**result)
        if error is None:
            code = proc.exitcode
            error = f"process died (exit code {code}{'; out of memory?' if code in (-9, 137) else ''})"
        return Row(model.key, task.title(), task.kind, display_name(tool),
                   seconds=time.perf_counter() - t0, error=error)


def run_all(args, log: Callable[[str], None] = print,
            models: list[ModelCfg] | None = None) -> tuple[list[ModelCfg], list[Row], dict]:
    """Every (model, task, tool) row; `models` replaces the plan from --models/--full (tests)."""
    models = plan(args.models, args.full) if models is None else models
    backends, broken = discover_backends()
    if args.backends:
        backends = [b for b in backends if b in args.backends]
    peers = [p for p in args.peers if p in PEERS]
    missing = {p: peer_available(p) for p in peers}
    missing = {p: why for p, why in missing.items() if why}
    if args.tasks:
        for m in models:
            object.__setattr__(m, "tasks", tuple(t for t in m.tasks if t.kind in args.tasks))
    preload = [PEER_MODULES[p] for p in peers if p not in missing] + (["timm"] if "vit" in args.models else [])
    runner = Runner(args.inline, args.row_timeout, args.threads, preload)
    rows: list[Row] = []
    for m in models:
        for task in m.tasks:
            hints: dict[str, Any] = {}
            for name, why in broken.items():
                rows.append(Row(m.key, task.title(), task.kind, f"flatcheck[{name}]", error=f"backend did not import: {why}"))
            tools = []
            for tool in tools_for(task, backends, peers):
                peer = tool.split(":")[0]
                if peer in missing:
                    rows.append(Row(m.key, task.title(), task.kind, display_name(tool),
                                    error=f"not installed ({missing[peer]}); pip install '.[bench]'"))
                else:
                    tools.append(tool)
            # the repetitions take turns tool by tool, so a slow spell of the machine falls on
            # every tool alike instead of on whichever ran then
            runs: dict[str, list[Row]] = {tool: [] for tool in tools}
            for rep in range(args.repeat):
                for tool in tools:
                    row = runner(m, task, tool, args.device, hints)
                    runs[tool].append(row)
                    if row.is_flatcheck and row.error is None:
                        # peers get what flatcheck found where the comparison needs it (steps, boundaries)
                        hints.setdefault("steps", row.extra.get("steps"))
                        if "lo" in row.extra:
                            hints.setdefault("bounds", (row.extra["lo"], row.extra["hi"]))
                        hints = {k: v for k, v in hints.items() if v is not None}
                    log(f"  {m.key:<9} {task.title():<58} {row.tool:<24} "
                        + (f"{row.seconds:8.2f} s" if row.seconds is not None else " " * 10)
                        + (f"  (run {rep + 1}/{args.repeat})" if args.repeat > 1 else "")
                        + (f"  ERROR {row.error}" if row.error else ""))
            rows += [median_row(runs[tool]) for tool in tools]
    add_ratios(rows)
    machine = machine_info(args.device, args.threads)
    return models, rows, machine


# the number a flatcheck-only row is read for (its time is only part of it)
MEASURE = {"hvpgrad": ("ratio", "HVP ÷ gradient"), "block": ("speedup", "speed-up"),
           "ggn": ("exact_in_grads", "gradient-times")}


def median_row(runs: list[Row]) -> Row:
    """One tool's repetitions as one row: the run of median time (of median HVP ÷ gradient,
    speed-up or gradient-times for the rows read for those), the lower of the middle two for an
    even count; its peak memory raised to the largest of any run; every run's number and any
    failures go to the notes."""
    if len(runs) == 1:
        return runs[0]
    ok = [r for r in runs if r.error is None and r.seconds is not None]
    if not ok:
        return runs[0]
    key, label = MEASURE.get(ok[0].task_kind, ("", "time"))
    if not all(key in r.extra for r in ok):
        key, label = "", "time"

    def measure(r: Row) -> float:
        return r.extra[key] if key else r.seconds

    ok.sort(key=measure)
    row = ok[(len(ok) - 1) // 2]
    peaks = [r.peak_mib for r in ok if r.peak_mib is not None]
    row.peak_mib = max(peaks) if peaks else None
    values = [measure(r) for r in ok]
    row.extra["repeats"] = values
    unit = " s" if not key else ""
    what = (f"median {label} of {len(ok)} runs ({values[0]:.3g}–{values[-1]:.3g}{unit}), "
            "peak memory the largest")
    failed = [r.error for r in runs if r.error is not None]
    if failed:
        what += f"; {len(failed)} of {len(runs)} runs FAILED: {failed[0]}"
    row.notes = f"{row.notes}; {what}" if row.notes else what
    return row


def add_ratios(rows: list[Row]) -> None:
    """Peer rows: peer time ÷ flatcheck time for each flatcheck backend of the same task."""
    by_task: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        by_task.setdefault((r.model, r.task), []).append(r)
    for group in by_task.values():
        fc = [r for r in group if r.is_flatcheck and r.error is None and r.seconds]
        for r in group:
            if r.is_flatcheck or not r.seconds or not fc:
                continue
            r.extra["ratios"] = {f.tool: r.seconds / f.seconds for f in fc}
            if r.error is None and r.hvps and all(f.hvps for f in fc):
                r.extra["hvp_ratios"] = {f.tool: r.hvps / f.hvps for f in fc}


def machine_info(device: str, threads: int | None) -> dict:
    from flatcheck.api import resolve_device

    dev = resolve_device(device)
    name = str(dev)
    if dev.type == "cuda":
        name += f" ({torch.cuda.get_device_name(dev)})"
    else:
        name += f" ({platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs)"
    versions = {}
    for dist in ("flatcheck", "torch", "timm", *PEER_DISTS.values()):
        try:
            from importlib.metadata import version

            versions[dist] = version(dist)
        except Exception:  # noqa: BLE001
            versions[dist] = "not installed"
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "n/a"
    return {"device": name, "threads": threads or torch.get_num_threads(), "python": platform.python_version(),
            "load": load,
            "versions": versions, "date": _dt.datetime.now().isoformat(timespec="seconds")}


# ================================================================== output


COLUMNS = ("task", "tool", "time (s)", "HVPs", "value", "peer time ÷ flatcheck time", "peak mem (MiB)", "notes / error")


def cells(r: Row, first_of_task: bool) -> list[str]:
    ratios = r.extra.get("ratios") or {}
    ratio = " · ".join(f"{v:.2f}× vs {k.removeprefix('flatcheck')}" for k, v in ratios.items())
    hr = r.extra.get("hvp_ratios") or {}
    if hr and any(abs(v - 1) > 1e-9 for v in hr.values()):
        ratio += " (HVPs " + " · ".join(f"{v:.2g}×" for v in hr.values()) + ")"
    return [
        r.task if first_of_task else "",
        r.tool,
        "" if r.seconds is None else f"{r.seconds:.3g}",
        "" if r.hvps is None else str(r.hvps),
        "—" if r.error else r.value,
        ratio,
        "" if r.peak_mib is None else f"{r.peak_mib:,.0f}",
        f"FAILED: {r.error}" if r.error else r.notes,
    ]


def grouped(models: list[ModelCfg], rows: list[Row]):
    for m in models:
        mine = [r for r in rows if r.model == m.key]
        if not mine:
            continue
        out, last = [], None
        for r in mine:
            out.append(cells(r, r.task != last))
            last = r.task
        yield m, out


def print_tables(models, rows, machine, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(width=max(200, Console().width))
    for m, body in grouped(models, rows):
        t = Table(title=f"{m.title} · {machine['device']} · {machine['threads']} threads · torch "
                        f"{machine['versions']['torch']}", show_lines=False)
        for c in COLUMNS:
            t.add_column(c, justify="right" if c in ("time (s)", "HVPs", "peak mem (MiB)") else "left",
                         overflow="fold")
        last = None
        for cell_row, r in zip(body, [r for r in rows if r.model == m.key]):
            if last is not None and r.task != last:
                t.add_section()
            last = r.task
            t.add_row(*(escape(c) for c in cell_row), style="red" if r.error else None)
        console.print(t)
    s = summary(rows)
    if s:
        t = Table(title="key ratios against the targets of issue 7")
        for c in ("measure", "flatcheck backend", "result", "target"):
            t.add_column(c)
        for line in s:
            t.add_row(*(escape(c) for c in line))
        console.print(t)


def summary(rows: list[Row]) -> list[tuple[str, str, str, str]]:
    """The numbers issue 7's targets are stated in, per flatcheck backend."""
    out = []

    def find(model, kind, pred=lambda r: True):
        return [r for r in rows if r.model == model and r.task_kind == kind and pred(r)]

    for r in find("resnet18", "trace"):
        if r.is_flatcheck or r.error or "ratios" not in r.extra:
            continue
        eight = "8 batches" in r.task
        target = {("PyHessian", False): "≥ 1.5×", ("curvlinops", False): "≥ 5×",
                  ("PyHessian", True): "≥ 2×"}.get((r.tool, eight), "")
        for fc, v in r.extra["ratios"].items():
            out.append((f"ResNet-18 Hutchinson, {'8 batches' if eight else 'one batch'}: {r.tool} time ÷ flatcheck",
                        fc, f"{v:.2f}×", target))
    for r in find("demo", "eig"):
        if r.is_flatcheck and not r.error:
            k = 5 if "top-5" in r.task else 1
            peer = next((p for p in find("demo", "eig") if p.task == r.task and p.tool == "PyHessian"), None)
            if "float64" not in r.task:  # the CLI's batching: a time, not an HVP count, is the point
                if peer is not None and not peer.error:
                    out.append((f"demo top-{k} eigenvalue, {r.task.split('· ')[-1]}: PyHessian time ÷ flatcheck",
                                r.tool, f"{peer.seconds / r.seconds:.2f}× (HVPs {r.hvps} vs {peer.hvps})", ""))
                continue
            extra = ""
            if peer is not None and peer.hvps:
                extra = f" (PyHessian power: {peer.hvps}, {peer.hvps / r.hvps:.1f}× more)"
            out.append((f"demo top-{k} eigenvalue{'s' if k > 1 else ''}, float64, tol 1e-6: HVPs", r.tool,
                        f"{r.hvps}{extra}", "≤ 30" if k == 1 else "≤ 60"))
    for r in rows:
        if r.is_flatcheck and not r.error and r.task_kind == "hvpgrad":
            compiled = "compile" in r.tool
            out.append((f"{r.model} HVP ÷ gradient, {r.task.split('· ')[-1]}", r.tool, r.value,
                        "≤ 2 (on GPU)" if compiled else "≤ 3"))
        if r.is_flatcheck and not r.error and r.task_kind == "block":
            out.append((f"{r.model} 16-probe block vs loop, {r.task.split('· ')[-1]}", r.tool, r.value, "≥ 8×"))
        if r.is_flatcheck and not r.error and r.task_kind == "ggn":
            e = r.extra
            out.append((f"{r.model} exact Tr(GGN)", r.tool,
                        f"{e['exact_in_grads']:.1f} gradient-times; Hutchinson needs {e['probes_needed']} probes, "
                        f"exact {e['speedup']:.1f}× faster", "≤ 12 gradient-times"))
    return out


def markdown(models, rows, machine, command: str, repeat: int = 1) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    v = machine["versions"]
    lines = [
        "# flatcheck vs PyHessian, curvlinops, hessian-eigenthings",
        "",
        f"- command: `{command}`",
        f"- date: {machine['date']}",
        f"- device: {machine['device']}, {machine['threads']} torch threads, Python {machine['python']}; "
        f"load average at the end of the run {machine['load']} (other work on the machine slows every row)",
        "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        ("- one run" if repeat == 1 else f"- one run of {repeat} repetitions per row, the tools taking turns; each "
         "row shows its run of median time (of median ratio in the HVP ÷ gradient, block and GGN rows) and the "
         "largest peak memory of its runs") + "; time includes building each tool's operator (and PyHessian's kept graph, flatcheck's traced "
        "graph), not loading data or importing;",
        "  HVPs are whole-sample-set Hessian-vector products (in the total-only trace rows of flatcheck[autograd]: "
        "vᵀHv products, one per probe, as in every other trace row); peak memory is the rise during the timed work "
        "(RSS high-water mark on CPU, max_memory_allocated on CUDA).",
        "- ratio column: peer time ÷ flatcheck time (> 1: flatcheck faster), per flatcheck backend.",
        "",
    ]
    for m, body in grouped(models, rows):
        lines += [f"## {m.title}", "", "| " + " | ".join(COLUMNS) + " |",
                  "|" + "|".join("---:" if c in ("time (s)", "HVPs", "peak mem (MiB)") else "---" for c in COLUMNS) + "|"]
        lines += ["| " + " | ".join(esc(c) for c in cell_row) + " |" for cell_row in body]
        lines.append("")
    s = summary(rows)
    if s:
        lines += ["## Key ratios against the targets of issue 7", "",
                  "| measure | flatcheck backend | result | target |", "|---|---|---|---|"]
        lines += ["| " + " | ".join(esc(c) for c in line) + " |" for line in s]
        lines.append("")
    return "\n".join(lines)


def save(text: str, directory: Path, rows: list[Row]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "latest.md"
    for path, content in ((target, text), (directory / "latest.json", json.dumps([r.__dict__ for r in rows], indent=1,
                                                                                  default=str))):
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(content)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return target


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {text!r}")
    return int(text)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    ap.add_argument("--models", type=csv, default=["demo", "resnet18", "vit"], help="demo,resnet18,vit")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    ap.add_argument("--full", action="store_true", help="GPU-sized problems, and every peer on every task")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/latest.md (and .json)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--backends", type=csv, default=None, help="flatcheck backends (default: all but distributed)")
    ap.add_argument("--peers", type=csv, default=list(PEERS), help="pyhessian,curvlinops,eigenthings (or none)")
    ap.add_argument("--tasks", type=csv, default=None, help="trace,eig,slq,hvpgrad,block,ggn (default: all)")
    ap.add_argument("--repeat", type=positive_int, default=1,
                    help="run every row N times, tools taking turns, and report each tool's median time "
                         "(default 1)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--row-timeout", type=float, default=600.0, help="seconds before a row is stopped")
    ap.add_argument("--inline", action="store_true", help="run rows in this process (no per-row memory isolation)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    command = " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix() if argv is None else "bench_peers.py",
                                                *(sys.argv[1:] if argv is None else argv)])
    t0 = time.perf_counter()
    print(f"bench_peers: {', '.join(args.models)} on {args.device}{' (full)' if args.full else ''}", flush=True)
    models, rows, machine = run_all(args, log=lambda s: print(s, flush=True))
    print_tables(models, rows, machine)
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.save:
        path = save(markdown(models, rows, machine, command, args.repeat), args.results_dir, rows)
        print(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
