"""What a run tells a progress listener besides counts (a budget's share, a stop short of the
total, a probe's bounds), said only where the listener can hear it: a ProgressRenderer has the
hooks, a plain callback (a user's, a scan's forwarder) is left alone, its signature unchanged."""

from __future__ import annotations

from typing import Any, Callable


def report_budget(listener: Any, desc: str, seconds: float) -> None:
    """Tell a progress listener that `desc` has `seconds` of --budget left, where it can hear
    it (ProgressRenderer.budget); a plain callback is left alone."""
    hook = getattr(listener, "budget", None)
    if hook is not None:
        hook(desc, seconds)


def report_stop(listener: Any, desc: str, reason: str, planned: int | None = None) -> None:
    """Tell a progress listener that `desc` stopped short of its total because of `reason`,
    where it can say so (ProgressRenderer.stopped); a plain callback (a user's, a scan's
    forwarder) has no such method and is left alone, its signature unchanged. `planned`: the
    units it would have taken, where its count's total was already cut to what ran (Hutch++
    sized by the budget before it began)."""
    hook = getattr(listener, "stopped", None)
    if hook is not None:
        hook(desc, reason) if planned is None else hook(desc, reason, planned=planned)


def report_probe(listener: Any, probe: str, result: Any = None) -> None:
    """Tell a progress listener that `probe` begins (no `result`) or ended with `result` (its
    ProbeResult: the headline, its stderr and that stderr's dof), where it can hear it
    (ProgressRenderer.began/ended): the run's one place that knows every probe's bounds, so
    that each ends with a line whether or not it counts units."""
    if result is None:
        hook = getattr(listener, "began", None)
        if hook is not None:
            hook(probe)
        return
    hook = getattr(listener, "ended", None)
    if hook is not None:
        # the bound of a value an iteration stopped within (lmax), as the tables show it
        hook(probe, result.value, result.stderr, result.dof, getattr(result, "error_bound", None))


def counted(progress: Callable[..., None] | None) -> Callable[..., None] | None:
    """`progress` with `done` replaced by the number of reports so far, for an estimator that
    reports once per product but numbers its reports by plan (SLQ: start × steps + step), so
    that a start cut short by --budget does not make the count jump."""
    if progress is None:
        return None
    calls = [0]

    def report(done: int, total: int, **estimate: Any) -> None:
        calls[0] += 1
        progress(calls[0], total, **estimate)

    return report
