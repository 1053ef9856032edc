"""How believable the progress lines are, off a terminal (a CI log), on a real-size model.

Runs `flatcheck PROBE` with its defaults on torchvision's resnet18 (10 classes, random init) at
64 CIFAR-shaped samples with stderr on a pipe, stamps every line as it arrives, and reports:
when the first line with a count (`n/…`, or a count within a unit: `samples 32/64`, `vectors
2/6`) came after the probe's start, when the first ETA other than `?` came, at 25, 50 and 75 %
of the probe's run the ETA last printed against the time that was actually left (ratio; the
goal is within ±50 %), and when a run forecast past 3 minutes said so.

    .venv/bin/python benchmarks/bench_eta.py [--probes lmax,trace,hutchpp,hutchpp-forms] [--save]

A name in --probes is a probe at its defaults, or one of VARIANTS (Hutch++ with and without
per-layer parts).

--save writes benchmarks/results/eta_resnet18.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lmax_cli import SAMPLES, make_inputs  # noqa: E402  (the same model and data)

ROOT = Path(__file__).resolve().parents[1]
# a count: units done (`3/10`, `3/?`, `1/~10` of a prior's total) or passes within a unit
# (`samples 32/64`, `vectors 2/5`, or a block's share: `14% of 9 vectors`)
COUNT = re.compile(r"(?:: (?:done · )?\d+/~?(?:\d+|\?)|(?:samples|vectors) [\d.]+/\d+|\d+% of \d+ (?:samples|vectors)) · ")
ETA = re.compile(r"ETA ~?(\d+):(\d\d):(\d\d)")  # `~`: from a prior's total
ELAPSED = re.compile(r"elapsed (\d+):(\d\d):(\d\d)")
HINT = "will take about"
# a name --probes takes besides the probes': the command it runs (a probe, then its flags)
VARIANTS = {
    "hutchpp": ["trace", "--estimator", "hutchpp"],  # per-layer parts: every unit a product
    "hutchpp-forms": ["trace", "--estimator", "hutchpp", "--no-layers"],  # a sketch, then quadratic forms
}


def stamped(cmd: list[str], env: dict) -> list[tuple[float, str]]:
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines = [(time.monotonic() - start, line.rstrip("\n")) for line in proc.stderr]
    proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}): {lines[-5:]}")
    return lines


def seconds(m: re.Match) -> int:
    return 3600 * int(m[1]) + 60 * int(m[2]) + int(m[3])


def judge(probe: str, lines: list[tuple[float, str]]) -> dict:
    """Seconds from the probe's start: its own lines (`flatcheck PROBE (method): …`, not the
    process's first line) say how long it has run, so the first of them dates the start."""
    mine = [(t, s) for t, s in lines
            if s.startswith(f"flatcheck {probe} (") or (s.startswith(f"flatcheck {probe}:") and ELAPSED.search(s))]
    first = next((t, s) for t, s in mine if ELAPSED.search(s))
    begun = first[0] - seconds(ELAPSED.search(first[1]))
    end = mine[-1][0]
    hints = [t for t, s in mine if HINT in s]
    counts = [t for t, s in mine if COUNT.search(s)]
    etas = []
    for t, s in mine:
        m = ETA.search(s)
        if m:
            etas.append((t, seconds(m)))
    out = {"probe": probe, "run": end - begun, "first_count": counts[0] - begun if counts else None,
           "first_eta": etas[0][0] - begun if etas else None, "lines": len(mine),
           "hint": hints[0] - begun if hints else None}
    for q in (0.25, 0.5, 0.75):
        at = begun + q * (end - begun)
        shown = [(t, e) for t, e in etas if t <= at]
        if shown:
            t, e = shown[-1]
            # the ETA as it stood at `at` (none below 0, as the line's own clock), and the time left
            out[q] = (max(0.0, e - (at - t)), end - at)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probes", default="lmax")
    ap.add_argument("--period", type=float, default=15.0, help="FLATCHECK_PROGRESS_SECONDS")
    ap.add_argument("--save", action="store_true")
    ap.add_argument("--lines", action="store_true", help="print every stamped progress line")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               FLATCHECK_PROGRESS_SECONDS=str(args.period))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, data, spec = make_inputs(Path(tmp))
        for name in args.probes.split(","):
            probe, *flags = VARIANTS.get(name, [name])
            cmd = [sys.executable, "-m", "flatcheck", probe, str(ckpt), "--spec", str(spec), "--data", f"npz:{data}",
                   "--samples", str(SAMPLES), "--json", str(Path(tmp) / f"{name}.json"), *flags]
            lines = stamped(cmd, env)
            if args.lines:
                for t, line in lines:
                    print(f"{t:7.1f}  {line}", flush=True)
            rows.append(judge(probe, lines) | {"probe": name})
            print(rows[-1], flush=True)
    load = os.getloadavg()
    text = ["# Progress lines on a pipe: first count, first ETA, and the ETA against the time left",
            "",
            f"torchvision resnet18, {SAMPLES} CIFAR-shaped samples, every option at its default, stderr on a pipe "
            f"(a line every {args.period:g} s and at each report). Seconds from the probe's start (its first "
            f"line's time less its `elapsed`). Shared 2-core CPU, loaded by other jobs (load average at the end "
            f"{load[0]:.1f}, {load[1]:.1f}).",
            "",
            "| probe | run (s) | first count (s) | first ETA (s) | ETA ÷ left at 25 % | at 50 % | at 75 % "
            "| long-run forecast at (s) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = []
        for q in (0.25, 0.5, 0.75):
            eta_left = r.get(q)
            cells.append("–" if eta_left is None else f"{eta_left[0]:.0f}/{eta_left[1]:.0f} s = "
                         f"{eta_left[0] / eta_left[1]:.2f}" if eta_left[1] > 0 else "–")
        first_count = "–" if r["first_count"] is None else f"{r['first_count']:.0f}"
        first_eta = "–" if r["first_eta"] is None else f"{r['first_eta']:.0f}"
        hint = "–" if r["hint"] is None else f"{r['hint']:.0f}"
        text.append(f"| {r['probe']} | {r['run']:.0f} | {first_count} | {first_eta} | " + " | ".join(cells)
                    + f" | {hint} |")
    text.append("")
    print("\n".join(text))
    if args.save:
        out = ROOT / "benchmarks" / "results" / "eta_resnet18.md"
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text("\n".join(text), encoding="utf-8")
        tmp.replace(out)


if __name__ == "__main__":
    main()
