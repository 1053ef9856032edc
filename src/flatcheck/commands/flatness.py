"""`flatcheck head-trace`, `relative-flatness` and `adaptive-sharpness` (probes 7, 6 and 5)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..cli import Checkpoint, probe_command

_HEAD = typer.Option("--head", help="module name of the final linear layer [default: the spec's head, "
                                    "else the last Linear / 1x1 Conv2d]")


@probe_command("head-trace", help="Exact Hessian trace w.r.t. the final linear layer (closed form), with "
                                  "relative flatness; --verify recomputes it with autograd.")
def head_trace_cmd(
    checkpoint: Checkpoint,
    verify: Annotated[bool, typer.Option("--verify", help="recompute the head's Hessian diagonal with autograd "
                                                          "and print both")] = False,
    verify_max: Annotated[int, typer.Option("--verify-max", help="most head coordinates --verify computes "
                                                                 "(a seeded random subset above it)")] = 4096,
    head: Annotated[Optional[str], _HEAD] = None,
    layers: Annotated[bool, typer.Option("--layers/--no-layers", help="show weight and bias parts")] = True,
):
    return ["head-trace"], {"head-trace": {"verify": verify, "verify_max": verify_max, "head": head}}, layers


@probe_command("relative-flatness", help="Relative flatness κ of the final linear layer (closed form, "
                                         "per-class parts in the JSON).")
def relative_flatness_cmd(
    checkpoint: Checkpoint,
    head: Annotated[Optional[str], _HEAD] = None,
):
    return ["relative-flatness"], {"relative-flatness": {"head": head}}, False


@probe_command("adaptive-sharpness", help="Elementwise adaptive sharpness: Monte Carlo over ±δ noise pairs "
                                          "and its second-order Hutchinson form.")
def adaptive_sharpness_cmd(
    checkpoint: Checkpoint,
    rho: Annotated[float, typer.Option("--rho", help="relative noise scale: δ ~ N(0, ρ² |w|²)")] = 0.0005,
    noise_draws: Annotated[int, typer.Option("--noise-draws", help="Monte Carlo draws δ (each at +δ and −δ)")] = 16,
    loss: Annotated[Optional[str], typer.Option("--loss", help="loss for this probe: cross_entropy, mse, "
                                                "sigmoid_mse or label_smoothing [default: the spec's]")] = None,
    method: Annotated[str, typer.Option("--method", help="mc, second-order or both")] = "both",
    probes_max: Annotated[int, typer.Option("--probes-max", "--max-probes",
                                            help="Hutchinson probes of the second-order form")] = 100,
):
    opts = {"rho": rho, "noise_draws": noise_draws, "loss": loss, "method": method, "probes_max": probes_max}
    return ["adaptive-sharpness"], {"adaptive-sharpness": opts}, False
