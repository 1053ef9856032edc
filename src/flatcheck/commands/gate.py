"""`flatcheck gate`: rules from a YAML file, decided on one checkpoint; exit 1 when one fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..cli import Checkpoint, probe_command


@probe_command("gate", help="Check probe results against the rules of a gates YAML file (exit 1 on failure).")
def gate_cmd(
    checkpoint: Checkpoint,
    config: Annotated[Path, typer.Option("--config", help="gates YAML: probes, their options and rules")],
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="JSON report of an earlier run, for "
                                                     "max_increase/max_decrease rules")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", help="write JUnit XML (one testcase per rule)")] = None,
    summary: Annotated[Optional[Path], typer.Option("--summary", help="write a Markdown summary "
                                                    "(e.g. $GITHUB_STEP_SUMMARY)")] = None,
    confidence: Annotated[Optional[float], typer.Option("--confidence", help="level of the intervals of "
                                                        "stochastic values [default: the file's, else 0.95]")] = None,
):
    from ..errors import ConfigError
    from ..gate import load_gate_config, run_gate

    gate = load_gate_config(config)
    if confidence is not None and not 0 < confidence < 1:
        raise ConfigError(f"--confidence must be between 0 and 1 (exclusive), got {confidence}")
    base = _read_baseline(baseline) if baseline is not None else None
    if gate.needs_baseline and base is None:
        rule = next(b.name for b in gate.bounds if b.relative)
        raise ConfigError(f"{config}: rule '{rule}' compares with a baseline; pass --baseline REPORT.json")
    for target, flag in ((junit, "--junit"), (summary, "--summary")):
        if target is not None and (target.is_dir() or not target.parent.is_dir()):
            raise ConfigError(f"{flag} {target}: not a writable file path")

    def execute(run_config, progress):
        outcome = run_gate(run_config, gate, baseline=base, confidence=confidence, progress=progress)
        _write_outputs(outcome, junit, summary)
        return outcome

    return list(gate.probes), gate.probes, False, execute


def _read_baseline(path: Path) -> dict:
    from ..errors import ConfigError

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--baseline {path}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--baseline {path}: not a JSON report ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        raise ConfigError(f"--baseline {path}: not a flatcheck JSON report (no 'results')")
    return data["results"]


def _write_outputs(outcome, junit: Path | None, summary: Path | None) -> None:
    from ..report.gate_formats import junit_xml, markdown
    from ..report.io import write_text_atomic

    if junit is not None:
        write_text_atomic(junit, junit_xml(outcome))
    if summary is not None:
        # GitHub's step summary is shared by all steps of a job: append, never replace
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(markdown(outcome))
