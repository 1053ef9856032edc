"""Where the default lmax's certified stop could come sooner, replayed from recorded Krylov spaces.

Block Lanczos from two starts whose rows are taken in their own order (not led by a residual, as
lmax's last step is since session 23) spans, after m products, a space that does not depend on
when the solver checks its bound: a block step taken a row at a time reaches the same spaces. So
one run that checks after every product and goes on well past its stop records, at every count
m, the top Ritz values and residuals; any stopping rule can then be replayed on the records: the
count at which it stops, and its bound there against the error of θ₁. The error is measured
against the dense float64 spectrum on the small models of tests/support/spectra.py (mlp, cnn,
transformer, and the near-degenerate twin), and against the run's own converged θ₁ on
bench_lmax_cli's ResNet-18 (64 CIFAR-shaped samples), where no dense spectrum exists.

    python benchmarks/analysis_lmax_bounds.py record-dense --out /tmp/dense.json [--seeds 50]
    python benchmarks/analysis_lmax_bounds.py record-resnet --out /tmp/resnet.json [--seeds 0,...,11]
    python benchmarks/analysis_lmax_bounds.py replay /tmp/dense.json /tmp/resnet.json

Results and what they mean: benchmarks/results/lmax_resnet18.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

TOL = 1e-3


def _snapshot(lz) -> dict:
    import numpy as np

    from flatcheck.linalg.certify import round_off_floor
    from flatcheck.linalg.lanczos import coefficient_residuals

    theta, S = lz.ritz()
    order = np.argsort(theta)[::-1]  # every Ritz pair: a forecast may read the lowest too
    values, res = coefficient_residuals(lz.coefficients(), np.asarray(lz.outside), S[:, order])
    scale = max(lz.scale, max(abs(v) for v in values))
    return {"products": lz.op.matvecs, "size": lz.size, "theta": values, "res": res,
            "floor": round_off_floor(lz.op, scale)}


def run_recorded(op, generator, products: int) -> list[dict]:
    """Block Lanczos (lmax's default block) one row a step, a snapshot after every product."""
    from flatcheck.linalg.block_lanczos import BLOCK, BlockLanczos
    from flatcheck.linalg.random import gaussian

    start = op.matvecs
    lz = BlockLanczos(op, gaussian(BLOCK, op.dim, generator, dtype=op.dtype, device=op.device),
                      min(products, op.dim))
    out = []
    while lz.can_step and lz.op.matvecs - start < products:
        lz.step(1)
        snap = _snapshot(lz)
        snap["products"] -= start
        out.append(snap)
    return out


def record_dense(seeds: int) -> list[dict]:
    import torch

    from tests.support.spectra import Dense, hessian, small_problem

    runs = []
    for arch in ("mlp", "cnn", "transformer", "twin"):
        for seed in range(seeds):
            H = hessian(*small_problem(arch, seed))
            truth = torch.linalg.eigvalsh(H).flip(0)[:4].tolist()
            snaps = run_recorded(Dense(H), torch.Generator().manual_seed(seed), min(80, H.shape[0]))
            runs.append({"model": arch, "seed": seed, "truth": truth, "dtype": "float64", "snaps": snaps})
        print(f"{arch}: {seeds} seeds recorded", flush=True)
    return runs


def record_resnet(seeds: list[int], products: int) -> list[dict]:
    """The default lmax's operator on bench_lmax_cli's inputs, driven through the command line so
    that model, data and operator are what a user gets; the solver is swapped for the recorder."""
    import flatcheck.linalg.block_lanczos as bl
    from bench_lmax_cli import make_inputs
    from analysis_lmax_forecast import run_default_lmax

    runs = []
    plain = bl.block_lanczos_top

    def recorder(op, k, *, generator, **kw):
        snaps = run_recorded(op, generator, products)
        runs[-1]["snaps"] = snaps
        print(f"  {len(snaps)} products, θ1 {snaps[-1]['theta'][0]:.6f}", flush=True)
        return plain(op, k, generator=generator, tol=0.5, max_iter=4)

    bl.block_lanczos_top = recorder
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ckpt, data, spec = make_inputs(Path(tmp))
            for seed in seeds:
                runs.append({"model": "resnet18", "seed": seed, "truth": None, "dtype": "float32"})
                run_default_lmax(seed, ckpt, data, spec, Path(tmp) / "out.json")
    finally:
        bl.block_lanczos_top = plain
    return runs


# --- the rules replayed -------------------------------------------------------------------------

def bounds_at(s: dict, k: int, safety: float) -> list:
    """lmax's bounds of the top k at one count (block_lanczos._top), the gap divided by `safety`."""
    from flatcheck.linalg.certify import MIN_EXTRA, TOO_FEW, ritz_bounds

    th, r = s["theta"], s["res"]
    below = (th[k], r[k]) if s["size"] >= k + MIN_EXTRA and len(th) > k else TOO_FEW
    return ritz_bounds(th[:k], r[:k], below, s["floor"], safety)


def replay(runs: list[dict], safeties=(2.0, 1.5, 1.25, 1.0), cases=((1e-3, 1), (1e-6, 1), (1e-6, 3))) -> None:
    import statistics

    for safety in safeties:
        print(f"\ngap divided by {safety}")
        for tol, k in cases:
            by_model: dict[str, list] = {}
            for run in runs:
                if run["dtype"] == "float32" and tol < 1e-4:
                    continue
                snaps = run["snaps"]
                truth = run["truth"] or snaps[-1]["theta"]
                rows = by_model.setdefault(run["model"], [])
                for s in snaps:
                    if s["size"] < k:
                        continue
                    b = bounds_at(s, k, safety)
                    if all(x.value <= tol * abs(t) for x, t in zip(b, s["theta"])):
                        slack = 64 * 2.2e-16 * abs(truth[0]) if run["dtype"] == "float64" else 0.0
                        q = [(abs(truth[i] - s["theta"][i]) - slack) / b[i].value for i in range(k)]
                        rows.append((s["products"], q, b[0].kind.startswith("r²")))
                        break
                else:
                    rows.append((math.inf, [math.nan] * k, False))
            for model, rows in by_model.items():
                prods = [p for p, _, _ in rows]
                qs = [x for _, q, _ in rows for x in q if math.isfinite(x)]
                within = sum(x <= 1 for x in qs)
                print(f"  tol {tol:g} k {k}  {model:12s} products median {statistics.median(prods):5.1f} "
                      f"mean {statistics.fmean(prods):6.2f}  within {within}/{len(qs)}  err/bound max "
                      f"{max(qs) if qs else math.nan:.3g}  r2/d decided {sum(d for *_, d in rows)}/{len(rows)}"
                      + (f"  by seed {prods}" if model == "resnet18" else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["record-dense", "record-resnet", "replay"])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--out")
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--products", type=int, default=26)
    args = ap.parse_args()
    if args.what == "record-dense":
        runs = record_dense(int(args.seeds or 50))
    elif args.what == "record-resnet":
        runs = record_resnet([int(s) for s in (args.seeds or ",".join(map(str, range(12)))).split(",")], args.products)
    else:
        replay([run for f in args.files for run in json.loads(Path(f).read_text())])
        return
    Path(args.out).write_text(json.dumps(runs))


if __name__ == "__main__":
    main()
