"""Curvature tracked as training runs: the demo CNN on the bundled digits, full-batch gradient
descent at two learning rates, λmax(H), Tr(H) and the softmaxed model's input-Jacobian norm
every few steps (flatcheck.Tracker), and the plot.

Cohen et al. 2021 (edge of stability) and MacDonald et al. 2023 (§5, App. B.1, Fig. 1) track
exactly these: under full-batch gradient descent with step η, λmax rises (progressive
sharpening) until it reaches 2/η and then hovers there, and the Jacobian norm rises with it.
What this run shows is printed and plotted, whatever it is.

    python examples/track_training.py                  # 500 digits, 200 steps, η = 0.5 and 1
    python examples/track_training.py --probes lmax    # λmax alone: the edge-of-stability figure
    python examples/track_training.py --steps 40 --every 10 --out /tmp/t.png   # quick

The figure goes to --out, by default a new file track_training.png in the working directory
(track_training.1.png … when that exists): the committed docs/track_training.png is never
overwritten unless named.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

import flatcheck
from flatcheck.data import create_dataset
from flatcheck.zoo.demo_cnn import DigitsCNN

PROBES = ("lmax", "trace", "jacobian")
OPTIONS = {
    "lmax": {"k": 1, "tol": 1e-3},
    "trace": {"matrix": "hessian", "parts": False},  # Hutchinson to 5 % relative stderr (the default)
    "jacobian": {"output": "softmax"},  # MacDonald et al. 2023 track the softmaxed model
}


def digits(samples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The bundled digits' train split as (x, y) tensors: 1437 images, 1×8×8 in [0, 1]."""
    dataset = create_dataset("digits", split="train")
    n = len(dataset) if samples is None else samples
    xs, ys = zip(*(dataset[i] for i in range(n)))
    return torch.stack([torch.as_tensor(x) for x in xs]).float(), torch.tensor([int(y) for y in ys])


def train(lr: float, steps: int, every: int, out: Path | None, *, samples: int | None = None, seed: int = 0,
          probes=PROBES, options=None, on_tracked=None) -> dict:
    """Full-batch gradient descent from a fixed initialisation, tracked every `every` steps. The
    BatchNorm runs on the full batch's statistics, as in training (bn_mode="train", one batch).
    Returns the records and the seconds spent training vs tracking."""
    x, y = digits(samples)
    torch.manual_seed(seed)
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    options = options if options is not None else {p: o for p, o in OPTIONS.items() if p in probes}
    t0 = time.perf_counter()
    # curvature of the training loss: BatchNorm on the full batch's statistics (one batch);
    # the input Jacobian needs per-sample outputs, so it is taken in eval mode (running
    # statistics, which under full-batch training follow the batch's within ~10 steps)
    groups = [([p for p in probes if p != "jacobian"], "train", out),
              (["jacobian"] if "jacobian" in probes else [], "eval",
               None if out is None else out.with_name(out.stem + ".jacobian.jsonl"))]
    trackers = [flatcheck.Tracker(model, (x, y), probes=names, every=every, out=path, batch_size=len(x),
                                  bn_mode=bn, options={p: options[p] for p in names if p in options},
                                  name=f"demo-cnn lr={lr:g}") for names, bn, path in groups if names]
    setup = time.perf_counter() - t0
    records, tracking, t_start = [], setup, time.perf_counter()
    for step in range(steps + 1):
        model.train()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        tracked = [tracker.step(step, lr=lr, loss=loss.detach()) for tracker in trackers]
        tracking += time.perf_counter() - t1
        if tracked[0] is not None:
            record = dict(trackers[0].last_record)
            for other in trackers[1:]:  # one record per step for the plot and the summary
                record["results"] = {**record["results"], **other.last_record["results"]}
                if other.last_record["status"] != "ok":
                    record.update(status="error", error=other.last_record["error"])
            records.append(record)
            if on_tracked is not None:
                on_tracked(step, model, (x, y), record)
        if step < steps:
            loss.backward()
            opt.step()
    for tracker in trackers:
        tracker.close()
    wall = time.perf_counter() - t_start + setup
    return {"lr": lr, "records": records, "wall_seconds": wall, "tracker_seconds": tracking}


def summary(run: dict) -> dict:
    """The numbers the README quotes: λmax against 2/η, the Jacobian norm's rise."""
    ok = [r for r in run["records"] if r["status"] == "ok"]
    lmax = [(r["step"], r["results"]["lmax"]["value"]) for r in ok if "lmax" in r["results"]]
    jac = [(r["step"], r["results"]["jacobian"]["value"]) for r in ok if "jacobian" in r["results"]]
    last = [v for s, v in lmax[len(lmax) // 2:]]
    out = {"lr": run["lr"], "two_over_lr": 2 / run["lr"], "lmax_first": lmax[0][1] if lmax else None,
           "lmax_max": max((v for _, v in lmax), default=None),
           "lmax_second_half_median": sorted(last)[len(last) // 2] if last else None,
           "first_step_within_10pct_of_2_over_lr": next((s for s, v in lmax if v >= 0.9 * 2 / run["lr"]), None),
           "errors": len(run["records"]) - len(ok)}
    if jac:
        out.update(jacobian_first=jac[0][1], jacobian_last=jac[-1][1], jacobian_max=max(v for _, v in jac))
    return out


LABELS = {"lmax": "λmax(H)", "trace": "Tr(H)", "jacobian": "mean ‖J‖_F of softmax(f)"}


def plot(runs: list[dict], path: Path, probes=PROBES) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fields = [(p, LABELS[p]) for p in PROBES if p in probes]
    fig, axes = plt.subplots(1, len(fields), figsize=(1.0 + 4.0 * len(fields), 3.6), squeeze=False)
    axes = list(axes[0])
    for run, color in zip(runs, ("tab:blue", "tab:orange", "tab:green", "tab:red")):
        ok = [r for r in run["records"] if r["status"] == "ok"]
        steps = [r["step"] for r in ok]
        for ax, (probe, label) in zip(axes, fields):
            if not ok or probe not in ok[0]["results"]:
                continue
            values = [r["results"][probe]["value"] for r in ok]
            errs = [r["results"][probe]["stderr"] or 0.0 for r in ok]
            ax.errorbar(steps, values, yerr=errs, color=color, marker=".", ms=4, lw=1, label=f"η = {run['lr']:g}")
            ax.set_title(label)
            ax.set_xlabel("step")
        if "lmax" in probes:  # the edge of stability: λmax hovers at 2/η
            axes[0].axhline(2 / run["lr"], color=color, ls="--", lw=1, label=f"2/η = {2 / run['lr']:g}")
    for ax in axes[:2]:
        ax.legend(fontsize=8)
    n = runs[0]["records"][0]["settings"]["samples"] if runs and runs[0]["records"] else "?"
    fig.suptitle(f"demo CNN, bundled digits ({n} train samples), full-batch gradient descent — flatcheck.Tracker")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)  # atomic: a reader never sees half a PNG


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--lrs", default="0.5,1", help="comma-separated learning rates")
    ap.add_argument("--samples", type=int, default=500, help="training samples, of the 1437 bundled digits")
    ap.add_argument("--probes", default=",".join(PROBES),
                    help=f"comma-separated, of {', '.join(PROBES)} (lmax alone: the edge-of-stability figure)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the figure [default: a new track_training.png in the working directory]")
    ap.add_argument("--jsonl", type=Path, default=None, help="folder for the trackers' JSONL files")
    args = ap.parse_args(argv)
    probes = tuple(p.strip() for p in args.probes.split(",") if p.strip())
    unknown = [p for p in probes if p not in PROBES]
    if unknown or not probes:
        ap.error(f"--probes: {', '.join(unknown) or 'none given'}; choose from {', '.join(PROBES)}")
    target = args.out or new_file(Path("track_training.png"))
    runs = []
    for lr in (float(v) for v in args.lrs.split(",")):
        out = None if args.jsonl is None else args.jsonl / f"track_lr{lr:g}.jsonl"
        runs.append(train(lr, args.steps, args.every, out, samples=args.samples, probes=probes))
        print(json.dumps(summary(runs[-1])), flush=True)
    plot(runs, target, probes)
    print(f"wrote {target}", flush=True)
    return runs


def new_file(path: Path) -> Path:
    """`path`, or path.1, path.2 … before its suffix: the first name no file has yet."""
    n = 0
    while path.exists():
        n += 1
        path = path.with_name(f"{path.stem.split('.')[0]}.{n}{path.suffix}")
    return path


if __name__ == "__main__":
    main()
