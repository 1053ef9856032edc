"""`flatcheck jacobian | mls | activations | decomposition`: the function-space probes (SPEC 9–12)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..cli import Checkpoint, probe_command

Output = Annotated[str, typer.Option("--output", help="differentiate the logits or softmax(logits)")]


@probe_command("jacobian", help="Input-output Jacobian norms per sample (Frobenius, spectral): mean and max.")
def jacobian_cmd(
    checkpoint: Checkpoint,
    output: Output = "logits",
    exclude_region: Annotated[Optional[str], typer.Option("--exclude-region", help="y,x,h,w: also the Frobenius "
                                                          "norm outside this pixel box, rescaled to its area")] = None,
    method: Annotated[str, typer.Option("--method", help="auto, exact (C backward passes) or estimate "
                                        "(random projections + power iteration)")] = "auto",
    projections: Annotated[int, typer.Option("--projections", help="random output projections per sample "
                                             "(estimate)")] = 64,
):
    opts = {"output": output, "exclude_region": exclude_region, "method": method, "projections": projections}
    return ["jacobian"], {"jacobian": opts}, False


@probe_command("mls", help="MLS, normalized MLS, NMLS, log local volume and local dimensionality, with bounds.")
def mls_cmd(checkpoint: Checkpoint, output: Output = "logits"):
    return ["mls"], {"mls": {"output": output}}, False


@probe_command("activations", help="Activation and death frequency of every ReLU-like layer over the sample set.")
def activations_cmd(checkpoint: Checkpoint):
    return ["activations"], {}, False


@probe_command("decomposition", help="Seed-000 centered decomposition of Tr(G) per layer, its bound, vs exact Tr(G).")
def decomposition_cmd(checkpoint: Checkpoint):
    return ["decomposition"], {}, False
