"""Tracker benchmark: warm vs cold λmax products per tracked step, and the
tracker's share of a real training run's wall time.

The demo CNN trains on the bundled digits with full-batch gradient descent (examples/
track_training.py's loop: BatchNorm on the full batch's statistics) for STEPS steps, tracked
every EVERY steps by flatcheck.Tracker with λmax alone, k = 1, to a certified relative error 1e-3
(the stop on r²/δ, Kato–Temple, or the residual where no gap is resolved: linalg/certify.py).
Products are counted as the probe reports them: every Hessian-vector product, the true-residual
check included. At each tracked step a cold λmax (a fresh measure(), random start, same seed,
same tolerance) is taken on the same weights, outside the timed training, for the comparison.

    python benchmarks/bench_tracker.py [--steps 200] [--every 10] [--lr 0.5] [--samples 1437]
        [--out benchmarks/results/tracker.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import flatcheck

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import track_training  # noqa: E402  (the example's training loop)

TOL = 1e-3
OPTIONS = {"lmax": {"k": 1, "tol": TOL}}


def run(steps: int, every: int, lr: float, samples: int | None) -> dict:
    cold: dict[int, dict] = {}
    cold_seconds = 0.0

    def compare(step, model, data, record) -> None:
        nonlocal cold_seconds
        t0 = time.perf_counter()
        result = flatcheck.measure(model, data, probes="lmax", options=OPTIONS, batch_size=len(data[0]),
                                   bn_mode="train").results["lmax"]
        cold_seconds += time.perf_counter() - t0
        cold[step] = {"value": result.value, "matvecs": result.matvecs, "bound": result.error_bound}

    t0 = time.perf_counter()
    out = track_training.train(lr, steps, every, None, samples=samples, probes=("lmax",), options=OPTIONS,
                               on_tracked=compare)
    out["run_seconds"] = time.perf_counter() - t0 - cold_seconds  # the training run as it would be
    out["cold"] = cold
    return out


def table(out: dict, steps: int, every: int, samples: int | None) -> str:
    rows, warm_p, cold_p, ratios, within = [], [], [], [], []
    for record in out["records"]:
        step = record["step"]
        lm = record["results"].get("lmax") if record["status"] == "ok" else None
        c = out["cold"].get(step)
        if lm is None or c is None:
            rows.append(f"| {step} | error: {record['error']} | | | | | |")
            continue
        w = lm["matvecs"]
        ratio = w / c["matvecs"]
        if lm["details"]["warm_start"]:
            warm_p.append(w)
            cold_p.append(c["matvecs"])
            ratios.append(ratio)
        start = "warm" if lm["details"]["warm_start"] else "cold"
        # the two values agree when each is within its certified bound of the same eigenvalue
        agree = abs(lm["value"] - c["value"]) <= (lm["error_bound"] or 0) + (c["bound"] or 0)
        within.append(agree)
        rows.append(f"| {step} | {start} | {lm['value']:.6g} ± {lm['error_bound'] or float('nan'):.1e} | "
                    f"{c['value']:.6g} ± {c['bound'] or float('nan'):.1e} | {'yes' if agree else 'NO'} | {w} | "
                    f"{c['matvecs']} | {ratio:.2f} |")
    overhead = [r["tracker"]["overhead_seconds"] for r in out["records"][1:]]
    lines = [
        f"# Tracker: warm vs cold λmax (k = 1, certified relative error {TOL:g})",
        "",
        f"Demo CNN, bundled digits ({samples or 1437} train samples, one batch, BatchNorm on batch "
        f"statistics), full-batch gradient descent η = {out['lr']:g}, {steps} steps, tracked every {every}. "
        "Products: Hessian-vector products including the true-residual check. Cold: a fresh "
        "flatcheck.measure on the same weights (random start, seed 0). Values ± their certified bound "
        "(error_bound). Shared 2-core CPU, loaded by other jobs (load average 10–17): wall times are inflated.",
        "",
        "| step | tracker's start | λmax tracker | λmax cold | within bounds | products tracker | products cold | ratio |",
        "|---:|:---|---:|---:|:---|---:|---:|---:|",
        *rows,
        "",
        f"- median products per tracked step after the first: warm {statistics.median(warm_p):g}, "
        f"cold {statistics.median(cold_p):g} (median ratio {statistics.median(ratios):.2f}; "
        f"{sum(r <= 1 / 3 for r in ratios)} of {len(ratios)} warm steps at ≤ 1/3 of the cold products; "
        f"worst ratio {max(ratios):.2f})" if ratios else "- no warm steps",
        # a warm start's residual check comes from the products it took; a cold start still pays
        # one block product for its check (k = 1: one product), so the ratio against cold less it
        f"- tracked values within their bound of the cold value: {sum(within)} of {len(within)}",
        f"- against a cold start less its one check product: median ratio "
        f"{statistics.median(w / (c - 1) for w, c in zip(warm_p, cold_p)):.2f}, "
        f"{sum(w / (c - 1) <= 1 / 3 for w, c in zip(warm_p, cold_p))} of {len(ratios)} at ≤ 1/3" if ratios else "",
        f"- tracker's share of the run's wall time: {out['tracker_seconds']:.1f} s of {out['run_seconds']:.1f} s "
        f"({100 * out['tracker_seconds'] / out['run_seconds']:.0f} %), the session built once included",
        f"- per tracked step, time outside the probe (model snapshot and restore, finiteness check, "
        f"record, fsync): median {1000 * statistics.median(overhead):.1f} ms" if overhead else "",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tracker.md")
    args = ap.parse_args()
    out = run(args.steps, args.every, args.lr, args.samples)
    text = table(out, args.steps, args.every, args.samples)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(args.out)
    print(text)


if __name__ == "__main__":
    main()
