"""Achieved throughput of flatcheck's product loops: products per second, samples per second and
FLOP/s as a fraction of the device's float32 peak, on ViT-B/16 and ResNet-50 at ImageNet size.

The loops: trace by Hessian-vector products (route hvp) and by vᵀHv forward tangents (route
tangent, no per-layer parts), lmax (Lanczos), adaptive sharpness's second-order form
(Hutchinson on diag|w|·H·diag|w|) and mls's estimate route (Lanczos on J Jᵀ per sample). Each
runs through `flatcheck.measure`'s session at a fixed product count, timed by the probe's own
seconds (model build, data checks and the first CUDA context are outside; a warm-up run of the
same loop on a few samples comes first, so kernels are chosen and loaded before the clock).

FLOPs are counted by torch.utils.flop_counter.FlopCounterMode (matrix products, convolutions,
attention) over the same loop on the first n and 2n samples, then extrapolated to the timed
run, affine in the samples (a part per sample, a fixed part such as the vector algebra over the
parameters): per product for the Hessian loops, every product being one pass over every
sample; per run for mls, its products being per-sample Lanczos steps (the first samples' step
counts stand for the rest). The fraction is of the non-TF32 float32 peak (CUDA cores, dense), from PEAKS by
device name: a device not listed gets no fraction and the table says so. TF32 stays off, as
flatcheck's default (--allow-tf32), so the numbers are of exact float32.

    python benchmarks/bench_gpu_throughput.py --device cuda --samples 256 \\
        --out results/gpu_throughput.md --jsonl results/gpu_throughput.jsonl
    python benchmarks/bench_gpu_throughput.py --device cpu    # smoke: tiny models, seconds

On a GPU the batch is flatcheck's own choice (grown past 128 when the memory plan fits it)
unless --batch-size is given; the row records the batch used.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent

# non-TF32 float32 peak (dense, CUDA cores) by a substring of torch.cuda.get_device_name; the
# first that matches wins, so the PCIe and NVL variants come before the bare "H100" (SXM)
PEAKS: tuple[tuple[str, float, str], ...] = (
    ("H100 PCIe", 51.2e12, "H100 PCIe float32 (non-TF32)"),
    ("H100 NVL", 60.0e12, "H100 NVL float32 (non-TF32)"),
    ("H100", 66.9e12, "H100 SXM float32 (non-TF32)"),
    ("H200", 66.9e12, "H200 float32 (non-TF32), as H100 SXM"),
    ("A100", 19.5e12, "A100 float32 (non-TF32)"),
)


def peak_flops(device_name: str) -> tuple[float | None, str]:
    """(FLOP/s, which peak) for a device name; (None, why) for one not in PEAKS."""
    for key, flops, what in PEAKS:
        if key.lower() in device_name.lower():
            return flops, what
    return None, f"no float32 peak known for {device_name!r}: no fraction"


@dataclass(frozen=True)
class Loop:
    name: str
    probe: str
    options: dict[str, Any]
    per_product: bool = True  # FLOPs scale with products × samples (Hessian loops); else with samples

    def products(self, result) -> int:
        if self.per_product:
            return int(result.matvecs)
        return int(result.details.get("backward_passes", 0))


def loops(products: int, lanczos: int) -> tuple[Loop, ...]:
    """The product loops, each at a fixed count so that runs are comparable (no early stop)."""
    fixed = {"probes_max": products, "rtol": None}
    return (
        Loop("trace-hvp", "trace", {**fixed, "route": "hvp"}),
        Loop("trace-vhv", "trace", {**fixed, "route": "tangent", "parts": False}),
        Loop("lmax", "lmax", {"max_iter": products, "tol": 1e-12}),
        Loop("adaptive-sharpness-2nd", "adaptive-sharpness",
             {"method": "second-order", "probes_max": products}),
        Loop("mls-estimate", "mls", {"method": "estimate", "nmls": False, "lanczos_iters": lanczos,
                                       "projections": 2}, per_product=False),
    )


@dataclass(frozen=True)
class ModelCase:
    name: str
    build: Callable[[], Any]  # → nn.Module (eval, random weights)
    input_size: tuple[int, int, int]
    classes: int


def _timm(name: str, **kw):
    def build():
        import timm
        from timm.layers import set_fused_attn

        set_fused_attn(False)  # as `--model timm:NAME` builds it: fused attention has no double backward
        return timm.create_model(name, pretrained=False, **kw)
    return build


def _resnet50():
    from torchvision.models import resnet50

    return resnet50(weights=None, num_classes=1000)


def _small_resnet():
    from torchvision.models.resnet import BasicBlock, ResNet

    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, width_per_group=64)


REAL = (ModelCase("vit_base_patch16_224", _timm("vit_base_patch16_224", num_classes=1000), (3, 224, 224), 1000),
        ModelCase("resnet50", _resnet50, (3, 224, 224), 1000))
SMOKE = (ModelCase("test_vit", _timm("test_vit", num_classes=10, img_size=32), (3, 32, 32), 10),
         ModelCase("resnet_tiny", _small_resnet, (3, 16, 16), 10))


@dataclass
class Row:
    model: str
    loop: str
    device: str
    dtype: str
    samples: int
    batch: int | None = None
    batch_reason: str | None = None
    products: int | None = None
    seconds: float | None = None
    flops: float | None = None  # of the timed run, scaled from the counted ones
    # FlopCounterMode's counts: (samples, FLOPs, products) of each counted run
    counted: list[tuple[int, float, int]] = field(default_factory=list)
    peak_flops: float | None = None
    peak: str = ""
    peak_device_bytes: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def products_per_s(self) -> float | None:
        return None if not self.seconds or self.products is None else self.products / self.seconds

    @property
    def samples_per_s(self) -> float | None:
        """Samples through the loop per second: every product of a Hessian loop passes over every
        sample (samples × products); mls's Lanczos is per sample, so its samples once."""
        if not self.seconds:
            return None
        passes = self.products if self.extra.get("per_product", True) and self.products is not None else 1
        return self.samples * passes / self.seconds

    @property
    def flops_per_s(self) -> float | None:
        return None if not self.seconds or self.flops is None else self.flops / self.seconds

    @property
    def peak_fraction(self) -> float | None:
        rate = self.flops_per_s
        return None if rate is None or self.peak_flops is None else rate / self.peak_flops

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items()}
        d.update(products_per_s=self.products_per_s, samples_per_s=self.samples_per_s,
                 flops_per_s=self.flops_per_s, peak_fraction=self.peak_fraction)
        return d


def _data(case: ModelCase, n: int, device, dtype):
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, *case.input_size, generator=g).to(device=device, dtype=dtype)
    y = torch.randint(0, case.classes, (n,), generator=g).to(device)
    return x, y


def _session(model, data, loop: Loop, samples: int, batch: int | None, device, dtype: str):
    from flatcheck.live import open_live_session

    return open_live_session(model, data, probes={loop.probe: loop.options}, samples=samples, batch_size=batch,
                             device=device, dtype=dtype, seed=0)


def _run(session, loop: Loop):
    from flatcheck.api import run

    return run(session.config, None, session).results[loop.probe]


class _Global:
    """A module tracker that attributes every FLOP to the total only."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def flop_counter():
    """torch's FlopCounterMode, its formulas and total, without its per-module attribution: the
    module tracker's gradient hooks break autograd.grad(inputs=...) on a module's output,
    which mls's input Jacobians take."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    counter.mod_tracker = _Global()
    return counter


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_loop(case: ModelCase, model, loop: Loop, *, samples: int, batch: int | None, count_samples: int,
                 device, dtype: str, repeat: int) -> Row:
    """One row: FLOP-counted runs on `count_samples` and twice as many samples (the first is the
    warm-up), then `repeat` timed runs on `samples`; seconds are the median probe seconds."""
    import torch

    tdtype = getattr(torch, dtype)
    row = Row(case.name, loop.name, str(device), dtype, samples, extra={"per_product": loop.per_product})
    try:
        x, y = _data(case, samples, device, tdtype)
        counts = sorted({min(count_samples, samples), min(2 * count_samples, samples)})
        for n in counts:  # the first is also the warm-up
            small = _session(model, (x, y), loop, n, batch, device, dtype)
            with flop_counter() as counter:
                counted = _run(small, loop)
            row.counted.append((n, float(counter.get_total_flops()), loop.products(counted)))
            del small
        session = _session(model, (x, y), loop, samples, batch, device, dtype)
        row.batch = session.samples.batch_size
        row.batch_reason = session.data_info.get("batch_size_reason")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times, result = [], None
        for _ in range(repeat):
            _sync(device)
            result = _run(session, loop)
            _sync(device)
            times.append(result.seconds)
        row.seconds = statistics.median(times)
        row.products = loop.products(result)
        row.extra.update(value=result.value, stderr=result.stderr, seconds_each=times)
        row.flops = scaled_flops(row.counted, samples, row.products, loop.per_product)
        if device.type == "cuda":
            row.peak_device_bytes = torch.cuda.max_memory_allocated(device)
    except Exception as exc:  # noqa: BLE001 - a row records what went wrong; the next loop runs
        row.error = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    return row


def scaled_flops(counted: list[tuple[int, float, int]], samples: int, products: int,
                 per_product: bool) -> float | None:
    """The timed run's FLOPs from counted runs (samples, FLOPs, products), affine in the
    samples: a part per sample (the products' passes) and a fixed part (vector algebra over
    the parameters, a per-run setup). Per product for a Hessian loop, whose products each pass
    over every sample; per run for a per-sample one (mls). One count is taken as all per
    sample; two give both parts, and a count at `samples` itself is the answer."""
    points = [(n, f / p if per_product else f) for n, f, p in counted if p > 0 or not per_product]
    if not points:
        return None
    unit = products if per_product else 1
    exact = [f for n, f in points if n == samples]
    if exact:
        return exact[0] * unit
    if len(points) == 1:
        n, f = points[0]
        return f / n * samples * unit
    (n1, f1), (n2, f2) = points[0], points[-1]
    per = (f2 - f1) / (n2 - n1)
    return (f1 + per * (samples - n1)) * unit


def compile_costs(case: ModelCase, model, *, samples: int, batch: int | None, device, dtype: str, repeat: int = 3,
                  planned: int = 100) -> dict[str, Any]:
    """Seconds of one HVP (one vector over every sample) by the autograd backend, the func
    backend eager and compiled, and the compile time (the first compiled call less a later
    one): the costs `--backend func --compile` is chosen by, with the choice at `planned`
    products (flatcheck.backends.compile_choice)."""
    import torch

    from flatcheck.backends import create_backend
    from flatcheck.backends.compile_choice import compile_pays

    row: dict[str, Any] = {"model": case.name, "samples": samples, "device": str(device), "dtype": dtype,
                           "planned_products": planned}
    try:
        x, y = _data(case, samples, device, getattr(torch, dtype))
        session = _session(model, (x, y), loops(2, 2)[0], samples, batch, device, dtype)
        problem = session.backend.problem
        row["batch"] = session.samples.batch_size
        V = torch.randn(1, problem.layout.dim, generator=torch.Generator().manual_seed(0),
                        dtype=getattr(torch, dtype)).to(device)

        def seconds(backend, calls: int) -> list[float]:
            out = []
            for _ in range(calls):
                _sync(device)
                start = time.perf_counter()
                backend.hvp(V)
                _sync(device)
                out.append(time.perf_counter() - start)
            return out

        row["autograd_s"] = statistics.median(seconds(session.backend, repeat + 1)[1:])
        row["func_eager_s"] = statistics.median(seconds(create_backend("func", problem), repeat + 1)[1:])
        compiled = create_backend("func", problem, compile=True)
        first = seconds(compiled, 1)[0]
        row["func_compiled_s"] = statistics.median(seconds(compiled, repeat))
        row["compile_s"] = max(0.0, first - row["func_compiled_s"])
        row["compile_error"] = compiled.compile_error
        # compiling must beat the product that would run otherwise: the faster eager route
        route = min(("autograd", row["autograd_s"]), ("func", row["func_eager_s"]), key=lambda r: r[1])
        choice = compile_pays(device_type=device.type, planned_products=planned, eager_seconds=route[1],
                              compiled_seconds=None if compiled.compile_error else row["func_compiled_s"],
                              compile_seconds=row["compile_s"], eager_route=route[0])
        row.update(compile_chosen=choice.compile, reason=choice.reason)
    except Exception as exc:  # noqa: BLE001 - a row records what went wrong
        row["error"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
    return row


def compile_table(rows: list[dict[str, Any]]) -> list[str]:
    fmt = lambda v, f="{:.4g}": "" if v is None else f.format(v)  # noqa: E731
    lines = ["", "One HVP (one vector over every sample), seconds: autograd, func eager, func compiled; the compile "
             "time is the first compiled call less a later one.", "",
             "| model | samples | batch | autograd s | func eager s | func compiled s | compile s | compile chosen "
             "| reason |", "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['samples']} | {fmt(r.get('batch'), '{}')} | {fmt(r.get('autograd_s'))} | "
                     f"{fmt(r.get('func_eager_s'))} | {fmt(r.get('func_compiled_s'))} | {fmt(r.get('compile_s'))} | "
                     f"{fmt(r.get('compile_chosen'), '{}')} | "
                     f"{(r.get('error') or r.get('compile_error') or r.get('reason') or '').replace('|', '/')[:200]} |")
    return lines


def table(rows: list[Row], args, device_name: str, peak: str) -> list[str]:
    import torch

    fmt = lambda v, f="{:.3g}": "" if v is None else f.format(v)  # noqa: E731
    lines = [
        f"# Product-loop throughput, {device_name}",
        "",
        f"`python benchmarks/bench_gpu_throughput.py {' '.join(args.argv)}`; torch {torch.__version__}, "
        f"{args.dtype}, TF32 {'on' if args.allow_tf32 else 'off'}. Random weights; synthetic inputs. "
        f"{args.products} products per Hessian loop (fixed count), mls at {args.lanczos} Lanczos steps at most per "
        f"sample. Seconds: the probe's own, median of {args.repeat}. FLOPs: FlopCounterMode over the same loop on "
        f"the first {args.count_samples} and {2 * args.count_samples} samples, extrapolated (affine in samples) to the "
        f"timed run. Peak: {peak}. samples/s: samples × products per second for a Hessian loop (each product "
        "passes over every sample), samples per second for mls (each sample's Lanczos is its own).",
        "",
        "| model | loop | samples | batch | products | seconds | products/s | samples/s | TFLOP/s | of peak "
        "| peak device (GB) | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        rate = r.flops_per_s
        note = r.error or (r.batch_reason or "")
        lines.append(f"| {r.model} | {r.loop} | {r.samples} | {fmt(r.batch, '{}')} | {fmt(r.products, '{}')} | "
                     f"{fmt(r.seconds, '{:.3f}')} | {fmt(r.products_per_s)} | {fmt(r.samples_per_s)} | "
                     f"{fmt(None if rate is None else rate / 1e12)} | "
                     f"{fmt(r.peak_fraction, '{:.1%}') or ('n/a' if r.error is None else '')} | "
                     f"{fmt(None if r.peak_device_bytes is None else r.peak_device_bytes / 1e9, '{:.2f}')} | "
                     f"{note.replace('|', '/')[:160]} |")
    return lines


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (ViT-B/16 and ResNet-50) or cpu (a smoke run on "
                    "timm's test_vit and a one-block ResNet)")
    ap.add_argument("--models", default=None, help="model names to run, comma-separated [default: all of the "
                    "device's set]")
    ap.add_argument("--loops", default=None, help="loop names to run, comma-separated [default: all]")
    ap.add_argument("--samples", type=int, default=None, help="samples per timed run [default: 256 on cuda, 8 on cpu]")
    ap.add_argument("--batch-size", type=int, default=None, help="[default: flatcheck's own choice]")
    ap.add_argument("--products", type=int, default=None, help="products per Hessian loop [default: 20 cuda, 3 cpu]")
    ap.add_argument("--lanczos", type=int, default=None, help="most Lanczos steps per sample for mls "
                    "[default: 20 cuda, 3 cpu]")
    ap.add_argument("--count-samples", type=int, default=None, help="samples of the first FLOP-counted run (the "
                    "second takes twice as many) "
                    "[default: 8 cuda, 2 cpu]")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per loop (median)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--allow-tf32", action="store_true", help="TF32 matrix products (off: exact float32)")
    ap.add_argument("--compile-costs", action="store_true", help="instead of the loops: one HVP's seconds by "
                    "autograd, func eager and func compiled, the compile time, and whether --compile pays at 100 "
                    "products")
    ap.add_argument("--out", type=Path, default=None, help="markdown table [default: none]")
    ap.add_argument("--jsonl", type=Path, default=None, help="one JSON line per row [default: none]")
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    for name, gpu, cpu in (("samples", 256, 8), ("products", 20, 3), ("lanczos", 20, 3), ("count_samples", 8, 2)):
        if getattr(args, name) is None:
            setattr(args, name, gpu if cuda else cpu)
    args.argv = argv
    return args


def _pick(items: tuple, names: str, flag: str) -> tuple:
    """The items `names` (comma-separated) lists, in their own order; an unknown name exits."""
    wanted = names.split(",")
    known = [item.name for item in items]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"bench_gpu_throughput: {flag} {','.join(unknown)}: unknown here; known: {', '.join(known)}")
    return tuple(item for item in items if item.name in wanted)


def main(argv: list[str] | None = None) -> list:
    import torch

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("bench_gpu_throughput: --device cuda, but CUDA is not available here")
        torch.backends.cuda.matmul.allow_tf32 = args.allow_tf32
        torch.backends.cudnn.allow_tf32 = args.allow_tf32
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = f"{platform.processor() or platform.machine()} CPU ({os.cpu_count()} cores)"
    peak, peak_what = peak_flops(device_name) if device.type == "cuda" else (None, "none for a CPU: no fraction")
    if args.dtype != "float32" or args.allow_tf32:
        peak, peak_what = None, f"the float32 peak does not apply to {args.dtype}{' with TF32' if args.allow_tf32 else ''}: no fraction"
    cases = REAL if device.type == "cuda" else SMOKE
    if args.models:
        cases = _pick(cases, args.models, "--models")
    chosen = loops(args.products, args.lanczos)
    if args.loops:
        chosen = _pick(chosen, args.loops, "--loops")
    rows: list[Row] = []
    costs: list[dict[str, Any]] = []
    for case in cases:
        torch.manual_seed(0)
        model = case.build().to(device=device, dtype=getattr(torch, args.dtype)).eval()
        if args.compile_costs:
            costs.append(compile_costs(case, model, samples=args.samples, batch=args.batch_size, device=device,
                                       dtype=args.dtype, repeat=args.repeat + 2))
            print(f"{case.name}: {costs[-1]}", file=sys.stderr, flush=True)
            text = "\n".join([f"# The costs --compile is chosen by, {device_name}", *compile_table(costs)]) + "\n"
            if args.out is not None:
                _write(args.out, text)
            if args.jsonl is not None:
                _write(args.jsonl, "".join(json.dumps(r, default=str) + "\n" for r in costs))
            print(text)
            continue
        for loop in chosen:
            row = measure_loop(case, model, loop, samples=args.samples, batch=args.batch_size,
                               count_samples=args.count_samples, device=device, dtype=args.dtype, repeat=args.repeat)
            row.peak_flops, row.peak = peak, peak_what
            rows.append(row)
            print(f"{case.name} {loop.name}: " + (row.error or f"{row.products} products in {row.seconds:.3f} s, "
                  f"{(row.flops_per_s or math.nan) / 1e12:.3g} TFLOP/s, batch {row.batch}"), file=sys.stderr, flush=True)
            if args.jsonl is not None:
                _write(args.jsonl, "".join(json.dumps(r.to_dict(), default=str) + "\n" for r in rows))
            if args.out is not None:
                _write(args.out, "\n".join(table(rows, args, device_name, peak_what)) + "\n")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.compile_costs:
        return costs
    print("\n".join(table(rows, args, device_name, peak_what)))
    return rows


if __name__ == "__main__":
    main()
