"""`flatcheck invariance` (reparametrisation sensitivity): two runs compared, not one probe."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .kit import Checkpoint, probe_command


@probe_command("invariance", help="Rescale layers without changing the function; show which probes move.")
def invariance_cmd(
    checkpoint: Checkpoint,
    alpha: Annotated[float, typer.Option("--alpha", help="scale factor of the rescaled layer")] = 10.0,
    layer: Annotated[Optional[str], typer.Option("--layer", help="Linear/Conv module to scale up "
                                                 "[default: the first rescalable one]")] = None,
    probes: Annotated[str, typer.Option("--probes", help="probes to compare")] = "trace,gini",
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="PROBE.KEY=VALUE, repeatable")] = None,
):
    from ..config import parse_option_assignments
    from ..workflows.invariance import check_invariance

    def execute(config, progress):
        return check_invariance(config, alpha, layer, progress)

    return probes, parse_option_assignments(option or []), False, execute
