"""`flatcheck report`: tables, correlations and scatter plots over JSON reports and JSONL scans."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..cli import app, guarded


@app.command("report", help="Summarise JSON reports and JSONL scans (shards OUT.rankN included): a table of "
                            "models × fields, correlations, a scatter plot.")
def report_cmd(
    files: Annotated[list[Path], typer.Argument(help="reports (.json) and scans (.jsonl); shards are merged",
                                                show_default=False)],
    x: Annotated[Optional[str], typer.Option("--x", help="field for the x axis, e.g. adaptive-sharpness.value")] = None,
    y: Annotated[Optional[str], typer.Option("--y", help="field for the y axis, e.g. mls.details.normalized")] = None,
    fields: Annotated[Optional[str], typer.Option("--fields", help="comma-separated fields for the table "
                                                  "[default: every probe's value]")] = None,
    correlate: Annotated[Optional[str], typer.Option("--correlate", help="correlate --x (else every field) with "
                                                     "this field")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write a PNG scatter of --y against --x")] = None,
    logx: Annotated[bool, typer.Option("--logx", help="log x axis (drops x ≤ 0)")] = False,
    logy: Annotated[bool, typer.Option("--logy", help="log y axis (drops y ≤ 0)")] = False,
    confidence: Annotated[float, typer.Option("--confidence", help="level of the correlation intervals")] = 0.95,
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="resamples for Spearman/Kendall intervals")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="seed of the bootstrap")] = 0,
    json_out: Annotated[Optional[str], typer.Option("--json", help="write the summary as JSON ('-' = stdout)")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no messages on stderr")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
):
    def body() -> int:
        from rich.console import Console

        from ..cli import _check_json_target, _error_line
        from ..errors import ConfigError
        from ..report.io import dump_json
        from ..workflows.results_io import load_results

        if not 0 < confidence < 1:
            raise ConfigError(f"--confidence must be between 0 and 1 (exclusive), got {confidence}")
        if bootstrap < 100:
            raise ConfigError(f"--bootstrap must be at least 100, got {bootstrap}")
        _check_json_target(json_out)
        loaded = load_results(files)
        if not quiet:
            for note in loaded.warnings:
                _error_line(f"warning: {note}")
        records = loaded.records
        if not records:
            raise ConfigError(f"{', '.join(map(str, files))}: no records")
        columns = _columns(records, fields, x, y, correlate)
        table = [_row(r, columns) for r in records]
        corrs = _correlations(table, columns, x, y, correlate, confidence, bootstrap, seed)
        plotted = None
        if plot is not None:
            plotted = _plot(plot, records, table, columns, x, y, correlate, logx, logy)
        summary = {"models": table, "fields": columns, "correlations": corrs,
                   "plot": None if plot is None else {"path": str(plot), "points": plotted}}
        if json_out is not None:
            dump_json(summary, json_out)
        if json_out != "-":
            _render(Console(), table, columns, corrs)
            if plot is not None and not quiet:
                _error_line(f"wrote {plot} ({plotted} points)")
        return 0

    guarded(debug, body)


def _columns(records, fields, x, y, correlate) -> list[str]:
    if fields:
        cols = [f.strip() for f in fields.split(",") if f.strip()]
    else:
        cols = [] if (x or y) else list(dict.fromkeys(p for r in records for p in r.get("results", {})))
    for extra in (x, y, correlate):
        if extra and extra not in cols:
            cols.append(extra)
    if not cols:
        from ..errors import ConfigError

        raise ConfigError("no fields: the records hold no probe results; name some with --fields")
    return cols


def _row(record: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    from ..workflows.results_io import FieldMissing, as_number, resolve_field
    from ..workflows.scan_sources import family

    row = {"model": record["model"], "family": record.get("family") or family(record["model"]),
           "status": record.get("status", "ok"), "error": record.get("error"), "values": {}}
    for col in columns:
        try:
            v, se = resolve_field(record.get("results", {}), col)
        except FieldMissing:
            v, se = None, None
        row["values"][col] = {"value": _json_num(as_number(v)), "stderr": _json_num(as_number(se))}
    return row


def _json_num(v):
    # an old report's "nan" string is read as NaN; written back it is null, never a string
    if v is None:
        return None
    return v if math.isfinite(v) else None


def _finite(row, col) -> float | None:
    v = row["values"][col]["value"]
    return v if isinstance(v, float) and math.isfinite(v) else None


def _pairs(columns, x, y, correlate) -> list[tuple[str, str]]:
    if correlate:
        xs = [x] if x else [c for c in columns if c != correlate]
        return [(a, correlate) for a in xs]
    if x and y:
        return [(x, y)]
    return []


def _correlations(table, columns, x, y, correlate, confidence, n_boot, seed) -> list[dict]:
    from ..workflows.stats import correlate as corr

    out = []
    for a, b in _pairs(columns, x, y, correlate):
        pts = [(_finite(r, a), _finite(r, b)) for r in table if r["status"] == "ok"]
        pts = [(u, v) for u, v in pts if u is not None and v is not None]
        for c in corr([u for u, _ in pts], [v for _, v in pts], confidence=confidence, n_boot=n_boot, seed=seed):
            out.append({"x": a, "y": b, **c.to_dict()})
    return out


def _plot(path, records, table, columns, x, y, correlate, logx, logy) -> int:
    from ..errors import ConfigError
    from ..report.scatter import Density, Point, write_scatter

    xf = x or columns[0]
    yf = y or correlate or (columns[1] if len(columns) > 1 else None)
    if yf is None or yf == xf:
        raise ConfigError("--plot needs two fields: give --x and --y (or --correlate)")
    points = []
    for r in table:
        u, v = _finite(r, xf), _finite(r, yf)
        if r["status"] == "ok" and u is not None and v is not None:
            se = lambda f: r["values"][f]["stderr"] if isinstance(r["values"][f]["stderr"], float) else None
            points.append(Point(r["model"], r["family"], u, v, se(xf), se(yf)))
    if not points:
        raise ConfigError(f"--plot: no model has finite values of both {xf} and {yf}")
    return write_scatter(path, points, xlabel=xf, ylabel=yf, logx=logx, logy=logy,
                         densities=_densities(records, Density))


def _densities(records, Density) -> list:
    """Spectral densities wherever a result's details hold equal-length lists "grid" and
    "density" (or "values"), at the top of details or one mapping down (details.density)."""
    from ..workflows.scan_sources import family

    out = []
    for rec in records:
        if rec.get("status", "ok") != "ok":
            continue
        for probe, res in rec.get("results", {}).items():
            details = res.get("details") if isinstance(res, dict) else None
            found = _grid_density(details) if isinstance(details, dict) else None
            if found is not None:
                out.append(Density(rec["model"], rec.get("family") or family(rec["model"]), probe, *found))
    return out


def _grid_density(node: dict, depth: int = 0):
    grid = node.get("grid")
    dens = node.get("density") if isinstance(node.get("density"), list) else node.get("values")
    if isinstance(grid, list) and isinstance(dens, list) and len(grid) == len(dens) > 1:
        try:
            return [float(g) for g in grid], [float(v) for v in dens]
        except (TypeError, ValueError):
            return None
    if depth == 0:
        for child in node.values():
            if isinstance(child, dict) and (hit := _grid_density(child, 1)) is not None:
                return hit
    return None


def _render(console, table, columns, corrs) -> None:
    from rich.table import Table

    from ..report.render import fmt, fmt_pm

    t = Table(title=f"{len(table)} models", title_justify="left")
    for col in ("model", "status", *columns):
        t.add_column(col, justify="left" if col in ("model", "status") else "right")
    for r in table:
        cells = [fmt_pm(r["values"][c]["value"], r["values"][c]["stderr"]) for c in columns]
        status = r["status"] if not r["error"] else f"{r['status']}: {r['error']}"
        t.add_row(r["model"], status, *cells)
    console.print(t)
    if corrs:
        c = Table(title="correlations", title_justify="left")
        for col in ("x", "y", "method", "r", "CI", "p-value", "n", "interval"):
            c.add_column(col, justify="right" if col in ("r", "CI", "p-value", "n") else "left")
        for k in corrs:
            ci = "—" if k["ci_low"] is None else f"[{fmt(k['ci_low'], 3)}, {fmt(k['ci_high'], 3)}]"
            c.add_row(k["x"], k["y"], k["method"], fmt(k["r"], 3), ci, fmt(k["p_value"], 3), str(k["n"]),
                      k["interval"])
        console.print(c)
