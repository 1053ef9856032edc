"""curvlinops: trace, scipy eigsh and the Lanczos spectrum; HVPs counted as the columns passed to _matmat."""

from __future__ import annotations

import torch

from peers.measure import Counter, timed
from peers.problem import Setup, flat_params, relative_residual
from peers.rows import Row
from peers.tasks import Task

TITLE = "curvlinops"
MODULE = "curvlinops"
DIST = "curvlinops-for-pytorch"


def run(row: Row, setup: Setup, task: Task, tool: str, hints: dict) -> None:
    import curvlinops
    from scipy.sparse.linalg import eigsh

    o = task.opts
    counter = Counter(cap=o.get("power_iter") if task.kind == "eig" else None)
    params = flat_params(setup)

    def make():
        # check_deterministic=False and num_data given: no extra passes over the data at construction
        A = curvlinops.HessianLinearOperator(setup.model, setup.criterion, params, setup.batches,
                                             check_deterministic=False, num_data=setup.n)
        plain = A._matmat

        def counted(M):
            counter.add(M[0].shape[-1])  # list format: trailing axis holds the columns
            return plain(M)

        A._matmat = counted
        return A

    torch.manual_seed(0)
    if task.kind == "trace":
        tr = timed(row, setup, counter, lambda: curvlinops.hutchinson_trace(make(), o["probes"]))
        row.value = f"{float(tr):.5g}"
        row.notes = "hutchinson_trace: A @ G, all probes in one vmapped block per batch; no stderr returned"
    elif task.kind == "eig":
        def go():
            return eigsh(make().to_scipy(), k=o["k"], which="LA", tol=o["tol"])

        vals, vecs = timed(row, setup, counter, go)
        order = list(reversed(range(len(vals))))
        res = max(relative_residual(setup, float(vals[i]), torch.from_numpy(vecs[:, i].copy())) for i in order)
        row.value = ", ".join(f"{float(vals[i]):.7g}" for i in order)
        row.notes = f"scipy eigsh(to_scipy(), k={o['k']}, which='LA', tol={o['tol']:g}); true rel. residual after: {res:.1e}"
    elif task.kind == "slq":
        bounds = hints.get("bounds")

        def go():
            return curvlinops.lanczos_approximate_spectrum(make(), o["steps"], num_points=1024,
                                                           num_repeats=o["starts"], boundaries=bounds)

        grid, dens = timed(row, setup, counter, go)
        grid, dens = grid.double().cpu(), dens.double().cpu()
        dim = sum(p.numel() for p in params)
        tr = dim * torch.trapezoid(grid * dens, grid).item()
        row.value = f"Tr≈{tr:.4g}"
        row.notes = ("lanczos_approximate_spectrum (Papyan 2020, no reorthogonalisation); "
                     + ("boundaries given from flatcheck's nodes, so no eigsh HVPs" if bounds
                        else "boundaries by eigsh (HVPs counted)"))
    else:
        raise ValueError(task.kind)
