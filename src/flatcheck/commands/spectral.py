"""`flatcheck lmax`, `flatcheck spectrum` and `flatcheck rank`: probes 2–4 with their own flags."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..cli import Checkpoint, probe_command
from ..errors import ConfigError

Matrix = Annotated[str, typer.Option("--matrix", help="hessian or ggn")]
Steps = Annotated[int, typer.Option("--lanczos-steps", help="Lanczos steps (quadrature nodes) per start vector")]
Starts = Annotated[int, typer.Option("--starts", help="Rademacher start vectors (≥ 2, for a standard error)")]


@probe_command("lmax", help="Top-k eigenvalues of H or G (largest algebraic first), with residuals.")
def lmax_cmd(
    checkpoint: Checkpoint,
    k: Annotated[int, typer.Option("--k", help="how many of the largest eigenvalues")] = 5,
    matrix: Matrix = "hessian",
    method: Annotated[str, typer.Option("--method", help="lanczos (full reorthogonalisation) or power "
                                        "(power finds the largest |λ|)")] = "lanczos",
    tol: Annotated[float, typer.Option("--tol", help="stop when every ‖Hq − λq‖ ≤ TOL·|λ|")] = 1e-6,
    max_iter: Annotated[Optional[int], typer.Option("--max-iter", help="most Lanczos steps, or power iterations "
                                                    "per eigenvalue [default: max(300, 20k); power 1000]")] = None,
):
    opts = {"k": k, "matrix": matrix, "method": method, "tol": tol, "max_iter": max_iter}
    return ["lmax"], {"lmax": opts}, False


@probe_command("spectrum", help="Eigenvalue density of H or G by stochastic Lanczos quadrature; Tr, Tr², norms.")
def spectrum_cmd(
    checkpoint: Checkpoint,
    matrix: Matrix = "hessian",
    lanczos_steps: Steps = 100,
    starts: Starts = 3,
    plot: Annotated[Optional[str], typer.Option("--plot", help="write the density to PATH.png (log y-axis; "
                                                "needs matplotlib)")] = None,
    sigma: Annotated[str, typer.Option("--sigma", help="Gaussian kernel width of the density, or auto "
                                       "(node span / (2·steps))")] = "auto",
):
    opts = {"matrix": matrix, "lanczos_steps": lanczos_steps, "starts": starts, "plot": plot,
            "sigma": _sigma(sigma)}
    return ["spectrum"], {"spectrum": opts}, False


@probe_command("rank", help="Rank degeneracy at the origin (SLQ) beside the paper's and the batch rank bounds.")
def rank_cmd(
    checkpoint: Checkpoint,
    matrix: Matrix = "ggn",
    lanczos_steps: Steps = 100,
    starts: Starts = 3,
):
    opts = {"matrix": matrix, "lanczos_steps": lanczos_steps, "starts": starts}
    return ["rank"], {"rank": opts}, False


def _sigma(text: str) -> float | None:
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--sigma must be 'auto' or a positive number, got {text!r}") from None
