"""Head-trace benchmark in the shape of Taleghani et al. 2026, Tables 1–2: the Hessian trace of the loss
w.r.t. the final linear layer of a GAP CNN, by four methods, for growing batch size and
number of classes.

  closed form   flatcheck.probes._head: (1/N) Σ_n Tr(A_n)(‖φ_n‖² + 1), one forward
  autograd      the exact diagonal, one Hessian-vector product per head coordinate (reference)
  hutchinson    500 Rademacher probes through the same HVPs, with its standard error
  torch.func    vmap over basis vectors of a forward-over-reverse HVP, diagonal only

The network has random weights and the inputs are uniform on [0, 1) (as in Taleghani et al. 2026, §5.1), one
batch of B samples. Absolute errors are against the autograd value; times are wall-clock
seconds of one run on this machine (the closed form: best of three, it is milliseconds).

    python benchmarks/bench_head_trace.py [--full] [--dtype float32]
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table
from torch import nn
from torch.func import functional_call, grad, jvp, vmap
from torch.utils.data import TensorDataset

from flatcheck.backends import ParamLayout, create_backend
from flatcheck.problem import Problem, model_mode
from flatcheck.data.batches import SampleSet
from flatcheck.probes._head import head_statistics, resolve_head
from flatcheck.linalg import hutchinson
from flatcheck.losses import per_sample_loss
from flatcheck.models.spec import LossSpec
from flatcheck.operators import CurvatureOperator
from flatcheck.probes.head_trace import hessian_diagonal

HUTCHINSON_PROBES = 500


def gap_cnn(classes: int, width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width // 2, 3, padding=1), nn.ReLU(), nn.Conv2d(width // 2, width, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes),
    )


def problems(batch: int, classes: int, width: int, size: int, dtype: torch.dtype) -> tuple[Problem, Problem]:
    """The whole-model problem (for the closed form) and the head-only one (for the HVP methods)."""
    torch.manual_seed(0)
    model = gap_cnn(classes, width).to(dtype).eval()
    g = torch.Generator().manual_seed(1)
    X = torch.rand(batch, 3, size, size, generator=g, dtype=dtype)
    Y = torch.randint(0, classes, (batch,), generator=g)
    samples = SampleSet(TensorDataset(X, Y), samples=batch, batch_size=batch, dtype=dtype)
    full = Problem(model, LossSpec(), samples, ParamLayout.from_model(model))
    head = Problem(model, LossSpec(), samples, ParamLayout.from_model(model, ("6.weight", "6.bias")))
    return full, head


def timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def closed_form(problem: Problem) -> float:
    backend = create_backend("autograd", problem)
    return head_statistics(backend, resolve_head(problem.model, None)).trace


def autograd_exact(problem: Problem) -> float:
    backend = create_backend("autograd", problem)
    return hessian_diagonal(backend, torch.arange(problem.layout.dim), block=256).sum().item()


def hutchinson_500(problem: Problem) -> tuple[float, float]:
    op = CurvatureOperator(create_backend("autograd", problem), "hessian")
    est = hutchinson(op, generator=torch.Generator().manual_seed(0), max_probes=HUTCHINSON_PROBES, block_size=100)
    return est.value, est.stderr


def torch_func(problem: Problem, chunk: int = 256) -> float:
    model, layout = problem.model, problem.layout
    frozen = {n: p.detach() for n, p in model.named_parameters() if n not in layout.names}
    frozen.update(dict(model.named_buffers()))
    batch = next(iter(problem.samples))
    theta0 = torch.cat([p.detach().reshape(-1) for p in layout.params(model)])

    def loss(theta):
        chosen = {n: t.view(s) for n, t, s in zip(layout.names, theta.split(layout.sizes), layout.shapes)}
        return per_sample_loss(functional_call(model, (chosen, frozen), (batch.x,)), batch.y, problem.loss).mean()

    def hvp(v):
        return jvp(grad(loss), (theta0,), (v,))[1]

    total = 0.0
    with model_mode(model, problem.bn_mode):
        for start in range(0, theta0.numel(), chunk):
            idx = torch.arange(start, min(start + chunk, theta0.numel()))
            E = torch.zeros(len(idx), theta0.numel(), dtype=theta0.dtype)
            E[torch.arange(len(idx)), idx] = 1
            total += vmap(hvp)(E)[torch.arange(len(idx)), idx].sum().item()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="larger batches and class counts")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    batches, classes = ([16, 64, 256, 1024], [10, 100, 500]) if args.full else ([16, 64, 256], [10, 100])
    width, size = (64, 32) if args.full else (32, 16)

    table = Table(title=f"Head Hessian trace of a GAP CNN (width {width}, {size}×{size} inputs, {args.dtype}, "
                        f"random weights): |error| vs autograd and seconds", title_justify="left")
    for col in ("B", "C", "P head", "Tr (autograd)", "closed |err|", "closed s", "autograd s",
                f"hutch{HUTCHINSON_PROBES} |err| (se)", "hutch s", "func |err|", "func s", "speed-up"):
        table.add_column(col, justify="right", no_wrap=True)
    warm = problems(8, 4, width, size, dtype)  # first calls pay for lazy initialisation; not timed
    closed_form(warm[0]), autograd_exact(warm[1]), hutchinson_500(warm[1]), torch_func(warm[1])
    console = Console(width=max(Console().width, 150))  # a 12-column table; pipes get 80 columns otherwise
    for c in classes:
        for b in batches:
            full, head = problems(b, c, width, size, dtype)
            exact, t_auto = timed(lambda: autograd_exact(head))
            closed, t_closed = timed(lambda: closed_form(full), repeat=3)
            (hutch, se), t_hutch = timed(lambda: hutchinson_500(head))
            func, t_func = timed(lambda: torch_func(head))
            table.add_row(
                str(b), str(c), f"{head.layout.dim:,}", f"{exact:.8g}", f"{abs(closed - exact):.1e}",
                f"{t_closed:.4f}", f"{t_auto:.3f}", f"{abs(hutch - exact):.1e} ({se:.1e})", f"{t_hutch:.3f}",
                f"{abs(func - exact):.1e}", f"{t_func:.3f}", f"{t_auto / t_closed:,.0f}x",
            )
    console.print(table)
    console.print("speed-up = autograd s / closed-form s (both include the forward). The closed form's and "
                  "torch.func's errors are rounding; Hutchinson's is sampling error (se = its standard error).")


if __name__ == "__main__":
    main()
