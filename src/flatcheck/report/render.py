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


def within_noise(value: float | None, stderr: float | None) -> bool:
    """A value within its own standard error of zero: its sign and size are not resolved."""
    return (value is not None and stderr is not None and math.isfinite(value) and math.isfinite(stderr)
            and stderr > 0 and abs(value) <= stderr)


def fmt_estimate(value: float | None, stderr: float | None) -> str:
    """value ± stderr, said to be zero within noise when it is ('−2.8e-08 ± 4.2e-08'
    with no word that it is zero reads as a tiny negative sharpness)."""
    text = fmt_pm(value, stderr)
    return f"0 within noise: {text}" if within_noise(value, stderr) else text


# a standard error on fewer degrees of freedom than this is marked rough in a table. At dof 4 the
# two-sided 95 % t quantile is 2.78 (1.42 × the normal's 1.96; 12.7 at dof 1) and the standard
# error's own relative spread, about 1/√(2·dof), is 35 % (71 % at dof 1): a reader who doubles
# "± se" takes a much tighter interval than the data give. From dof 5 (2.57, 32 %) the usual
# reading is roughly right for a symmetric spread (a skewed one needs more, which the probes'
# notes say). Spectrum and rank default to 2 starts (dof 1): cost, not precision
ROUGH_DOF = 5


def fmt_result(value: float | None, stderr: float | None, resolved: bool = True,
               error_bound: float | None = None, dof: int | None = None) -> str:
    """A probe's headline in a table: fmt_estimate, with the bound of a value an iteration
    stopped within its tolerance, marked rough when its standard error rests on fewer than
    ROUGH_DOF degrees of freedom (`dof`, as the JSON carries it; None: a normal one), and
    marked when the probe does not stand behind it (an lmax short of its tolerance, a
    per-sample mean the budget cut), which the notes explain; a bare number there would read
    as a result."""
    text = fmt_estimate(value, stderr)
    if stderr is None and error_bound is not None:
        text += f" (within {fmt(error_bound, 2)})"
    text += rough_mark(stderr, dof)
    return text if resolved else f"{text} (unresolved)"


def rough_mark(stderr: float | None, dof: int | None) -> str:
    """' (rough ±: dof N)' after a standard error on fewer than ROUGH_DOF degrees of freedom."""
    return f" (rough ±: dof {dof})" if stderr is not None and dof is not None and dof < ROUGH_DOF else ""


def header(report: Report) -> str:
    m = report.meta
    d = m["data"]
    return (
        f"[bold]{m['model']['arch']}[/] ({m['model']['probed_parameters']:,} params probed) · "
        f"{d['name']}/{d['split']} n={d['samples']}"
        + (f" ({d['channels']})" if d.get("channels") else "")  # a grey ↔ RGB conversion for the model
        + (f" (resized {d['resized']})" if d.get("resized") else "")  # to the spec's input size
        # float64 inputs measured as their float32 rounding (data.rounded): the values are not the file's own
        + (" (float64 inputs rounded to float32)" if d.get("rounded") else "")
        + f" · loss {m['model']['loss']} · bn {m['bn_mode']} · "
        f"{m['device']} {m['dtype']}{' (TF32)' if m.get('allow_tf32') else ''} · seed {m['seed']}"
    )


def summary_table(report: Report) -> Table:
    """The probes' headlines; `render` prints `header` above it as a line of its own (a table's
    title wraps at the table's width, ~60 columns, whatever the console's)."""
    table = Table(show_lines=False)
    # fold, never cut: a probe or quantity cut to "adaptive-sha…" at 80 columns is lost
    table.add_column("probe", overflow="fold")
    table.add_column("quantity", overflow="fold")
    table.add_column("value ± stderr", justify="right", overflow="fold")
    table.add_column("matvecs", justify="right")
    table.add_column("seconds", justify="right")
    for r in report.results.values():
        table.add_row(r.probe, r.label, fmt_result(r.value, r.stderr, r.resolved, r.error_bound, r.dof), str(r.matvecs), f"{r.seconds:.2f}")
    return table


def layers_table(r: ProbeResult) -> Table | None:
    layers = r.details.get("layers")
    if not layers:
        return None
    # a share of a total that is zero within noise is noise too (it went negative or past 100 %)
    shares = bool(r.value) and math.isfinite(r.value) and not within_noise(r.value, r.stderr)
    table = Table(title=f"{r.label} per layer", title_justify="left",
                  caption=None if shares else "no shares: the total is zero within its standard error",
                  caption_justify="left")
    table.add_column("module", overflow="fold")
    table.add_column("params", justify="right")
    table.add_column("value ± stderr", justify="right", overflow="fold")
    if shares:
        table.add_column("share", justify="right")
    for name, part in layers.items():
        row = [name, f"{part['parameters']:,}", fmt_estimate(part["value"], part["stderr"])]
        if shares:
            row.append(f"{100 * part['value'] / r.value:.1f}%" if not math.isnan(part["value"]) else "—")
        table.add_row(*row)
    return table


def render(report: Report, console: Console, *, layers: bool = True) -> None:
    console.print(header(report), style="italic", highlight=False)
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
