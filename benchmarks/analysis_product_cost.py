"""What a Hessian-vector product costs against a training step, on bench_tracker's two runs:
the floor under the share of a training run that tracking λmax can take.

For the demo CNN (500 digits, BatchNorm on the batch's statistics) and the tanh MLP (1,000
digits), in one process, medians of interleaved repetitions: a training step's forward and
backward; the first-order graph a product is taken through (forward and backward with
create_graph), which a tracked step builds once and its products share; one double backward
through that graph (what each further product costs), by the scalar ⟨g, v⟩ as the autograd
backend takes it and by grad_outputs; and forward-over-reverse (torch.func jvp of grad), where
the model allows it.

    python benchmarks/analysis_product_cost.py [--reps 15]

Results and what they mean: benchmarks/results/tracker.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_tracker import RUNS, make_model, track_training  # noqa: E402


def costs(kind: str, reps: int) -> dict[str, float]:
    _, samples, _, _ = RUNS[kind]
    x, y = track_training.digits(samples)
    torch.manual_seed(0)
    model = make_model(kind)
    model.train()
    params = list(model.parameters())
    v = [torch.randn_like(p) for p in params]

    def train():
        model.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()

    def build():
        return torch.autograd.grad(nn.functional.cross_entropy(model(x), y), params, create_graph=True)

    graph = build()

    def inner():
        torch.autograd.grad(sum((g * u).sum() for g, u in zip(graph, v)), params, retain_graph=True)

    def outputs():
        torch.autograd.grad(graph, params, grad_outputs=v, retain_graph=True)

    tasks = {"training step": train, "graph build": build, "double backward (⟨g, v⟩)": inner,
             "double backward (grad_outputs)": outputs}
    try:
        from torch.func import functional_call, grad, jvp

        names = [n for n, _ in model.named_parameters()]

        def loss(ps):
            return nn.functional.cross_entropy(functional_call(model, dict(zip(names, ps)), (x,)), y)

        def forward_over_reverse():
            jvp(grad(loss), (tuple(params),), (tuple(v),))

        forward_over_reverse()
        tasks["forward-over-reverse"] = forward_over_reverse
    except RuntimeError:  # BatchNorm's running statistics are written in place: torch.func refuses
        pass
    times: dict[str, list[float]] = {name: [] for name in tasks}
    for name, task in tasks.items():
        task()  # warm
    for _ in range(reps):
        for name, task in tasks.items():
            start = time.perf_counter()
            task()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    for kind in RUNS:
        found = costs(kind, args.reps)
        step = found["training step"]
        for name, seconds in found.items():
            print(f"{kind}: {name}: {seconds * 1e3:.1f} ms, {seconds / step:.2f} training steps")


if __name__ == "__main__":
    main()
