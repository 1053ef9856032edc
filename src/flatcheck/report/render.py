"""Rich tables for a terminal. Numbers are shown with their standard error and cost."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from .result import ProbeResult, Report


def fmt(x: float | None, digits: int = 4) -> str:
    if isinstance(x, str):
        return x
    # NaN is no value (api.run refuses one as a headline), so it reads as missing; an
    # infinite bound or threshold is a value and keeps its sign
    if x is None or math.isnan(x):
        return "—"
    if x == 0 or math.isinf(x):
        return str(x)
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.{digits}g}"
    return f"{x:.{digits - 1}e}"


def fmt_pm(value: float | None, stderr: float | None) -> str:
    if stderr is None:
        return fmt(value)
    return f"{fmt(value)} ± {fmt(stderr, 2)}"


def header(report: Report) -> str:
    m = report.meta
    d = m["data"]
    return (
        f"[bold]{m['model']['arch']}[/] ({m['model']['probed_parameters']:,} params probed) · "
        f"{d['name']}/{d['split']} n={d['samples']} · loss {m['model']['loss']} · bn {m['bn_mode']} · "
        f"{m['device']} {m['dtype']} · seed {m['seed']}"
    )


def summary_table(report: Report) -> Table:
    table = Table(title=header(report), title_justify="left", show_lines=False)
    table.add_column("probe")
    table.add_column("quantity")
    table.add_column("value ± stderr", justify="right")
    table.add_column("matvecs", justify="right")
    table.add_column("seconds", justify="right")
    for r in report.results.values():
        table.add_row(r.probe, r.label, fmt_pm(r.value, r.stderr), str(r.matvecs), f"{r.seconds:.2f}")
    return table


def layers_table(r: ProbeResult) -> Table | None:
    layers = r.details.get("layers")
    if not layers:
        return None
    table = Table(title=f"{r.label} per layer", title_justify="left")
    table.add_column("module")
    table.add_column("params", justify="right")
    table.add_column("value ± stderr", justify="right")
    table.add_column("share", justify="right")
    total = r.value or 0.0
    for name, part in layers.items():
        share = f"{100 * part['value'] / total:.1f}%" if total and not math.isnan(part["value"]) else "—"
        table.add_row(name, f"{part['parameters']:,}", fmt_pm(part["value"], part["stderr"]), share)
    return table


def render(report: Report, console: Console, *, layers: bool = True) -> None:
    console.print(summary_table(report))
    for r in report.results.values():
        if r.notes:
            # notes are free text from probes: no markup interpretation
            console.print(f"  {r.probe}: {r.notes}", markup=False, highlight=False)
    if layers:
        for r in report.results.values():
            t = layers_table(r)
            if t is not None:
                console.print(t)
