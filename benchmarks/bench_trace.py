"""Trace benchmark: HVP cost against a gradient, and the exact GGN trace against Hutchinson.

For each model: one gradient over the sample set; a block of HVPs (time per HVP and the
ratio to a gradient); Hutchinson on the GGN with m probes, from which the number of probes
(and the time) needed for a 1 % relative standard error is extrapolated; the exact GGN
trace, which has zero variance, timed once. Numbers come from one run on this machine.

    python benchmarks/bench_trace.py [--full]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from flatcheck.backends import ParamLayout, create_backend
from flatcheck.problem import Problem, model_mode
from flatcheck.data.batches import SampleSet
from flatcheck.data.preprocess import Preprocess
from flatcheck.data.registry import create_dataset
from flatcheck.linalg import hutchinson
from flatcheck.losses import per_sample_loss
from flatcheck.models.checkpoint import apply_state_dict, load_checkpoint
from flatcheck.models.sources import build_model
from flatcheck.models.spec import load_spec
from flatcheck.operators import CurvatureOperator

ROOT = Path(__file__).resolve().parents[1]


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def problem_for(spec_name: str, data: str, samples: int, batch: int, checkpoint: Path | None) -> Problem:
    spec = load_spec(ROOT / "model_specs" / spec_name)
    torch.manual_seed(0)
    model = build_model(spec)
    if checkpoint is not None:
        apply_state_dict(model, load_checkpoint(checkpoint).state_dict)
    pre = Preprocess(input_size=spec.input_size, mean=spec.mean, std=spec.std)
    ds = create_dataset(data, split="train", preprocess=pre, num_classes=spec.num_classes)
    s = SampleSet(ds, samples=samples, batch_size=batch)
    return Problem(model, spec.loss, s, ParamLayout.from_model(model))


def gradient_seconds(p: Problem) -> float:
    params = p.layout.params(p.model)

    def grad():
        with model_mode(p.model, p.bn_mode):
            for b in p.samples:
                loss = per_sample_loss(p.model(b.x), b.y, p.loss).mean() * b.weight
                torch.autograd.grad(loss, params)

    grad()  # warm-up
    return timed(grad)[1]


def bench(name: str, p: Problem, hvp_block: int, probes: int) -> dict:
    backend = create_backend("autograd", p)
    g = gradient_seconds(p)
    V = torch.randn(hvp_block, p.layout.dim)
    backend.hvp(V[:1])  # warm-up (and builds the cached graph when there is one batch)
    _, t_block = timed(lambda: backend.hvp(V))
    op = CurvatureOperator(backend, "ggn")
    est, t_h = timed(lambda: hutchinson(op, generator=torch.Generator().manual_seed(0), max_probes=probes))
    per_probe = t_h / probes
    need = math.ceil((est.stderr * math.sqrt(probes) / (0.01 * abs(est.value))) ** 2)
    exact, t_exact = timed(lambda: backend.ggn_trace().per_param.sum().item())
    return {
        "model": name, "P": p.layout.dim, "N": p.samples.n, "batches": p.samples.num_batches,
        "grad_s": g, "hvp_s": t_block / hvp_block, "ratio": t_block / hvp_block / g,
        "ggn_hutch": f"{est.value:.4g} ± {est.stderr:.2g}", "exact": f"{exact:.4g}",
        "probes_1pct": need, "hutch_1pct_s": need * per_probe, "exact_s": t_exact, "exact_in_grads": t_exact / g,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="bigger sample sets (GPU-sized)")
    args = ap.parse_args()
    scale = 8 if args.full else 1
    rows = [
        bench("demo DigitsCNN (digits)", problem_for("demo_digits.yaml", "digits", 1000, 128,
                                                      ROOT / "demo" / "digits_cnn.safetensors"), 8, 40),
        bench("ResNet-18 CIFAR (synthetic, 1 batch)", problem_for("resnet18_cifar.yaml", "synthetic", 16 * scale,
                                                                  16 * scale, None), 4, 8),
    ]
    table = Table(title=f"flatcheck trace benchmark · torch {torch.__version__} · "
                        f"{torch.get_num_threads()} threads · cpu · one run")
    table.add_column("")
    for r in rows:
        table.add_column(r["model"], justify="right")
    metrics = [
        ("parameters P", lambda r: f"{r['P']:,}"), ("samples N / batches", lambda r: f"{r['N']} / {r['batches']}"),
        ("gradient (s)", lambda r: f"{r['grad_s']:.3f}"), ("HVP (s, per vector)", lambda r: f"{r['hvp_s']:.3f}"),
        ("HVP ÷ gradient", lambda r: f"{r['ratio']:.2f}"), ("Tr(G) Hutchinson", lambda r: r["ggn_hutch"]),
        ("Tr(G) exact", lambda r: r["exact"]), ("Hutchinson probes for 1 % stderr", lambda r: str(r["probes_1pct"])),
        ("Hutchinson time for 1 % (s)", lambda r: f"{r['hutch_1pct_s']:.1f}"),
        ("exact Tr(G) time (s)", lambda r: f"{r['exact_s']:.2f}"),
        ("exact Tr(G) ÷ gradient", lambda r: f"{r['exact_in_grads']:.1f}"),
    ]
    for label, get in metrics:
        table.add_row(label, *[get(r) for r in rows])
    Console().print(table)


if __name__ == "__main__":
    sys.exit(main())
