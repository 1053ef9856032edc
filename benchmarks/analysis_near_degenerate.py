"""Cold λmax on a near-degenerate top pair of a real model: the demo CNN after 5 steps of
full-batch gradient descent (500 bundled digits, η = 0.1, BatchNorm on the batch), where
λ1 and λ2 are 0.76 % apart. lmax's default (block Lanczos from two starts) against the
one-vector recurrence (--starts 1), seeds 0–5, each against a reference (one-vector Lanczos,
k = 4, tol 1e-5). Results: benchmarks/results/near_degenerate_demo.md.

    OMP_NUM_THREADS=1 python benchmarks/analysis_near_degenerate.py
"""
import sys, torch
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
for sub in ("benchmarks", "examples", "src"):
    sys.path.insert(0, str(ROOT / sub))
torch.set_num_threads(1)
import flatcheck, track_training
from torch import nn
from bench_tracker import make_model, OPTIONS
from flatcheck.live import open_live_session
from flatcheck.operators import CurvatureOperator
from flatcheck.linalg.lanczos import lanczos_top
x, y = track_training.digits(500)
torch.manual_seed(0)
model = make_model("cnn")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    model.train(); opt.zero_grad(); nn.functional.cross_entropy(model(x), y).backward(); opt.step()
s = open_live_session(model, (x, y), probes=["lmax"], batch_size=len(x), bn_mode="train")
ref = lanczos_top(CurvatureOperator(s.backend, "hessian"), 4, generator=torch.Generator().manual_seed(11), tol=1e-5)
print("reference", ref.values, [b.value for b in ref.bounds], ref.stop_reason, flush=True)
for starts in (2, 1):
    for seed in range(6):
        r = flatcheck.measure(model, (x, y), probes="lmax", options={"lmax": {**OPTIONS.get("lmax", {}), "starts": starts}}, batch_size=len(x), bn_mode="train", seed=seed).results["lmax"]
        err = abs(r.value - ref.values[0])
        print(f"starts {starts} seed {seed}: {r.value:.6f} ± {r.error_bound:.2e} products {r.matvecs} |err| {err:.2e} within {err <= r.error_bound + ref.bounds[0].value}", flush=True)
