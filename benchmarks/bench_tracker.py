"""Tracker benchmark: warm vs cold λmax products per tracked step, and the tracker's share of
a training run's wall time, on two full-batch gradient-descent runs on the bundled digits:

- cnn: the demo CNN (examples/track_training.py's model and loop: BatchNorm on the full batch's
  statistics), 500 samples, η = 0.1;
- mlp: a tanh MLP 64-128-128-10 (26k parameters), 1000 samples, η = 0.5.

Each is tracked every EVERY steps by flatcheck.Tracker with λmax alone, k = 1, to a certified
relative error 1e-3 (r²/δ, Kato–Temple, or the residual where no gap is resolved:
linalg/certify.py). Products are counted as the probe reports them: every Hessian-vector
product (a cold start is lmax's default, block Lanczos from two random starts, whose residuals
come from its products: no check product). At each tracked step a cold λmax (a fresh
measure(), random start, same seed, same tolerance) is taken on the same weights, outside the
timed training, for the comparison.

    python benchmarks/bench_tracker.py [--runs cnn,mlp] [--steps 200] [--every 10]
        [--out benchmarks/results/tracker.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import flatcheck

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import track_training  # noqa: E402  (the example's data and model)

TOL = 1e-3
OPTIONS = {"lmax": {"k": 1, "tol": TOL}}
NOTES = "## Notes"
RUNS = {  # name: (model, samples, η, what)
    "cnn": ("cnn", 500, 0.1, "demo CNN (14k parameters, BatchNorm on the batch's statistics)"),
    "mlp": ("mlp", 1000, 0.5, "tanh MLP 64-128-128-10 (26k parameters)"),
}


def make_model(kind: str) -> nn.Module:
    if kind == "cnn":
        from flatcheck.zoo.demo_cnn import DigitsCNN

        return DigitsCNN()
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 128), nn.Tanh(),
                         nn.Linear(128, 10))


def run(kind: str, samples: int, lr: float, steps: int, every: int, seed: int = 0) -> dict:
    """Full-batch gradient descent tracked every `every` steps; the wall time of the training
    steps, of the tracker's calls (and inside them the probe's), and the cold comparison."""
    x, y = track_training.digits(samples)
    torch.manual_seed(seed)
    model = make_model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    t0 = time.perf_counter()
    tracker = flatcheck.Tracker(model, (x, y), probes="lmax", every=every, out=None, batch_size=len(x),
                                bn_mode="train", options=OPTIONS, name=f"{kind} lr={lr:g}", quiet=True)
    setup = time.perf_counter() - t0
    records, cold, train_s, track_s = [], {}, 0.0, setup
    for step in range(steps + 1):
        t1 = time.perf_counter()
        model.train()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        t2 = time.perf_counter()
        tracked = tracker.step(step, lr=lr, loss=loss.detach())
        t3 = time.perf_counter()
        track_s += t3 - t2
        if tracked is not None:
            records.append(dict(tracker.last_record))
            result = flatcheck.measure(model, (x, y), probes="lmax", options=OPTIONS, batch_size=len(x),
                                       bn_mode="train").results["lmax"]
            cold[step] = {"value": result.value, "matvecs": result.matvecs, "bound": result.error_bound}
        t4 = time.perf_counter()
        if step < steps:
            loss.backward()
            opt.step()
        train_s += (t2 - t1) + (time.perf_counter() - t4)
    tracker.close()
    return {"kind": kind, "samples": samples, "lr": lr, "records": records, "cold": cold, "train_seconds": train_s,
            "tracker_seconds": track_s, "setup_seconds": setup, "steps": steps, "every": every}


def section(out: dict, what: str) -> tuple[str, dict]:
    rows, warm_p, cold_p, ratios, within = [], [], [], [], []
    for record in out["records"]:
        step = record["step"]
        lm = record["results"].get("lmax") if record["status"] == "ok" else None
        c = out["cold"].get(step)
        if lm is None or c is None:
            rows.append(f"| {step} | error: {record.get('error')} | | | | | | |")
            continue
        w = lm["matvecs"]
        ratio = w / c["matvecs"]
        warm = lm["details"]["warm_start"]
        if warm:
            warm_p.append(w)
            cold_p.append(c["matvecs"])
            ratios.append(ratio)
        # the two values agree when each is within its certified bound of the same eigenvalue
        agree = abs(lm["value"] - c["value"]) <= (lm["error_bound"] or 0) + (c["bound"] or 0)
        within.append(agree)
        gap = lm["details"]["gaps"][0]
        rows.append(f"| {step} | {'warm' if warm else 'cold'} | {lm['value']:.6g} ± {lm['error_bound'] or float('nan'):.1e} | "
                    f"{c['value']:.6g} ± {c['bound'] or float('nan'):.1e} | {'yes' if agree else 'NO'} | "
                    f"{'-' if gap is None else format(gap / abs(lm['value']), '.3f')} | {w} | {c['matvecs']} | {ratio:.2f} |")
    probe_s = sum(r["tracker"]["probe_seconds"] for r in out["records"])
    overhead = [r["tracker"]["overhead_seconds"] for r in out["records"]]
    products = sum(r["tracker"]["products"] for r in out["records"])
    run_s = out["train_seconds"] + out["tracker_seconds"]
    cold_products = products - sum(warm_p)
    per_product = probe_s / max(products, 1)
    per_step = out["train_seconds"] / max(out["steps"], 1)
    share = out["tracker_seconds"] / run_s
    n_train = out["steps"]
    lines = [
        f"## {out['kind']}: {what}",
        "",
        f"Bundled digits, {out['samples']} train samples in one batch, full-batch gradient descent η = {out['lr']:g} "
        f"(2/η = {2 / out['lr']:g}), {out['steps']} steps, tracked every {out['every']}.",
        "",
        "| step | tracker's start | λmax tracker | λmax cold | within bounds | gap δ/λ | products tracker | products cold | ratio |",
        "|---:|:---|---:|---:|:---|---:|---:|---:|---:|",
        *rows,
        "",
        (f"- warm tracked steps: median products {statistics.median(warm_p):g} against cold "
         f"{statistics.median(cold_p):g}; median ratio {statistics.median(ratios):.2f}; "
         f"{sum(r <= 1 / 3 for r in ratios)} of {len(ratios)} at ≤ 1/3; worst ratio {max(ratios):.2f}")
        if ratios else "- no warm steps",
        f"- tracked values within their bound of the cold value: {sum(within)} of {len(within)}",
        f"- wall time: training {out['train_seconds']:.1f} s ({n_train} steps, "
        f"{1000 * per_step:.0f} ms a step), tracker {out['tracker_seconds']:.1f} s: "
        f"tracking is {100 * share:.0f} % of the run's {run_s:.1f} s",
        f"- the tracker's time: {probe_s:.1f} s in the probe ({products} products: {cold_products} on the "
        f"{len(out['records']) - len(warm_p)} cold tracked steps, {sum(warm_p)} on the {len(warm_p)} warm ones; "
        f"{1000 * per_product:.0f} ms a product, {per_product / per_step:.1f} training steps' time; session setup "
        f"{out['setup_seconds']:.1f} s at the first step), {sum(overhead):.1f} s outside it (snapshot, finiteness "
        f"check, record: median {1000 * statistics.median(overhead):.1f} ms a tracked step)",
        "",
    ]
    summary = {"products": products, "cold_products": cold_products, "product_in_steps": per_product / per_step,
               "warm": statistics.median(warm_p) if warm_p else None,
               "cold": statistics.median(cold_p) if cold_p else None,
               "ratio": statistics.median(ratios) if ratios else None, "share": share,
               "within": (sum(within), len(within))}
    return "\n".join(lines), summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="cnn,mlp")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tracker.md")
    args = ap.parse_args()
    parts = []
    for name in args.runs.split(","):
        kind, samples, lr, what = RUNS[name]
        text, _ = section(run(kind, samples, lr, args.steps, args.every), what)
        print(text, flush=True)
        parts.append(text)
    head = [f"# Tracker: warm vs cold λmax (k = 1, certified relative error {TOL:g})", "",
            "Products: Hessian-vector products. Cold: a fresh flatcheck.measure on the same weights (lmax's "
            "default, block Lanczos from two random starts, seed 0). Values ± their certified bound "
            "(error_bound); gap δ/λ: the gap the tracker's bound used, over λ. Generated by "
            f"`python benchmarks/bench_tracker.py --runs {args.runs} --steps {args.steps} --every {args.every}`.", ""]
    # the file's hand-written notes (from NOTES on) outlive a rerun
    old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
    notes = old[old.index(NOTES):] if NOTES in old else ""
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text("\n".join(head + parts) + ("\n" + notes if notes else ""), encoding="utf-8")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
