"""`flatcheck gate`: rules from a YAML file, decided on one checkpoint; exit 1 when one fails."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .kit import READS, WRITES, Checkpoint, probe_command


@probe_command("gate", help="Check probe results against the rules of a gates YAML file (exit 1 on failure).")
def gate_cmd(
    checkpoint: Checkpoint,
    config: Annotated[Path, typer.Option("--config", help="gates YAML: probes, their options and rules"), READS],
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="JSON report of an earlier run, for "
                                                     "max_increase/max_decrease rules"), READS] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", help="write JUnit XML (one testcase per rule)"),
                     WRITES] = None,
    summary: Annotated[Optional[Path], typer.Option("--summary", help="write a Markdown summary "
                                                    "(e.g. $GITHUB_STEP_SUMMARY)"), WRITES] = None,
    confidence: Annotated[Optional[float], typer.Option("--confidence", help="level of the intervals of "
                                                        "stochastic values [default: the file's, else 0.95]")] = None,
    allow_foreign_baseline: Annotated[bool, typer.Option(
        "--allow-foreign-baseline", help="compare with a baseline made on another model or data set "
                                         "(refused by default)")] = False,
    no_baseline: Annotated[bool, typer.Option(
        "--no-baseline", help="run without a baseline: relative rules are skipped (a first release; "
                              "its --json can be the next --baseline)")] = False,
    # hidden: only so that `--budget` gets the reason instead of click's "no such option"
    budget: Annotated[Optional[str], typer.Option("--budget", hidden=True)] = None,
):
    from ..errors import ConfigError

    if budget is not None:
        raise ConfigError("gate takes no --budget: a budget stops probes where the machine's speed says, so an "
                          "unchanged model could get another verdict; the gate file's probe counts set the cost")
    from ..workflows.gate import check_coverage, load_baseline, load_gate_config, run_gate
    from ..report.io import check_writable

    gate = load_gate_config(config)
    if confidence is not None and not 0 < confidence < 1:
        raise ConfigError(f"--confidence must be between 0 and 1 (exclusive), got {confidence}")
    if no_baseline and baseline is not None:
        raise ConfigError("--no-baseline and --baseline exclude each other")
    base = load_baseline(baseline) if baseline is not None else None
    if gate.needs_baseline and base is None and not no_baseline:
        rule = next(b.name for b in gate.bounds if b.relative)
        raise ConfigError(f"{config}: rule '{rule}' compares with a baseline; pass --baseline REPORT.json "
                          "(or --no-baseline to skip such rules)")
    if base is not None:
        check_coverage(gate, base)  # a report of other probes: refused before the model loads
    for target, flag in ((junit, "--junit"), (summary, "--summary")):
        if target is not None:
            check_writable(target, flag)

    def execute(run_config, progress):
        outcome = run_gate(run_config, gate, baseline=base, confidence=confidence, progress=progress,
                           allow_foreign=allow_foreign_baseline)
        _write_outputs(outcome, junit, summary)
        return outcome

    return list(gate.probes), gate.probes, False, execute


def _write_outputs(outcome, junit: Path | None, summary: Path | None) -> None:
    from ..report.gate_formats import junit_xml, markdown
    from ..report.io import write_or_rescue

    # a path that fails after the run is written elsewhere and named (report.io.rescued_outputs)
    if junit is not None:
        write_or_rescue(junit, junit_xml(outcome), "--junit")
    if summary is not None:
        # GitHub's step summary is shared by all steps of a job: append, never replace
        write_or_rescue(summary, markdown(outcome), "--summary", append=True)
