"""PyHessian: trace, power-iteration eigenvalues and density; HVPs counted by wrapping its product functions."""

from __future__ import annotations

import sys
from typing import Any

import torch

from peers.measure import Counter, timed
from peers.problem import Setup, relative_residual
from peers.rows import Row
from peers.tasks import Task

TITLE = "PyHessian"
MODULE = "pyhessian"
DIST = "pyhessian"


def run(row: Row, setup: Setup, task: Task, tool: str, hints: dict) -> None:
    import pyhessian  # noqa: F401  (the package re-exports the class under the module's name)

    ph = sys.modules["pyhessian.hessian"]

    o = task.opts
    counter = Counter()
    plain = ph.hessian_vector_product

    def counted_hvp(gradsH, params, v):
        counter.add()
        return plain(gradsH, params, v)

    ph.hessian_vector_product = counted_hvp  # the name hessian.py calls
    one = len(setup.batches) == 1
    cuda = setup.device.type == "cuda"
    state: dict[str, Any] = {}

    def make():
        if one:
            h = ph.hessian(setup.model, setup.criterion, data=setup.batches[0], cuda=cuda)
        else:
            h = ph.hessian(setup.model, setup.criterion, dataloader=setup.batches, cuda=cuda)
        full = h.dataloader_hv_product

        def counted_full(v):
            counter.add()
            return full(v)

        h.dataloader_hv_product = counted_full
        state["h"] = h
        return h

    torch.manual_seed(0)
    mode = "single-batch mode (graph kept)" if one else "dataloader mode"
    if task.kind == "trace":
        # trace() stops once the running mean changes by < tol relatively; -inf: exactly maxIter probes
        vals = timed(row, setup, counter, lambda: make().trace(maxIter=o["probes"], tol=float("-inf")))
        m = len(vals)
        mean = sum(vals) / m
        se = (sum((x - mean) ** 2 for x in vals) / (m - 1)) ** 0.5 / m**0.5 if m > 1 else float("nan")
        row.value = f"{mean:.5g} ± {se:.2g}"
        row.notes = f"{mode}; hessian(...).trace(maxIter={o['probes']}, tol=-inf)"
    elif task.kind == "eig":
        vals, vecs = timed(row, setup, counter,
                            lambda: make().eigenvalues(maxIter=o["power_iter"], tol=o["tol"], top_n=o["k"]))
        res = max(relative_residual(setup, lam, v) for lam, v in zip(vals, vecs))
        row.value = ", ".join(f"{v:.7g}" for v in vals)
        row.notes = (f"power iteration, {mode}; stops on |Δλ|/|λ| < tol (not a residual), maxIter "
                     f"{o['power_iter']} per eigenvalue; true rel. residual after: {res:.1e}")
        row.extra.update(values=vals)
    elif task.kind == "slq":
        timed(row, setup, counter, lambda: make().density(iter=o["steps"], n_v=o["starts"]))
        row.value = "ok"
        row.notes = f"density(iter={o['steps']}, n_v={o['starts']})"
    else:
        raise ValueError(task.kind)
