"""Every registered probe on ImageNet-sized timm ViTs (random weights, 224 px, 1,000 classes) on
this machine: seconds and peak resident memory of each run, at two sample counts so the fixed
cost (model build, first forward, tracing) shows apart from the per-sample one.

Each run is its own `flatcheck probe` process under an address-space cap (RLIMIT_AS, as
`ulimit -v` sets it); its peak RSS is the child's ru_maxrss from wait4, so a run the kernel or
the cap kills still has its row. Rows are written to the table as they finish (a partial table
is still a table), atomically.

    OMP_NUM_THREADS=1 python benchmarks/bench_realsize.py --models vit_tiny_patch16_224 \\
        --samples 4,8 --cap-gb 12 --timeout 3600

Models run one at a time, probes one at a time: others share this machine.

On a GPU (`--device cuda`) every probe of one (model, sample count) runs in one child process,
one after another through `flatcheck.measure`: a process start (torch, timm, CUDA context)
costs seconds there, more than most probes, and the figure that matters is the device memory,
which torch.cuda.max_memory_allocated gives per probe within one process. Each probe's row
is a line the child prints as it finishes, so a child that times out keeps the rows before.

    python benchmarks/bench_realsize.py --device cuda --samples 8,32 --timeout 120 \
        --out results/realsize_vit_gpu.md --jsonl results/realsize_vit_gpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224")
# (row name, probe, -o options): the defaults, except the exact GGN trace with sampled classes
# (every class would be 1,000 reverse passes per sample) and head-trace without --verify
RUNS = (
    ("activations", "activations", ()),
    ("adaptive-sharpness", "adaptive-sharpness", ()),
    ("decomposition", "decomposition", ()),
    ("gap", "gap", ()),
    ("gini", "gini", ()),
    ("head-trace", "head-trace", ()),
    ("jacobian", "jacobian", ()),
    ("lmax", "lmax", ()),
    ("mls", "mls", ()),
    ("rank", "rank", ()),
    ("relative-flatness", "relative-flatness", ()),
    ("spectrum", "spectrum", ()),
    ("trace", "trace", ()),
    ("trace exact GGN (8 classes)", "trace", ("trace.estimator=exact", "trace.class_samples=8")),
)


def preset_runs(name: str) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """The rows of a scan preset: its probes with the preset's options (`scan --preset NAME`)."""
    from flatcheck.workflows.presets import preset

    p = preset(name)
    return tuple((f"{probe} ({name})", probe, tuple(o for o in p.options
                                                     if o.startswith(probe + ".")))
                 for probe in p.probes.split(","))


def command(model: str, probe: str, options: tuple[str, ...], samples: int, batch: int, out: Path,
            budget: float | None = None, max_memory: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "flatcheck", "probe", "--probes", probe, "--model", f"timm:{model}",
           "--random-init", "--num-classes", "1000", "--input-size", "3,224,224", "--data", "synthetic",
           "--samples", str(samples), "--batch-size", str(batch), "--json", str(out), "-q"]
    for o in options:
        cmd += ["-o", o]
    if budget is not None:
        cmd += ["--budget", f"{budget:g}"]
    if max_memory is not None:
        cmd += ["--max-memory", max_memory]
    return cmd


def run_one(cmd: list[str], cap_bytes: int, timeout: float) -> dict:
    """Run `cmd` as a child under RLIMIT_AS = cap; its seconds, exit status and ru_maxrss."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit, env=env,
                            start_new_session=True)
    deadline = start + timeout
    status, usage, timed_out = None, None, False
    while status is None:
        pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status, usage = st, ru
            break
        if time.perf_counter() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            timed_out = True
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.5)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace").strip().splitlines() if proc.stderr else []
    return {"seconds": seconds, "peak_rss_bytes": usage.ru_maxrss * 1024, "exit": proc.returncode,
            "timed_out": timed_out, "error": err[-1] if proc.returncode and err else None}


def headline(path: Path, probe: str) -> dict:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    res = report.get("results", {}).get(probe, {})
    d = res.get("details") or {}
    memory = d.get("memory") or {}
    return {"value": res.get("value"), "stderr": res.get("stderr"), "route": d.get("route") or d.get("method"),
            "stop_reason": d.get("stop_reason"), "planned_vector_bytes": memory.get("stored_vector_bytes"),
            "reorthogonalization": memory.get("reorthogonalization")}


def planned(row: dict) -> str:
    """The stored vectors the probe planned for its whole run (details.memory), in GB: what a
    budget-stopped Lanczos run would have grown to; with the route when the basis was dropped."""
    b = row.get("planned_vector_bytes")
    if b is None:
        return ""
    return f"{b / 1e9:.2f}" + (" (no re-orth.)" if row.get("reorthogonalization") == "none" else "")


def device_table(rows: list[dict], args) -> list[str]:
    """The GPU table: device memory per probe (torch.cuda.max_memory_allocated, the model and
    data resident before any probe counted in), seconds of the probe alone (no process start)."""
    import torch

    name = torch.cuda.get_device_name(torch.device(args.device)) if torch.cuda.is_available() else args.device
    lines = [
        f"# Every probe on timm ViTs at ImageNet size (random weights, 224 px, 1,000 classes), {name}",
        "",
        f"`python benchmarks/bench_realsize.py --device {args.device} --models {args.models} --samples {args.samples} "
        f"--batch-size {args.batch_size} --timeout {args.timeout:g}"
        f"{f' --preset {args.preset}' if getattr(args, 'preset', None) else ''}"
        f"{f' --project {args.project}' if getattr(args, 'project', None) else ''}`; torch {torch.__version__}. One process per model and sample "
        "count runs the probes one after another through `flatcheck.measure` (float32, batch "
        f"{args.batch_size}, defaults except: trace exact GGN with 8 sampled classes; head-trace without --verify). "
        "Seconds are the probe's own, synchronised, without the process start, model build or first CUDA "
        "context; 'peak device' is max_memory_allocated during the probe, the model and samples included "
        "('resident' before any probe). Random-init models: iterative probes' step counts may differ on pretrained "
        "ones.",
        "",
        "| model | probe | samples | batch | seconds | peak device (GB) | resident (GB) | exit | route | value | stderr | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
        note = "timeout" if r["timed_out"] else (r["error"] or r.get("stop_reason") or "")
        gb = lambda k: "" if r.get(k) is None else f"{r[k] / 1e9:.2f}"  # noqa: E731
        lines.append(f"| {r['model']} | {r['row']} | {r['samples']} | {fmt(r.get('batch_size'))} | {r['seconds']:.2f} | "
                     f"{gb('peak_device_bytes')} | "
                     f"{gb('resident_device_bytes')} | {r['exit']} | {fmt(r.get('route'))} | {fmt(r.get('value'))} | "
                     f"{fmt(r.get('stderr'))} | {str(note).replace('|', '/')[:160]} |")
    return lines + projection_table(rows, getattr(args, "project", 1000))


def write_table(rows: list[dict], path: Path, args) -> None:
    if getattr(args, "device", "cpu") != "cpu":
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(device_table(rows, args)) + "\n")
        os.replace(tmp, path)
        return
    lines = [
        "# Every probe on timm ViTs at ImageNet size (random weights, 224 px, 1,000 classes), this CPU",
        "",
        f"`python benchmarks/bench_realsize.py --samples {args.samples} --batch-size {args.batch_size} "
        f"--cap-gb {args.cap_gb}"
        f"{'' if args.budget is None else f' --budget {args.budget:g}'}"
        f"{'' if args.max_memory is None else f' --max-memory {args.max_memory}'}`; one `flatcheck probe` process per row, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', '?')}, address space capped at {args.cap_gb} GB (RLIMIT_AS), "
        f"per-run timeout {args.timeout:.0f} s. Peak RSS is the child's ru_maxrss. {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores shared with other work, so seconds are upper bounds of an idle machine's.",
        "Defaults everywhere except: trace exact GGN with 8 sampled classes per sample; head-trace without --verify. "
        "Rows with a budget ran with `--budget` (column 'budget'): an iterative probe stopped by it (note "
        "'budget') did not run its default, and its peak memory is what it reached; 'planned vectors' is what "
        "its stored vectors (Lanczos basis, probe blocks) take over the whole default run, planned up front "
        "against --max-memory.",
        "",
        "| model | probe | samples | budget s | seconds | peak RSS (GB) | planned vectors (GB) | exit | route | value "
        "| stderr | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        fmt = lambda v: "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))  # noqa: E731
        note = "timeout" if r["timed_out"] else (r["error"] or r.get("stop_reason") or "")
        lines.append(f"| {r['model']} | {r['row']} | {r['samples']} | {fmt(r.get('budget')) or '–'} | {r['seconds']:.1f} | "
                     f"{r['peak_rss_bytes'] / 1e9:.2f} | {planned(r)} | {r['exit']} | {fmt(r.get('route'))} | {fmt(r.get('value'))} | "
                     f"{fmt(r.get('stderr'))} | {note.replace('|', '/')[:160]} |")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)


def agreement(path: Path) -> None:
    """The goals' checks on models small enough for ground truth, float64: normalized MLS of the
    matrix-free route against the exact route on timm's test_vit at 1,000 classes, and
    adaptive sharpness against the dense (ρ²/2)·Tr(diag|w| H diag|w|) and a many-draw Monte Carlo."""
    import math

    import timm
    import torch
    from torch import nn
    from torch.func import functional_call, hessian

    import flatcheck

    torch.manual_seed(0)
    lines = ["# Agreement checks behind realsize_vit.md (float64, models small enough for ground truth)", ""]
    vit = timm.create_model("test_vit", num_classes=1000, img_size=32, pretrained=False).double().eval()
    x, y = torch.randn(4, 3, 32, 32, dtype=torch.float64), torch.randint(0, 1000, (4,))
    ex = flatcheck.measure(vit, (x, y), probes="mls", options={"mls": {"method": "exact"}}).results["mls"].details
    es = flatcheck.measure(vit, (x, y), probes="mls", options={"mls": {"method": "estimate"}}).results["mls"].details
    lines += ["timm test_vit (32 px, 1,000 classes, random weights), 4 samples, mls exact vs estimate (defaults):", "",
              "| quantity | exact | estimate | reported error | |diff| / error |", "|---|---:|---:|---:|---:|"]
    for key, err in (("mls", "mls_error_bound"), ("normalized_mls", "normalized_mls_error_bound"),
                     ("nmls", "nmls_error_bound"), ("local_dimensionality", "local_dimensionality_stderr")):
        diff = abs(ex[key] - es[key])
        lines.append(f"| {key} | {ex[key]:.8g} | {es[key]:.8g} | {es[err]:.3g} ({err.rsplit('_', 1)[-1]}) | "
                     f"{diff / es[err] if es[err] else float('inf'):.3g} |")
    # adaptive sharpness: dense Hessian diagonal of a small MLP in float64
    mlp = nn.Sequential(nn.Linear(16, 24), nn.Tanh(), nn.Linear(24, 10)).double()
    xs, ys = torch.randn(64, 16, dtype=torch.float64), torch.randint(0, 10, (64,))
    names = [n for n, _ in mlp.named_parameters()]
    w0 = torch.cat([p.detach().reshape(-1) for p in mlp.parameters()])
    shapes = [p.shape for p in mlp.parameters()]

    def loss(theta):
        parts = dict(zip(names, (t.view(s) for t, s in zip(theta.split([math.prod(s) for s in shapes]), shapes))))
        return nn.functional.cross_entropy(functional_call(mlp, parts, (xs,)), ys)

    rho = 5e-4
    dense = rho**2 / 2 * (w0.pow(2) * torch.diagonal(hessian(loss)(w0))).sum().item()
    g = torch.Generator().manual_seed(1)
    draws = 20000
    base = loss(w0).item()
    vals = torch.empty(draws, dtype=torch.float64)
    with torch.no_grad():
        for i in range(draws):
            d = torch.randn(w0.shape, generator=g, dtype=torch.float64) * rho * w0.abs()
            vals[i] = 0.5 * (loss(w0 + d) + loss(w0 - d)) - base
    mc, mc_se = vals.mean().item(), vals.std().item() / math.sqrt(draws)
    res = flatcheck.measure(mlp, (xs, ys), probes="adaptive-sharpness",
                            options={"adaptive-sharpness": {"rho": rho}}).results["adaptive-sharpness"]
    route = res.details.get("route")
    lines += ["", f"adaptive sharpness, MLP 16-24-10 (tanh, {w0.numel()} parameters), 64 samples, ρ = {rho:g}, "
              "cross entropy, float64:", "",
              "| what | value | stderr | |diff to dense| / stderr |", "|---|---:|---:|---:|",
              f"| dense (ρ²/2)·Σ w_i² H_ii | {dense:.6g} | exact | |",
              f"| Monte Carlo, {draws} ± pairs | {mc:.6g} | {mc_se:.3g} | {abs(mc - dense) / mc_se:.3g} |",
              f"| flatcheck adaptive-sharpness (defaults; headline route {route}) | {res.value:.6g} | "
              f"{res.stderr:.3g} | {abs(res.value - dense) / res.stderr:.3g} |"]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
    print("\n".join(lines))


def child(model_name: str, samples: int, batch: "int | str", device: str, wanted: set[str] | None,
          runs=RUNS) -> None:
    """--child: every row of RUNS on one model in this process, one JSON line per probe."""
    import timm
    import torch

    import flatcheck

    from timm.layers import set_fused_attn

    dev = torch.device(device)
    torch.manual_seed(0)
    set_fused_attn(False)  # as `--model timm:NAME` builds it: fused attention has no double backward
    model = timm.create_model(model_name, pretrained=False, num_classes=1000).to(dev).eval()
    size = (3, 224, 224) if "224" in model_name else tuple(model.pretrained_cfg["input_size"])
    x, x_test = torch.randn(2, samples, *size, device=dev)
    y, y_test = torch.randint(0, 1000, (2, samples), device=dev)
    base = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
    for name, probe, options in runs:
        if wanted is not None and name not in wanted:
            continue
        opts = dict(o.split(".", 1)[1].split("=", 1) for o in options)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        start = time.perf_counter()
        row = {"model": model_name, "row": name, "samples": samples, "device": device}
        try:
            report = flatcheck.measure(model, (x, y), probes={probe: opts},
                                       batch_size=None if batch == "auto" else batch,
                                       device="cpu" if dev.type == "cpu" else dev, test_data=(x_test, y_test))
            res = report.results[probe]
            row["batch_size"] = report.meta["data"].get("batch_size")
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            d = res.details or {}
            memory = d.get("memory") or {}
            row.update(exit=0, error=None, value=res.value, stderr=res.stderr, matvecs=res.matvecs,
                       probe_seconds=res.seconds,
                       route=d.get("route") or d.get("method"), stop_reason=d.get("stop_reason"),
                       planned_vector_bytes=memory.get("stored_vector_bytes"),
                       reorthogonalization=memory.get("reorthogonalization"))
        except Exception as exc:  # noqa: BLE001 - a row records what went wrong and the next probe runs
            row.update(exit=1, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        row["seconds"] = time.perf_counter() - start
        row["timed_out"] = False
        row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if dev.type == "cuda":
            row["peak_device_bytes"] = torch.cuda.max_memory_allocated(dev)
            row["resident_device_bytes"] = base
            torch.cuda.empty_cache()
        print(json.dumps(row, default=str), flush=True)


def batch_arg(text: str) -> "int | str":
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or auto, got {text!r}")
    return value


def projection(rows: list[dict], samples: int) -> list[dict]:
    """Each (model, probe)'s seconds at `samples`, from its rows at the two smallest sample
    counts that ran (exit 0): seconds = fixed + per-sample × n, a line through both. A
    probe whose cost is not linear in the samples (iterations that vary) is projected as if
    it were; the rows it rests on are named."""
    done: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        if r.get("exit") == 0 and r.get("seconds") is not None:
            done.setdefault((r["model"], r["row"]), {})[int(r["samples"])] = float(r["seconds"])
    out = []
    for (model, probe), at in done.items():
        if len(at) < 2:
            continue
        (n1, s1), (n2, s2) = sorted(at.items())[:2]
        per = (s2 - s1) / (n2 - n1)
        out.append({"model": model, "row": probe, "from": (n1, n2), "fixed_s": s1 - per * n1, "per_sample_s": per,
                    "samples": samples, "projected_s": s1 + per * (samples - n1)})
    return out


def projection_table(rows: list[dict], samples: int) -> list[str]:
    proj = projection(rows, samples)
    if not proj:
        return []
    lines = ["", f"Projected to {samples:,} samples (a line through each probe's two smallest sample counts):", "",
             "| model | probe | from samples | fixed s | s per sample | projected s | projected min |",
             "|---|---|---|---:|---:|---:|---:|"]
    for p in proj:
        lines.append(f"| {p['model']} | {p['row']} | {p['from'][0]}, {p['from'][1]} | {p['fixed_s']:.2f} | "
                     f"{p['per_sample_s']:.4f} | {p['projected_s']:.0f} | {p['projected_s'] / 60:.1f} |")
    by_model: dict[str, float] = {}
    for p in proj:
        by_model[p["model"]] = by_model.get(p["model"], 0.0) + p["projected_s"]
    for model, total in by_model.items():
        lines.append(f"| {model} | **all rows above** | | | | {total:.0f} | {total / 60:.1f} |")
    return lines


def run_children(args, rows: list[dict], done: set) -> None:
    """--device cuda: one child per (model, sample count); rows as each probe finishes."""
    wanted = None if args.probes is None else args.probes
    for model in args.models.split(","):
        for samples in (int(s) for s in args.samples.split(",")):
            names = [n for n, _, _ in args.runs if (wanted is None or n in wanted.split(",")) and (model, n, samples) not in done]
            if not names:
                continue
            cmd = [sys.executable, __file__, "--child", model, "--samples", str(samples), "--batch-size",
                   str(args.batch_size), "--device", args.device, "--probes", ",".join(names)]
            if args.preset:
                cmd += ["--preset", args.preset]
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            # rows are kept as the child prints them, so an outer time limit that ends this process
            # (SIGTERM from `timeout`) still leaves every finished probe's row, and takes the child along
            got: list[dict] = []
            errs: list[str] = []

            def keep(row: dict) -> None:
                row.update(budget=None, max_memory=None)
                got.append(row)
                rows.append(row)
                with args.jsonl.open("a") as fh:
                    fh.write(json.dumps(row, default=str) + "\n")
                write_table(rows, args.out, args)
                print(f"{model} {row['row']} n={samples}: {row['seconds']:.1f} s, "
                      f"{row.get('peak_device_bytes', 0) / 1e9:.2f} GB device, exit {row['exit']}", flush=True)

            def stop(signum, frame):  # noqa: ARG001
                os.killpg(proc.pid, signal.SIGKILL)
                raise SystemExit(128 + signum)

            old = signal.signal(signal.SIGTERM, stop)
            reader = threading.Thread(target=lambda: [keep(json.loads(line)) for line in proc.stdout
                                                      if line.startswith("{")], daemon=True)
            drain = threading.Thread(target=lambda: errs.extend(proc.stderr), daemon=True)
            reader.start()
            drain.start()
            try:
                proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            finally:
                signal.signal(signal.SIGTERM, old)
            reader.join()
            drain.join()
            seen = {r["row"] for r in got}
            for n in names:  # what the child did not reach: timed out, or the child died
                if n not in seen:
                    keep({"model": model, "row": n, "samples": samples, "device": args.device,
                          "seconds": time.perf_counter() - start, "peak_rss_bytes": 0, "exit": proc.returncode,
                          "timed_out": proc.returncode == -signal.SIGKILL,
                          "error": ("".join(errs).strip().splitlines() or ["not reached"])[-1][:200]})
                    break


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agreement", action="store_true", help="only the small-model agreement checks "
                    "(results/realsize_agreement.md)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--probes", default=None, help="row names to run (comma-separated) [default: all]")
    ap.add_argument("--samples", default="4,8", help="sample counts, comma-separated")
    ap.add_argument("--batch-size", type=batch_arg, default=8, help="samples per batch, or auto: flatcheck's own "
                    "choice (128, grown on a GPU when the memory plan fits more; --device cuda only)")
    ap.add_argument("--project", type=int, default=1000, help="on a GPU, project each probe's seconds to this many "
                    "samples from its two smallest sample counts (fixed + per-sample cost)")
    ap.add_argument("--cap-gb", type=float, default=12.0, help="RLIMIT_AS of each run, GB (10^9 bytes)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is killed")
    ap.add_argument("--budget", type=float, default=None, help="--budget SECONDS for each run: iterative probes "
                    "stop early (stop_reason budget), so a row's seconds are not its default's; peak memory of a "
                    "probe whose stored vectors grow with its steps is then a lower bound [default: none]")
    ap.add_argument("--max-memory", default=None, help="--max-memory for each run [default: the probes' own, "
                    "half the free memory]")
    ap.add_argument("--device", default="cpu", help="cpu (one `flatcheck probe` process per row, under the "
                    "address cap) or cuda (one process per model and sample count, device memory per probe)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--preset", default=None, help="only a scan preset's probes, with its options "
                    "(mls-vs-sharpness): what a family scan costs per model")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "realsize_vit.md")
    ap.add_argument("--jsonl", type=Path, default=HERE / "results" / "realsize_vit.jsonl")
    args = ap.parse_args()
    if args.agreement:
        agreement(HERE / "results" / "realsize_agreement.md")
        return
    args.runs = RUNS if args.preset is None else preset_runs(args.preset)
    if args.batch_size == "auto" and args.device == "cpu" and not args.child:
        ap.error("--batch-size auto is for --device cuda (the CPU rows run `flatcheck probe`, which takes a number)")
    if args.child:
        child(args.child, int(args.samples), args.batch_size, args.device,
              None if args.probes is None else set(args.probes.split(",")), args.runs)
        return
    wanted = None if args.probes is None else set(args.probes.split(","))
    rows: list[dict] = []
    if args.jsonl.exists():  # resume: keep what an earlier, interrupted run measured
        rows = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()]
    done = {(r["model"], r["row"], r["samples"]) for r in rows}
    if args.device != "cpu":
        run_children(args, rows, done)
        return
    cap = int(args.cap_gb * 1e9)
    for model in args.models.split(","):
        for name, probe, options in args.runs:
            if wanted is not None and name not in wanted:
                continue
            for samples in (int(s) for s in args.samples.split(",")):
                if (model, name, samples) in done:
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    out = Path(tmp) / "report.json"
                    row = {"model": model, "row": name, "samples": samples, "budget": args.budget,
                           "max_memory": args.max_memory,
                           **run_one(command(model, probe, options, samples, args.batch_size, out, args.budget,
                                           args.max_memory), cap, args.timeout),
                           **headline(out, probe)}
                rows.append(row)
                with args.jsonl.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
                write_table(rows, args.out, args)
                print(f"{model} {name} n={samples}: {row['seconds']:.1f} s, {row['peak_rss_bytes'] / 1e9:.2f} GB, "
                      f"exit {row['exit']}", flush=True)
    # another run may append to the same --jsonl (two cores, two streams of rows): the table ends
    # with every row the file holds, not only this run's
    rows = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()] \
        if args.jsonl.exists() else rows
    if rows:
        write_table(rows, args.out, args)


if __name__ == "__main__":
    main()
