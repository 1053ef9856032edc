"""What every probe's default run costs: seconds and products on a torchvision ResNet-18.

The model is torchvision's resnet18 (7×7 stem), random init, 10 classes, on 64 CIFAR-shaped
(3×32×32) synthetic samples — `--samples 64` and every probe option at its default, as
`flatcheck PROBE` runs it. Each probe runs in its own child process under an address-space
limit (ulimit -v), so one probe's memory cannot distort the next one's numbers, and the
child's peak resident memory is reported.

    .venv/bin/python benchmarks/bench_defaults.py                      # every probe
    .venv/bin/python benchmarks/bench_defaults.py --probes trace,lmax --save

--save writes benchmarks/results/defaults_resnet18.md (the table) and .json (the rows).
Seconds are the probe's own (ProbeResult.seconds; loading the model and data excluded) and
the child's wall time (process start to exit). Products are the curvature products
(matvecs), plus the batched backward passes of the function-space probes.

The child shows its progress lines as the CLI does off a terminal (a CI log), and each line
is stamped as it arrives: a run forecast past 3 minutes says so in a line of its own ("this
run will take about H:MM:SS"), and the table gives when that came (seconds from the probe's
start) and what it said, against what the probe took.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SPEC = """source: torchvision
arch: resnet18
num_classes: 10
input_size: [3, 32, 32]
mean: [0.4914, 0.4822, 0.4465]
std: [0.2470, 0.2435, 0.2616]
loss: cross_entropy
"""
SAMPLES = 64
GOAL_SECONDS = 180  # the goal: each default run within 3 minutes on a 2-core CPU


def child(probe: str, spec_path: str, budget: float | None) -> None:
    """Run one probe with its defaults and print one JSON row."""
    import torch

    from flatcheck import api
    from flatcheck.config import RunConfig, probe_requests

    from flatcheck.report.progress import ProgressRenderer, period_from_env

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    config = RunConfig(checkpoint=None, spec=Path(spec_path), probes=probe_requests([probe]), data="synthetic",
                       samples=SAMPLES, seed=0, budget=budget)
    with ProgressRenderer(sys.stderr, interactive=False, period=period_from_env()) as progress:
        report = api.run(config, progress)
    r = report.results[probe]
    d = r.details or {}
    print(json.dumps({
        "probe": probe, "value": r.value, "stderr": r.stderr, "seconds": r.seconds, "matvecs": r.matvecs,
        "backward_passes": d.get("backward_passes"), "stop_reason": d.get("stop_reason"),
        "probes": d.get("probes") or d.get("draws") or (d.get("mc") or {}).get("draws"),
        "steps_taken": d.get("steps_taken") or d.get("iterations"), "notes": r.notes,
        "parameters": d.get("parameters"),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
    }))


def run_one(probe: str, spec_path: str, limit_bytes: int, timeout: float, budget: float | None) -> dict:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    start = time.monotonic()
    extra = [] if budget is None else ["--budget", str(budget)]
    proc = subprocess.Popen([sys.executable, __file__, "--child", probe, "--spec", spec_path, *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    stamped: list[tuple[float, str]] = []
    printed: list[str] = []
    readers = [threading.Thread(target=lambda: stamped.extend((time.monotonic() - start, line.rstrip("\n"))
                                                              for line in proc.stderr), daemon=True),
               threading.Thread(target=lambda: printed.extend(proc.stdout), daemon=True)]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        for r in readers:
            r.join()
        return {"probe": probe, "error": f"timed out after {timeout:.0f} s", "wall_seconds": timeout,
                **said(stamped)}
    wall = time.monotonic() - start
    for r in readers:
        r.join()
    out = "".join(printed)
    row: dict = {"probe": probe, "wall_seconds": wall, **said(stamped)}
    if proc.returncode != 0:
        row["error"] = ([s for _, s in stamped if not s.startswith("flatcheck")] or [f"exit {proc.returncode}"])[-1]
        return row
    row.update(json.loads(out.strip().splitlines()[-1]))
    return row


ELAPSED = re.compile(r"elapsed (\d+):(\d\d):(\d\d)")
FORECAST = re.compile(r"will take about (\d+):(\d\d):(\d\d)")


def said(lines: list[tuple[float, str]]) -> dict:
    """When the probe's first own line dates its start (its `elapsed`), and when a forecast past
    3 minutes came and what it said (seconds), from the stamped progress lines."""
    begun = None
    for t, s in lines:
        m = ELAPSED.search(s)
        if m and not s.startswith("flatcheck:"):
            begun = t - (3600 * int(m[1]) + 60 * int(m[2]) + int(m[3]))
            break
    # the last progress line: how far a run stopped by --timeout got, and its ETA then
    last = next((f"{t:.0f} s: {s}" for t, s in reversed(lines) if s.startswith("flatcheck") and "ETA" in s), None)
    for t, s in lines:
        m = FORECAST.search(s)
        if m and begun is not None:
            return {"forecast_at": t - begun, "forecast_seconds": 3600 * int(m[1]) + 60 * int(m[2]) + int(m[3]),
                    "forecast_line": s, "probe_began": begun, "last_line": last}
    return {"probe_began": begun, "last_line": last}


def table(rows: list[dict], threads: str, limit_gib: float, budget: float | None) -> str:
    what = "Default runs" if budget is None else f"Default runs with --budget {budget:g}"
    lines = [
        f"# {what} on a torchvision ResNet-18 (random init, 10 classes, 64 samples of 3×32×32)",
        "",
        f"`benchmarks/bench_defaults.py`, {time.strftime('%Y-%m-%d')}, {platform.machine()} CPU, "
        f"OMP_NUM_THREADS={threads}, ulimit -v {limit_gib:g} GiB, torch {_torch_version()}. "
        "The machine's 2 cores were shared with other jobs while this ran: the seconds are upper bounds "
        "of what an idle machine takes, the products are exact.",
        "",
        f"| probe | probe s | process s | products | backward passes | stop | peak RSS MiB | ≤ {GOAL_SECONDS} s "
        "| forecast said at (s) | forecast (s) |",
        "|---|---:|---:|---:|---:|---|---:|:-:|---:|---:|",
    ]
    for r in rows:
        told = (f"{r['forecast_at']:.0f} | {r['forecast_seconds']}" if "forecast_at" in r else "– | –")
        if "error" in r:
            lines.append(f"| {r['probe']} | – | {r.get('wall_seconds', 0):.0f} | – | – | error: {r['error']} | "
                         f"{_num(r.get('peak_rss_mib'))} | no | {told} |")
            continue
        ok = "yes" if r["wall_seconds"] <= GOAL_SECONDS else "no"
        lines.append(f"| {r['probe']} | {r['seconds']:.1f} | {r['wall_seconds']:.1f} | {r['matvecs']} | "
                     f"{_num(r.get('backward_passes'))} | {r.get('stop_reason') or '–'} | "
                     f"{_num(r.get('peak_rss_mib'))} | {ok} | {told} |")
    return "\n".join(lines) + "\n"


def _num(x) -> str:
    return "–" if x is None else f"{x:.0f}" if isinstance(x, float) else str(x)


def _torch_version() -> str:
    import torch

    return torch.__version__


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", default=None, help="comma-separated probes [default: every registered probe]")
    ap.add_argument("--limit-gib", type=float, default=12.0, help="address-space limit per probe (ulimit -v)")
    ap.add_argument("--timeout", type=float, default=1200.0, help="seconds before a probe's child is stopped")
    ap.add_argument("--budget", type=float, default=None, help="--budget SECONDS for each probe's run "
                    "[default: none, the defaults as they are]")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/defaults_resnet18[_budgetS].{md,json}")
    ap.add_argument("--stem", default="defaults_resnet18", help="the results' file name without its suffix")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.spec, args.budget)
        return

    from flatcheck.probes.registry import list_probes

    probes = args.probes.split(",") if args.probes else list_probes()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = os.path.join(tmp, "resnet18_tv_cifar.yaml")
        Path(spec_path).write_text(SPEC)
        for probe in probes:
            row = run_one(probe, spec_path, int(args.limit_gib * 2**30), args.timeout, args.budget)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "notes"}), file=sys.stderr, flush=True)
    text = table(rows, os.environ.get("OMP_NUM_THREADS", "unset"), args.limit_gib, args.budget)
    print(text)
    if args.save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stem = args.stem + ("" if args.budget is None else f"_budget{args.budget:g}")
        (RESULTS / f"{stem}.md").write_text(text)
        (RESULTS / f"{stem}.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
