"""`flatcheck trace`: probe 1 with its own flags."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..cli import Checkpoint, probe_command


@probe_command("trace", help="Tr(H) or Tr(G) of the loss over the sample set, per layer too.")
def trace_cmd(
    checkpoint: Checkpoint,
    matrix: Annotated[Optional[str], typer.Option("--matrix", help="hessian or ggn [default: hessian; ggn for exact]")] = None,
    estimator: Annotated[str, typer.Option("--estimator", help="hutchinson, hutchpp or exact (GGN only)")] = "hutchinson",
    probes_max: Annotated[int, typer.Option("--probes-max", "--max-probes", help="most matrix-vector products")] = 100,
    rtol: Annotated[Optional[float], typer.Option("--rtol", help="stop Hutchinson once stderr/|trace| < RTOL")] = None,
    class_samples: Annotated[Optional[int], typer.Option("--class-samples", help="exact GGN trace for many classes: "
                                                         "sample K classes per sample, with replacement, ∝ |λ_c|·‖u_c‖² "
                                                         "for the logit Hessian A = Σ_c λ_c u_c u_cᵀ (cross entropy: "
                                                         "p_c·‖e_c − p‖²); unbiased, with stderr")] = None,
    layers: Annotated[bool, typer.Option("--layers/--no-layers", help="per-layer parts; without them the "
                                         "Hessian trace takes a route up to twice as fast (autograd backend)")] = True,
):
    opts = {"matrix": matrix, "estimator": estimator, "probes_max": probes_max, "rtol": rtol,
            "class_samples": class_samples, "parts": layers}
    return ["trace"], {"trace": opts}, layers
