"""A row of the comparison, and a tool's repetitions of one task folded into one row."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Row:
    model: str
    task: str
    task_kind: str
    tool: str  # "flatcheck[autograd]", "PyHessian", ...
    seconds: float | None = None
    hvps: int | None = None
    value: str = ""
    peak_mib: float | None = None
    notes: str = ""
    error: str | None = None
    extra: dict = field(default_factory=dict)  # numbers the summary needs

    @property
    def is_flatcheck(self) -> bool:
        return self.tool.startswith("flatcheck")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip().rstrip(":")


# the number a flatcheck-only row is read for (its time is only part of it)
MEASURE = {"hvpgrad": ("ratio", "HVP ÷ gradient"), "block": ("speedup", "speed-up"),
           "ggn": ("exact_in_grads", "gradient-times")}


def median_row(runs: list[Row]) -> Row:
    """One tool's repetitions as one row: the run of median time (of median HVP ÷ gradient,
    speed-up or gradient-times for the rows read for those), the lower of the middle two for an
    even count; its peak memory raised to the largest of any run; every run's number and any
    failures go to the notes."""
    if len(runs) == 1:
        return runs[0]
    ok = [r for r in runs if r.error is None and r.seconds is not None]
    if not ok:
        return runs[0]
    key, label = MEASURE.get(ok[0].task_kind, ("", "time"))
    if not all(key in r.extra for r in ok):
        key, label = "", "time"

    def measure(r: Row) -> float:
        return r.extra[key] if key else r.seconds

    ok.sort(key=measure)
    row = ok[(len(ok) - 1) // 2]
    peaks = [r.peak_mib for r in ok if r.peak_mib is not None]
    row.peak_mib = max(peaks) if peaks else None
    values = [measure(r) for r in ok]
    row.extra["repeats"] = values
    unit = " s" if not key else ""
    what = (f"median {label} of {len(ok)} runs ({values[0]:.3g}–{values[-1]:.3g}{unit}), "
            "peak memory the largest")
    failed = [r.error for r in runs if r.error is not None]
    if failed:
        what += f"; {len(failed)} of {len(runs)} runs FAILED: {failed[0]}"
    row.notes = f"{row.notes}; {what}" if row.notes else what
    return row


def add_ratios(rows: list[Row]) -> None:
    """Peer rows: peer time ÷ flatcheck time for each flatcheck backend of the same task."""
    by_task: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        by_task.setdefault((r.model, r.task), []).append(r)
    for group in by_task.values():
        fc = [r for r in group if r.is_flatcheck and r.error is None and r.seconds]
        for r in group:
            if r.is_flatcheck or not r.seconds or not fc:
                continue
            r.extra["ratios"] = {f.tool: r.seconds / f.seconds for f in fc}
            if r.error is None and r.hvps and all(f.hvps for f in fc):
                r.extra["hvp_ratios"] = {f.tool: r.hvps / f.hvps for f in fc}
