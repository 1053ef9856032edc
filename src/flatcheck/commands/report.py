"""`flatcheck report`: tables, correlations and scatter plots over JSON reports and JSONL scans."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .kit import READS, WRITES, command, guarded


@command("report", help="Summarise JSON reports and JSONL scans (shards OUT.rankN included): a table of "
                            "models × fields, correlations, a scatter plot of --y against --x, or fields along a "
                            "training run with --x step (or epoch).")
def report_cmd(
    files: Annotated[list[Path], typer.Argument(help="reports (.json) and scans (.jsonl); shards are merged",
                                                show_default=False), READS],
    x: Annotated[Optional[str], typer.Option("--x", help="field for the x axis, e.g. adaptive-sharpness, or step / "
                                             "epoch for a training run")] = None,
    y: Annotated[Optional[list[str]], typer.Option("--y", help="field for the y axis, e.g. mls.normalized_mls; "
                                                   "repeatable with --x step|epoch (a panel each)")] = None,
    fields: Annotated[Optional[str], typer.Option("--fields", help="comma-separated fields for the table "
                                                  "[default: every probe's value]")] = None,
    correlate: Annotated[Optional[str], typer.Option("--correlate", help="correlate --x (else every field) with "
                                                     "this field")] = None,
    preset: Annotated[Optional[str], typer.Option("--preset", help="a paper's figure: mls-vs-sharpness (Chen et "
                                                  "al. 2023 Fig. 4: normalized MLS against adaptive sharpness, log "
                                                  "axes, colour by family)")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="write a PNG: --y against --x"), WRITES] = None,
    labels: Annotated[bool, typer.Option("--labels", help="name each point of the scatter by its model")] = False,
    logx: Annotated[bool, typer.Option("--logx", "--log-x", help="log x axis (drops x ≤ 0)")] = False,
    logy: Annotated[bool, typer.Option("--logy", "--log-y", help="log y axis (drops y ≤ 0)")] = False,
    lr: Annotated[Optional[list[float]], typer.Option("--lr", help="with --x step|epoch: a line at 2/η on the lmax "
                                                      "panel (the edge of stability), repeatable")] = None,
    mixed_settings: Annotated[bool, typer.Option("--mixed-settings", help="merge results whose run settings differ "
                                                 "(data, split, samples, seed, or the options of a probe they share)")] = False,
    csv_out: Annotated[Optional[Path], typer.Option("--csv", help="write the table as CSV (value and stderr per "
                                                    "field)"), WRITES] = None,
    confidence: Annotated[float, typer.Option("--confidence", help="level of the correlation intervals")] = 0.95,
    bootstrap: Annotated[int, typer.Option("--bootstrap", help="resamples for Spearman/Kendall intervals")] = 2000,
    seed: Annotated[int, typer.Option("--seed", help="seed of the bootstrap")] = 0,
    json_out: Annotated[Optional[str], typer.Option("--json", help="write the summary as JSON ('-' = stdout)"),
                        WRITES] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no messages on stderr")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
):
    def body() -> int:
        from .kit import check_json_target, console, error_line
        from ..errors import ConfigError
        from ..report.io import (check_distinct_files, check_writable, dump_json, lost_outputs_error,
                                 rescued_outputs, write_or_rescue)
        from ..workflows.results_io import TRAJECTORY_FIELDS, expand_paths, load_results

        if not 0 < confidence < 1:
            raise ConfigError(f"--confidence must be between 0 and 1 (exclusive), got {confidence}")
        if bootstrap < 100:
            raise ConfigError(f"--bootstrap must be at least 100, got {bootstrap}")
        figure = _preset_figure(preset)
        xf = x or figure.get("x")
        ys = list(y or ([figure["y"]] if figure.get("y") else []))
        along = xf in TRAJECTORY_FIELDS
        if len(ys) > 1 and not along:
            raise ConfigError(f"--y given {len(ys)} times: several fields are drawn only along a run "
                              f"(--x step or --x epoch); for a scatter give one --y")
        if lr and not along:
            raise ConfigError("--lr draws 2/η along a training run; give --x step or --x epoch")
        if lr and any(not (math.isfinite(v) and v > 0) for v in lr):
            raise ConfigError(f"--lr must be positive numbers, got {', '.join(map(str, lr))}")
        # an output that is a file read (a shard included), or a file of another kind, is refused
        check_distinct_files([*(("FILE", str(p), False) for p in expand_paths(files)),
                              *((f, str(p), True) for f, p in (("--csv", csv_out), ("--json", json_out),
                                                               ("--plot", plot)) if p is not None and str(p) != "-")])
        check_json_target(json_out)
        if csv_out is not None:
            check_writable(csv_out, "--csv")
        if plot is not None:
            from ..report.plots import check_plot_target

            check_plot_target(str(plot))
        loaded = load_results(files)
        say = (lambda m: None) if quiet else (lambda m: error_line(f"flatcheck: warning: {m}"))
        for note in loaded.warnings:
            say(note)
        records = _named(loaded.records, loaded.sources)
        if not records:
            raise ConfigError(f"{', '.join(map(str, files))}: no records")
        _check_settings(records, mixed_settings, say)
        _check_preset_records(records, preset, figure)
        columns = _columns(records, fields, xf, ys, correlate)
        _check_fields_exist(records, columns)
        table = [_row(r, columns) for r in records]
        if along:
            table.sort(key=lambda r: (r.get("run", r["model"]), r[xf] if r.get(xf) is not None else math.inf))
        corrs = _correlations(table, columns, xf, ys, correlate, confidence, bootstrap, seed)
        for a in dict.fromkeys(c["x"] for c in corrs):
            if a not in TRAJECTORY_FIELDS and (msg := _indistinct(table, a)):
                say(msg)
        plotted = None
        # an output whose path fails now (its folder removed meanwhile) is written elsewhere and
        # named after the table, so that one lost path costs none of the other outputs
        with rescued_outputs() as rescued:
            if plot is not None:
                plotted = _plot(plot, records, table, columns, xf, ys, correlate, logx or figure.get("logx", False),
                                logy or figure.get("logy", False), labels, lr or [], figure, say)
            summary = {"models": table, "fields": columns, "correlations": corrs,
                       "plot": None if plot is None else {"path": str(plot), "points": plotted}}
            if csv_out is not None:
                write_or_rescue(csv_out, _csv(table, columns), "--csv")
            if json_out is not None:
                dump_json(summary, json_out)
        if json_out != "-":
            _render(console(), table, columns, corrs)
        if not quiet:
            lost = {r.flag for r in rescued}
            if plot is not None and "--plot" not in lost:
                error_line(f"flatcheck report: wrote {plot} ({plotted} points)")
            if csv_out is not None and "--csv" not in lost:
                error_line(f"flatcheck report: wrote {csv_out} ({len(table)} rows)")
        if rescued:
            raise lost_outputs_error(rescued)
        return 0

    guarded(debug, body)


def _preset_figure(name: str | None) -> dict:
    if name is None:
        return {}
    from ..workflows.presets import preset

    return dict(preset(name).figure)


def _named(records, sources) -> list[dict[str, Any]]:
    """Each record under the name its row shows. Records that share a model name (and step)
    are other models or other settings: two folders' model.safetensors are told apart by their
    checkpoint paths, one model measured twice by the file (and line) each record came from.
    The family stays the one of the plain name."""
    from ..workflows.results_io import checkpoint_path
    from ..workflows.scan_sources import family

    out = [{**r, "family": r.get("family") or family(r["model"])} for r in records]
    clashes: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        clashes.setdefault((r["model"], r.get("step"), r.get("epoch")), []).append(i)
    for rows in (rows for rows in clashes.values() if len(rows) > 1):
        paths = [checkpoint_path(records[i]) for i in rows]
        by_path = None not in paths and len(set(paths)) == len(paths)
        for i, path in zip(rows, paths):
            out[i]["model"] = path if by_path else f"{records[i]['model']} ({sources[i]})"
    return out


def _check_settings(records, mixed: bool, say) -> None:
    """Results measured under other settings are not points of one comparison: refuse them
    unless told, and then say what differs."""
    from ..errors import ConfigError
    from ..workflows.results_io import describe_difference, settings_groups

    groups = settings_groups(records)
    if len(groups) < 2:
        return
    (a, first), (b, other) = groups[0], groups[1]
    diff = describe_difference(a, b)
    what = (f"{len(groups)} different run settings: {diff} ({first[0]}{' …' if len(first) > 1 else ''} vs "
            f"{other[0]}{' …' if len(other) > 1 else ''})")
    if not mixed:
        raise ConfigError(f"the results were measured with {what}; compare like with like, or pass "
                          f"--mixed-settings to merge them anyway")
    say(f"merging results measured with {what} (--mixed-settings)")


def _check_preset_records(records, name: str | None, figure: dict) -> None:
    """A preset's figure names what it plots (sigmoid + MSE sharpness, MLS of σ(f)): records
    measured otherwise (a scan without the preset: cross-entropy, logits) would be drawn under
    those labels. Refused, naming a record and what it holds."""
    from ..errors import ConfigError
    from ..workflows.results_io import FieldMissing, record_value

    for r in (r for r in records if r.get("status", "ok") == "ok"):
        wrong = []
        for field, wanted in (figure.get("requires") or {}).items():
            try:
                got = record_value(r, field)[0]
            except FieldMissing:
                got = None
            if got != wanted:
                wrong.append(f"{field} {got!r}, not {wanted!r}")
        if wrong:
            raise ConfigError(f"--preset {name}: {r['model']} was measured with {'; '.join(wrong)}, so its points "
                              f"are not the figure's; scan with --preset {name}, or plot it under its own name "
                              f"with --x {figure['x']} --y {figure['y']} --logx --logy")


def _indistinct(table, field: str, z: float = 2.0) -> str | None:
    """A warning when most pairs of x values are within z combined standard errors of each
    other: an ordering (and so a correlation) along x is then mostly noise."""
    pts = [(r["values"][field]["value"], r["values"][field]["stderr"]) for r in table
           if r["status"] == "ok" and _finite(r, field) is not None]
    pairs = close = 0
    for i, (u, su) in enumerate(pts):
        for v, sv in pts[i + 1:]:
            pairs += 1
            err = math.hypot(su or 0.0, sv or 0.0)
            close += err > 0 and abs(u - v) <= z * err
    if pairs and close * 2 > pairs:
        return (f"{close} of {pairs} pairs of {field} values lie within {z:g} standard errors of each other: "
                f"the models are not told apart along x, and a correlation with it is mostly noise")
    return None


def _csv(table, columns) -> str:
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "family", "status", "error", "step", "epoch",
                *[h for c in columns for h in (c, f"{c}.stderr")]])
    for r in table:
        cells = [r["values"][c][k] for c in columns for k in ("value", "stderr")]
        w.writerow([r["model"], r["family"], r["status"], r["error"] or "", _blank(r.get("step")),
                    _blank(r.get("epoch")), *(_blank(v) for v in cells)])
    return buf.getvalue()


def _blank(v) -> str:
    return "" if v is None else repr(v) if isinstance(v, float) else str(v)


def _columns(records, fields, x, ys, correlate) -> list[str]:
    from ..workflows.results_io import TRAJECTORY_FIELDS

    if fields:
        cols = [f.strip() for f in fields.split(",") if f.strip()]
    else:
        cols = [] if (x or ys) else list(dict.fromkeys(p for r in records for p in r.get("results", {})))
    for extra in (x, *ys, correlate):
        if extra and extra not in cols and extra not in TRAJECTORY_FIELDS:
            cols.append(extra)
    if not cols:
        from ..errors import ConfigError

        raise ConfigError("no fields: the records hold no probe results; name some with --fields")
    return cols


def _check_fields_exist(records, columns: list[str]) -> None:
    """A field no record has is a typo, not a column of blanks (nor "too few points")."""
    from ..errors import ConfigError
    from ..workflows.results_io import FieldMissing, record_value

    having = [r for r in records if r.get("results")]
    for col in columns:
        found = False
        for r in having:
            try:
                record_value(r, col)
            except FieldMissing:
                continue
            found = True
            break
        if having and not found:
            probes = sorted({p for r in having for p in r["results"]})
            raise ConfigError(f"field {col!r} is in no record; the records hold {', '.join(probes)} (a probe's "
                              f"value, PROBE.stderr, or PROBE.details.KEY, e.g. {probes[0]}.details.…)")


def _row(record: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    from ..workflows.results_io import TRAJECTORY_FIELDS, FieldMissing, as_number, record_value
    from ..workflows.scan_sources import family

    row = {"model": record["model"], "family": record.get("family") or family(record["model"]),
           "status": record.get("status", "ok"), "error": record.get("error"),
           **{k: record.get(k) for k in TRAJECTORY_FIELDS if isinstance(record.get(k), int)},
           **({"run": record["run"]} if isinstance(record.get("run"), str) else {}), "values": {}}
    for col in columns:
        try:
            v, se = record_value(record, col)
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
    from ..workflows.results_io import TRAJECTORY_FIELDS

    if col in TRAJECTORY_FIELDS:
        v = row.get(col)
        return float(v) if v is not None else None
    v = row["values"][col]["value"]
    return v if isinstance(v, float) and math.isfinite(v) else None


def _pairs(columns, x, ys, correlate) -> list[tuple[str, str]]:
    if correlate:
        xs = [x] if x else [c for c in columns if c != correlate]
        return [(a, correlate) for a in xs]
    # along a training run the records are many runs' steps: pooling them into one correlation
    # with the step would mean nothing, so that is only done when asked (--correlate)
    from ..workflows.results_io import TRAJECTORY_FIELDS

    if x and ys and x not in TRAJECTORY_FIELDS:
        return [(x, b) for b in ys]
    return []


def _correlations(table, columns, x, ys, correlate, confidence, n_boot, seed) -> list[dict]:
    from ..workflows.stats import correlate as corr

    out = []
    for a, b in _pairs(columns, x, ys, correlate):
        pts = [(_finite(r, a), _finite(r, b)) for r in table if r["status"] == "ok"]
        pts = [(u, v) for u, v in pts if u is not None and v is not None]
        for c in corr([u for u, _ in pts], [v for _, v in pts], confidence=confidence, n_boot=n_boot, seed=seed):
            out.append({"x": a, "y": b, **c.to_dict()})
    return out


def _stderr(row, field) -> float | None:
    se = row["values"][field]["stderr"] if field in row["values"] else None
    return se if isinstance(se, float) else None


def _plot(path, records, table, columns, xf, ys, correlate, logx, logy, labels, lrs, figure, say) -> int:
    from ..errors import ConfigError
    from ..workflows.results_io import TRAJECTORY_FIELDS, field_label

    xf = xf or columns[0]
    if xf in TRAJECTORY_FIELDS:
        return _plot_along(path, table, xf, ys, logy, lrs, records)
    from ..report.scatter import Density, Point, write_scatter

    yf = (ys[0] if ys else None) or correlate or (columns[1] if len(columns) > 1 else None)
    if yf is None or yf == xf:
        raise ConfigError("--plot needs two fields: give --x and --y (or --correlate)")
    points = []
    for r in table:
        u, v = _finite(r, xf), _finite(r, yf)
        if r["status"] == "ok" and u is not None and v is not None:
            points.append(Point(r["model"], r["family"], u, v, _stderr(r, xf), _stderr(r, yf)))
    if not points:
        raise ConfigError(f"--plot: no model has finite values of both {xf} and {yf}")
    # a log axis cannot show a value ≤ 0 (a random-init model's adaptive sharpness, zero within
    # noise, often is): say which are left out rather than draw an empty or thinned figure
    off = [p for p in points if (logx and p.x <= 0) or (logy and p.y <= 0)]
    if off:
        which = ", ".join(f"{p.model} ({p.x:.3g}, {p.y:.3g})" for p in off[:5]) + (" …" if len(off) > 5 else "")
        if len(off) == len(points):
            raise ConfigError(f"--plot: every model has {xf} or {yf} ≤ 0, which the log axes cannot show: {which}")
        say(f"--plot: {len(off)} of {len(points)} models have {xf} or {yf} ≤ 0 and are not drawn on the log "
            f"axes: {which}")
    return write_scatter(path, points, xlabel=figure.get("xlabel") or _axis(records, xf),
                         ylabel=figure.get("ylabel") or _axis(records, yf), logx=logx, logy=logy,
                         densities=_densities(records, Density), labels=labels, title=figure.get("title"))


def _axis(records, field: str) -> str:
    from ..workflows.results_io import field_label

    label = field_label(records, field)
    return label if label == field else f"{label}  [{field}]"


def _plot_along(path, table, xf, ys, logy, lrs, records) -> int:
    """Fields along a training run: a panel per --y, a line per run (a record's `run`, else its model)."""
    from ..errors import ConfigError
    from ..report.plots import Series, plot_trajectories

    if not ys:
        raise ConfigError(f"--plot with --x {xf}: name the fields to draw with --y (repeatable)")
    series = []
    for yf in ys:
        for run in dict.fromkeys(r.get("run", r["model"]) for r in table):
            pts = [(r[xf], _finite(r, yf), _stderr(r, yf)) for r in table
                   if r.get("run", r["model"]) == run and r["status"] == "ok" and r.get(xf) is not None
                   and _finite(r, yf) is not None]
            if pts:
                pts.sort()
                series.append(Series(yf, run, [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]))
    if not series:
        raise ConfigError(f"--plot: no record has both a {xf} and a finite value of {', '.join(ys)}")
    return plot_trajectories(str(path), series, xlabel=xf, ylabels={f: _axis(records, f) for f in ys}, logy=logy,
                             lrs=lrs)


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

    from ..report.render import fmt, fmt_estimate

    along = [k for k in ("step", "epoch") if any(k in r for r in table)]  # a training run's records
    t = Table(title=f"{len(table)} {'records' if along else 'models'}", title_justify="left")
    for col in ("model", *along, "status", *columns):
        t.add_column(col, justify="left" if col in ("model", "status") else "right")
    for r in table:
        cells = [fmt_estimate(r["values"][c]["value"], r["values"][c]["stderr"]) for c in columns]
        status = r["status"] if not r["error"] else f"{r['status']}: {r['error']}"
        t.add_row(r["model"], *(str(r.get(k, "—")) for k in along), status, *cells)
    console.print(t)
    if corrs:
        c = Table(title="correlations", title_justify="left")
        for col in ("x", "y", "method", "r", "CI", "p-value", "n", "interval"):
            c.add_column(col, justify="right" if col in ("r", "CI", "p-value", "n") else "left")
        for k in corrs:
            ci = "—" if k["ci_low"] is None else f"[{fmt(k['ci_low'], 3)}, {fmt(k['ci_high'], 3)}]"
            c.add_row(k["x"], k["y"], k["method"], fmt(k["r"], 3), ci, fmt_p(k["p_value"]), str(k["n"]),
                      k["interval"])
        console.print(c)


def fmt_p(p: float | None) -> str:
    """A p-value as read: 3 digits, and "< 1e-4" below that rather than a 0 no test can give."""
    from ..report.render import fmt

    return "—" if p is None else "< 1e-4" if p < 1e-4 else fmt(p, 3)
