"""The default `flatcheck lmax` against a PyHessian script, as a user runs each: whole processes.

torchvision's resnet18 (10 classes, random init, seed 0) on 64 CIFAR-shaped samples (uint8
noise in an .npz, labels 0..9), float32, eval-mode BatchNorm. flatcheck runs its command line
with every lmax option at its default (`flatcheck lmax CKPT --spec SPEC --data npz:PATH
--samples 64 --json -`); PyHessian runs a script that builds the same model and batch and calls
`hessian(...).eigenvalues(top_n=1)` at its default tol (1e-3 relative change) and maxIter. Both
count their curvature products (PyHessian's by wrapping the function it calls per product) and
are timed from process start to exit, import and loading included. The runs alternate
(flatcheck, PyHessian, flatcheck, …); the table gives medians and their ratio.

    .venv/bin/python benchmarks/bench_lmax_cli.py [--repeat 3] [--save]

--save writes benchmarks/results/lmax_resnet18.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SAMPLES = 64
MEAN, STD = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]
SPEC = f"""source: torchvision
arch: resnet18
num_classes: 10
input_size: [3, 32, 32]
mean: {MEAN}
std: {STD}
loss: cross_entropy
"""

PYHESSIAN_SCRIPT = """
import json, sys, time
import numpy as np
import torch, torchvision
from safetensors.torch import load_file
import pyhessian
ph = sys.modules["pyhessian.hessian"]
torch.set_num_threads(int(sys.argv[3]))
model = torchvision.models.resnet18(num_classes=10)
model.load_state_dict(load_file(sys.argv[1]))
z = np.load(sys.argv[2])
x = torch.from_numpy(z["x"]).permute(0, 3, 1, 2).float() / 255.0
x = (x - torch.tensor(%r).view(1, 3, 1, 1)) / torch.tensor(%r).view(1, 3, 1, 1)
y = torch.from_numpy(z["y"]).long()
count = [0]
plain = ph.hessian_vector_product
def counted(gradsH, params, v):
    count[0] += 1
    return plain(gradsH, params, v)
ph.hessian_vector_product = counted
model.eval()
torch.manual_seed(0)
t0 = time.perf_counter()
h = ph.hessian(model, torch.nn.CrossEntropyLoss(), data=(x, y), cuda=False)
values, _ = h.eigenvalues(top_n=1)
print(json.dumps({"value": values[0], "products": count[0], "seconds": time.perf_counter() - t0}))
""" % (MEAN, STD)


def make_inputs(folder: Path) -> tuple[Path, Path, Path]:
    import numpy as np
    import torch
    import torchvision
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    ckpt = folder / "resnet18.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    rng = np.random.default_rng(0)
    data = folder / "cifar_like.npz"
    np.savez(data, x=rng.integers(0, 256, (SAMPLES, 32, 32, 3), dtype=np.uint8),
             y=rng.integers(0, 10, SAMPLES).astype(np.int64))
    spec = folder / "resnet18.yaml"
    spec.write_text(SPEC, encoding="utf-8")
    return ckpt, data, spec


def timed(cmd: list[str], env: dict) -> tuple[float, dict]:
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    rows = {"flatcheck": [], "flatcheck1": [], "PyHessian": []}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, data, spec = make_inputs(Path(tmp))
        script = Path(tmp) / "pyhessian_lmax.py"
        script.write_text(PYHESSIAN_SCRIPT, encoding="utf-8")
        flat = [sys.executable, "-m", "flatcheck", "lmax", str(ckpt), "--spec", str(spec), "--data", f"npz:{data}",
                "--samples", str(SAMPLES), "--json", "-", "-q"]
        peer = [sys.executable, str(script), str(ckpt), str(data), str(args.threads)]
        for i in range(args.repeat):
            for name, extra in (("flatcheck", []), ("flatcheck1", ["--starts", "1"])):
                wall, out = timed(flat + extra, env)
                r = out["results"]["lmax"]
                rows[name].append({"wall": wall, "products": r["matvecs"], "value": r["value"],
                                   "bound": r["error_bound"], "probe_seconds": r["seconds"],
                                   "how": r["details"]["bound"][0]})
            wall, out = timed(peer, env)
            rows["PyHessian"].append({"wall": wall, "products": out["products"], "value": out["value"],
                                      "probe_seconds": out["seconds"]})
            print(f"run {i + 1}: flatcheck {rows['flatcheck'][-1]}, --starts 1 {rows['flatcheck1'][-1]}, "
                  f"PyHessian {rows['PyHessian'][-1]}", flush=True)
    text = table(rows, args)
    print(text)
    if args.save:
        out = RESULTS / "lmax_resnet18.md"
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)


def table(rows: dict, args) -> str:
    def med(tool: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[tool])

    f, f1, p = rows["flatcheck"], rows["flatcheck1"], rows["PyHessian"]
    load = os.getloadavg()
    return "\n".join([
        "# Default `flatcheck lmax` vs PyHessian `eigenvalues(top_n=1)`, whole processes",
        "",
        f"torchvision resnet18 (10 classes, random init), {SAMPLES} CIFAR-shaped samples, float32, CPU "
        f"({platform.machine()}, {os.cpu_count()} logical CPUs, {args.threads} thread(s) each). "
        f"{args.repeat} runs of each, alternating; medians. The machine was shared with other jobs (load "
        f"average at the end {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}): times are inflated, the ratios are "
        "what count. Command: `benchmarks/bench_lmax_cli.py --repeat {0} --threads {1}`.".format(args.repeat,
                                                                                                  args.threads),
        "",
        "| tool | process wall (s) | probe (s) | products | λmax | certified bound |",
        "|---|---:|---:|---:|---:|---|",
        f"| flatcheck lmax (defaults: k = 1, tol 1e-3, block of 2 starts) | {med('flatcheck', 'wall'):.1f} | "
        f"{med('flatcheck', 'probe_seconds'):.1f} | {med('flatcheck', 'products'):g} | {f[0]['value']:.6g} | "
        f"{f[0]['bound']:.1e} ({f[0]['how']}) |",
        f"| flatcheck lmax --starts 1 (one vector) | {med('flatcheck1', 'wall'):.1f} | "
        f"{med('flatcheck1', 'probe_seconds'):.1f} | {med('flatcheck1', 'products'):g} | {f1[0]['value']:.6g} | "
        f"{f1[0]['bound']:.1e} ({f1[0]['how']}) |",
        f"| PyHessian eigenvalues(top_n=1) (tol 1e-3 on \\|Δλ\\|/\\|λ\\|) | {med('PyHessian', 'wall'):.1f} | "
        f"{med('PyHessian', 'probe_seconds'):.1f} | {med('PyHessian', 'products'):g} | {p[0]['value']:.6g} | none |",
        "",
        f"- process wall time, flatcheck ÷ PyHessian: {med('flatcheck', 'wall') / med('PyHessian', 'wall'):.2f} "
        "(goal ≤ 1.2)",
        f"- products, flatcheck ÷ PyHessian: {med('flatcheck', 'products') / med('PyHessian', 'products'):.2f} "
        "(goal ≤ 1)",
        f"- --starts 1: wall ÷ PyHessian {med('flatcheck1', 'wall') / med('PyHessian', 'wall'):.2f}, products "
        f"÷ PyHessian {med('flatcheck1', 'products') / med('PyHessian', 'products'):.2f}",
        f"- every run: flatcheck {[round(r['wall'], 1) for r in f]} s, {[r['products'] for r in f]} products; "
        f"--starts 1 {[round(r['wall'], 1) for r in f1]} s, {[r['products'] for r in f1]} products; "
        f"PyHessian {[round(r['wall'], 1) for r in p]} s, {[r['products'] for r in p]} products",
        "",
    ])


if __name__ == "__main__":
    main()
