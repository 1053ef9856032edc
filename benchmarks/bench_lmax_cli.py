"""The default `flatcheck lmax` against a PyHessian script, as a user runs each: whole processes.

torchvision's resnet18 (10 classes, random init, seed 0) on 64 CIFAR-shaped samples (uint8
noise in an .npz, labels 0..9), float32, eval-mode BatchNorm. flatcheck runs its command line
with every lmax option at its default (`flatcheck lmax CKPT --spec SPEC --data npz:PATH
--samples 64 --json -`); PyHessian runs a script that builds the same model and batch and calls
`hessian(...).eigenvalues(top_n=1)` at its default tol (1e-3 relative change) and maxIter. Both
count their curvature products (PyHessian's by wrapping the function it calls per product) and
are timed from process start to exit, import and loading included. Each seed is the random
start of both (flatcheck's --seed, PyHessian's torch.manual_seed): a count at one seed favours
whichever tool that start happens to suit, so the runs go over seeds, alternating (flatcheck,
PyHessian, flatcheck, …), and the table gives medians over them and their ratio.

    .venv/bin/python benchmarks/bench_lmax_cli.py [--seeds 0,1,2,3,4] [--save]

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
torch.manual_seed(int(sys.argv[4]))
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
    ap.add_argument("--seeds", default=",".join(map(str, range(12))),
                    help="random starts, comma-separated: each seed is one run of each tool, interleaved")
    ap.add_argument("--one-vector", action="store_true", help="also run `flatcheck lmax --starts 1` a seed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    rows = {"flatcheck": [], "flatcheck1": [], "PyHessian": []}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, data, spec = make_inputs(Path(tmp))
        script = Path(tmp) / "pyhessian_lmax.py"
        script.write_text(PYHESSIAN_SCRIPT, encoding="utf-8")
        flat = [sys.executable, "-m", "flatcheck", "lmax", str(ckpt), "--spec", str(spec), "--data", f"npz:{data}",
                "--samples", str(SAMPLES), "--json", "-", "-q"]
        for seed in seeds:
            for name, extra in (("flatcheck", []), ("flatcheck1", ["--starts", "1"]))[:2 if args.one_vector else 1]:
                wall, out = timed(flat + extra + ["--seed", str(seed)], env)
                r = out["results"]["lmax"]
                rows[name].append({"seed": seed, "wall": wall, "products": r["matvecs"], "value": r["value"],
                                   "bound": r["error_bound"], "probe_seconds": r["seconds"],
                                   "how": r["details"]["bound"][0]})
            wall, out = timed([sys.executable, str(script), str(ckpt), str(data), str(args.threads), str(seed)], env)
            rows["PyHessian"].append({"seed": seed, "wall": wall, "products": out["products"], "value": out["value"],
                                      "probe_seconds": out["seconds"]})
            print(f"seed {seed}: " + ", ".join(f"{name} {runs[-1]}" for name, runs in rows.items() if runs), flush=True)
    text = table(rows, args, seeds)
    print(text)
    if args.save:
        save(text)


def save(text: str) -> None:
    """The generated part of lmax_resnet18.md (up to its first `## `) replaced, the notes after kept."""
    out = RESULTS / "lmax_resnet18.md"
    old = out.read_text(encoding="utf-8") if out.exists() else ""
    notes = old[old.index("\n## "):] if "\n## " in old else ""
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text.rstrip("\n") + "\n" + notes, encoding="utf-8")
    tmp.replace(out)


def table(rows: dict, args, seeds: list[int]) -> str:
    def med(tool: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[tool])

    f, f1, p = rows["flatcheck"], rows["flatcheck1"], rows["PyHessian"]
    load = os.getloadavg()
    pairs = [a["wall"] / b["wall"] for a, b in zip(f, p)]
    fewer = sum(a["products"] <= b["products"] for a, b in zip(f, p))
    bounds = ", ".join(f"{r['bound']:.2g}" for r in f)
    lines = [
        "# Default `flatcheck lmax` vs PyHessian `eigenvalues(top_n=1)`, whole processes",
        "",
        f"torchvision resnet18 (10 classes, random init), {SAMPLES} CIFAR-shaped samples, float32, CPU "
        f"({platform.machine()}, {os.cpu_count()} logical CPUs, {args.threads} thread(s) each). "
        f"Random starts (seeds) {seeds}: one run of each tool a seed, alternating; medians over the seeds. "
        f"Load average at the end {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} (a shared machine: the times "
        f"are inflated, the ratios are what count; products do not depend on the load). Command: "
        f"`benchmarks/bench_lmax_cli.py --seeds {args.seeds} --threads {args.threads}`.",
        "",
        "| tool | process wall (s) | probe (s) | products | products by seed | λmax (first seed) | certified bound |",
        "|---|---:|---:|---:|---|---:|---|",
        f"| flatcheck lmax (defaults: k = 1, tol 1e-3, block of 2 starts) | {med('flatcheck', 'wall'):.1f} | "
        f"{med('flatcheck', 'probe_seconds'):.1f} | {med('flatcheck', 'products'):g} | "
        f"{', '.join(str(r['products']) for r in f)} | {f[0]['value']:.6g} | {f[0]['bound']:.1e} ({f[0]['how']}) |",
        f"| PyHessian eigenvalues(top_n=1) (tol 1e-3 on \\|Δλ\\|/\\|λ\\|) | {med('PyHessian', 'wall'):.1f} | "
        f"{med('PyHessian', 'probe_seconds'):.1f} | {med('PyHessian', 'products'):g} | "
        f"{', '.join(str(r['products']) for r in p)} | {p[0]['value']:.6g} | none |",
        "",
        f"- process wall time, flatcheck ÷ PyHessian, per seed (the pair run back to back): "
        f"{', '.join(f'{x:.2f}' for x in pairs)}; median {statistics.median(pairs):.2f} (goal ≤ 1.2)",
        f"- products, median flatcheck ÷ median PyHessian: "
        f"{med('flatcheck', 'products') / med('PyHessian', 'products'):.2f} (goal ≤ 1); flatcheck took no more "
        f"than PyHessian on {fewer} of {len(seeds)} seeds; means {statistics.mean(r['products'] for r in f):.1f} "
        f"and {statistics.mean(r['products'] for r in p):.1f}",
        f"- λmax by seed: flatcheck {[round(r['value'], 4) for r in f]} (bounds {bounds}); "
        f"PyHessian {[round(r['value'], 4) for r in p]}",
        "",
    ]
    if f1:  # --one-vector
        lines[7:7] = [
            f"| flatcheck lmax --starts 1 (one vector) | {med('flatcheck1', 'wall'):.1f} | "
            f"{med('flatcheck1', 'probe_seconds'):.1f} | {med('flatcheck1', 'products'):g} | "
            f"{', '.join(str(r['products']) for r in f1)} | {f1[0]['value']:.6g} | {f1[0]['bound']:.1e} "
            f"({f1[0]['how']}) |"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
