"""hessian-eigenthings: trace, Lanczos or deflated power iteration, spectral density.

HVPs are counted at HessianOperator.matvec.
"""

from __future__ import annotations

from peers.measure import Counter, timed
from peers.problem import Setup, flat_params, relative_residual
from peers.rows import Row
from peers.tasks import Task

TITLE = "hessian-eigenthings"
MODULE = "hessian_eigenthings"
DIST = "hessian-eigenthings"


def run(row: Row, setup: Setup, task: Task, tool: str, hints: dict) -> None:
    import hessian_eigenthings as he

    o = task.opts
    counter = Counter()

    def make():
        op = he.HessianOperator(setup.model, setup.batches, he.supervised_loss(setup.criterion), full_dataset=True)
        plain = op.matvec

        def counted(v):
            counter.add()
            return plain(v)

        op.matvec = counted
        return op

    variant = tool.split(":", 1)[1] if ":" in tool else ""
    if task.kind == "trace":
        res = timed(row, setup, counter, lambda: he.hutchinson(make(), num_samples=o["probes"], seed=0))
        row.value = f"{res.estimate:.5g} ± {res.stderr:.2g}"
        row.notes = "hutchinson(HessianOperator): one forward + double backward per probe and batch"
    elif task.kind == "eig" and variant == "lanczos":
        steps = max(hints.get("steps", 2 * o["k"]), o["k"])
        res = timed(row, setup, counter, lambda: he.lanczos(make(), k=o["k"], max_iter=steps, tol=o["tol"],
                                                             which="LA", seed=0, reorthogonalize=True))
        vals = res.eigenvalues.tolist()
        true = max(relative_residual(setup, v, res.eigenvectors[i]) for i, v in enumerate(vals))
        row.value = ", ".join(f"{v:.7g}" for v in vals)
        row.notes = (f"lanczos with flatcheck's step count ({steps}; it has no stopping rule), "
                     f"{int(res.converged.sum())}/{len(vals)} converged by its estimate; true rel. residual {true:.1e}")
    elif task.kind == "eig":
        res = timed(row, setup, counter, lambda: he.deflated_power_iteration(
            make(), k=o["k"], max_iter=o["power_iter"], tol=o["tol"], seed=0))
        vals = res.eigenvalues.tolist()
        true = max(relative_residual(setup, v, res.eigenvectors[i]) for i, v in enumerate(vals))
        row.value = ", ".join(f"{v:.7g}" for v in vals)
        row.notes = (f"deflated power iteration (stops on rel. change and rel. residual < tol), "
                     f"{int(res.converged.sum())}/{len(vals)} converged within {o['power_iter']}; "
                     f"true rel. residual {true:.1e}")
    elif task.kind == "slq":
        res = timed(row, setup, counter, lambda: he.spectral_density(make(), num_runs=o["starts"],
                                                                      lanczos_steps=o["steps"], seed=0))
        nodes, w = res.raw_eigenvalues.double().nan_to_num(0.0), res.raw_weights.double()
        dim = sum(p.numel() for p in flat_params(setup))
        row.value = f"Tr≈{dim * (nodes * w).sum(1).mean().item():.4g}"
        row.notes = "spectral_density (full reorthogonalisation)"
    else:
        raise ValueError(task.kind)
