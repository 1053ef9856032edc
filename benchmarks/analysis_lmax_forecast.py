"""How well lmax's forecast of its own products holds on a ResNet-18, seed by seed: at 25,
50 and 75 % of each run, the forecast's products left against the products the run really
had left, in products rather than seconds, so that the machine's load does not enter.

Each seed runs the default `flatcheck lmax` in this process on bench_lmax_cli's inputs
(torchvision resnet18, 10 classes, 64 CIFAR-shaped samples), with block Lanczos' per-step
state recorded (products so far, the top two Ritz values and residuals, the bound and its
kind). The recorded ratios (bound ÷ tol·|θ|) are then fed to linalg/forecast.py's
DecayForecast as the solver feeds them, and at each judged point the forecast's products
left are set against the products the run actually had left: ETA ÷ left where a product
takes the same time throughout; an ETA a user can believe lies within ±50 % of it.

    python benchmarks/analysis_lmax_forecast.py [--seeds 0,1,...,11] [--record-only]

Results and what they mean: benchmarks/results/eta_resnet18.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

POINTS = (0.25, 0.5, 0.75)


def record(seed: int, ckpt: Path, data: Path, spec: Path, out: Path) -> list[dict]:
    """One default lmax run's per-step state."""
    import flatcheck.linalg.block_lanczos as bl
    from flatcheck.linalg.forecast import chebyshev_rate

    steps: list[dict] = []
    plain = bl._top

    def top(lz, k):
        found = plain(lz, k)
        values, res, bounds, (_, _, theta) = found
        steps.append({"products": lz.op.matvecs, "theta": values[:2], "res": res[:2], "bound": bounds[0].value,
                      "kind": bounds[0].kind, "rate": chebyshev_rate(theta, bl.BLOCK)})
        return found

    bl._top = top
    try:
        run_default_lmax(seed, ckpt, data, spec, out)
    finally:
        bl._top = plain
    return steps


def run_default_lmax(seed: int, ckpt: Path, data: Path, spec: Path, out: Path) -> None:
    """The default `flatcheck lmax` on bench_lmax_cli's inputs, in this process (so that a
    caller's patches of the solver take), its report written to `out`."""
    from flatcheck.entry import main

    sys.argv = ["flatcheck", "lmax", str(ckpt), "--spec", str(spec), "--data", f"npz:{data}", "--samples", "64",
                "-q", "--json", str(out), "--seed", str(seed)]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise


def judge(steps: list[dict], tol: float = 1e-3) -> list[float]:
    """ETA ÷ left, in products, at each of POINTS: the forecast after the last step before it."""
    from flatcheck.linalg.block_lanczos import BLOCK
    from flatcheck.linalg.forecast import COLD_BLOCK_STEPS, DecayForecast

    n = steps[-1]["products"]
    forecast = DecayForecast(10 ** 6, per_step=BLOCK, prior_steps=COLD_BLOCK_STEPS)
    totals = [(s["products"], forecast.total(s["products"], s["bound"] / (tol * abs(s["theta"][0])), s.get("rate")))
              for s in steps]
    out = []
    for point in POINTS:
        at = point * n
        _, total = max((t for t in totals if t[0] <= at), key=lambda t: t[0])
        out.append((total - at) / (n - at) if total else math.nan)
    return out


def record_all(seeds: str) -> list:
    """Every seed's default lmax run recorded and judged."""
    from bench_lmax_cli import make_inputs

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, data, spec = make_inputs(Path(tmp))
        for seed in (int(s) for s in seeds.split(",")):
            steps = record(seed, ckpt, data, spec, Path(tmp) / "out.json")
            ratios = judge(steps)
            rows.append((seed, steps, ratios))
            lns = ", ".join(f"{math.log(s['bound'] / (1e-3 * abs(s['theta'][0]))):.2f}" for s in steps)
            print(f"seed {seed}: {steps[-1]['products']} products; ln(bound ÷ target) by step: {lns}; "
                  f"ETA ÷ left at 25/50/75 %: " + " ".join(f"{r:.2f}" for r in ratios), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default=",".join(map(str, range(12))))
    ap.add_argument("--out", help="write every seed's recorded steps here (JSON), to replay other rules")
    ap.add_argument("--replay", help="judge the steps an --out file holds instead of running the seeds")
    args = ap.parse_args()
    if args.replay:
        rows = []
        import json

        for run in json.loads(Path(args.replay).read_text()):
            rows.append((run["seed"], run["steps"], judge(run["steps"])))
            print(f"seed {run['seed']}: {run['steps'][-1]['products']} products; ETA ÷ left at 25/50/75 %: "
                  + " ".join(f"{r:.2f}" for r in rows[-1][2]))
    else:
        rows = record_all(args.seeds)
    if args.out:
        import json

        Path(args.out).write_text(json.dumps([{"seed": seed, "steps": steps} for seed, steps, _ in rows]))
    met = sum(0.5 <= r <= 1.5 for _, _, ratios in rows for r in ratios)
    print(f"within ±50 %: {met} of {3 * len(rows)} points; by point: "
          + ", ".join(f"{int(p * 100)} % {sum(0.5 <= r[2][i] <= 1.5 for r in rows)}/{len(rows)}"
                      for i, p in enumerate(POINTS)))


if __name__ == "__main__":
    main()
