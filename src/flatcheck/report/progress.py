"""Progress on stderr while probes run: a rich bar per probe at a terminal, plain lines elsewhere.

The probes call `renderer(desc, done, total, *, value=None, stderr=None)` after each unit of
work (the progress callback every probe takes). Off a terminal (a CI log, nohup, a notebook's
subprocess) a line is written at each probe's end and, from a background ticker, every
`period` seconds while work runs — a ticker because one unit (one HVP of a large model) can
take minutes and then no callback comes to write the line.

A probe reports "0 done" with no total when it begins (probes/kit.progress_reporter), so the
line names the running probe from its start, not only after its first unit (a block of trace
products can take a minute). A probe that ends short of its total because --budget ran out
says so (`stopped`), so that its last line does not look unfinished.

The ETA comes from the completed units after the first one: the first includes the one-off
costs (tracing, the first forward pass, allocator warm-up), which would inflate every later
estimate if averaged in, and a windowed rate swings with the machine's load. The total is the
estimator's own forecast of the units its stopping rule needs (an error bound's decay, a
standard error against its rtol, a budget), not its cap, and may change as the run goes; a
total of 0 after units are done means "not yet forecast": the line shows the count as `n/?`.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

# the off-terminal line's period: at most every 10 s, at least every 30 s, so a CI log
# shows life without flooding;
# FLATCHECK_PROGRESS_SECONDS overrides it (tests use a fraction of a second)
DEFAULT_PERIOD = 15.0
PERIOD_ENV = "FLATCHECK_PROGRESS_SECONDS"
PREFIX = "flatcheck"  # every progress line starts with it; error lines start with "error:"


def period_from_env(default: float = DEFAULT_PERIOD) -> float:
    from ..errors import ConfigError

    raw = os.environ.get(PERIOD_ENV)
    if raw is None or raw == "":
        return default
    try:
        period = float(raw)
    except ValueError:
        period = float("nan")
    if not period > 0 or period == float("inf"):
        raise ConfigError(f"${PERIOD_ENV}={raw!r}: expected a positive number of seconds")
    return period


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def value_text(value: float | None, stderr: float | None) -> str:
    if value is None:
        return ""
    from .render import fmt_estimate

    return fmt_estimate(value, stderr)  # "0 within noise: …" as the tables say it


@dataclass
class Task:
    """One probe's (or one estimator stage's) progress, keyed by its description."""

    desc: str
    started: float
    total: int = 0
    done: int = 0
    value: float | None = None
    stderr: float | None = None
    anchor: tuple[float, int] | None = None  # (time, done) at the first completed-work report
    last: float = 0.0
    finished: bool = False
    stop: str | None = None  # what ended it short of its total ("budget"), when it said so
    # whether the first unit carries one-off costs and is left out of the rate; a unit that
    # repeats its own set-up (a scan's model, loaded afresh) counts from `started`, so that
    # the ETA shows once one unit is done
    warmup: bool = True
    bar_id: Any = field(default=None, repr=False)

    def update(self, now: float, done: int, total: int, value: float | None, stderr: float | None) -> None:
        if self.anchor is None and done > 0:  # a "0 done" report marks the start, not a unit
            # without warm-up the rate counts from the start, over the units done since
            # (not those done before it, as a resumed scan's are)
            self.anchor = (now, done) if self.warmup else (self.started, done - 1)
        self.done, self.total, self.last = done, total, now
        if value is not None:
            self.value, self.stderr = value, stderr

    def eta(self) -> float | None:
        """Seconds left at the mean rate of the units completed after the first report."""
        if not self.known:
            return None
        if self.anchor is None or self.done >= self.total:
            return 0.0 if self.done >= self.total else None
        t0, d0 = self.anchor
        if self.done <= d0:
            return None
        return (self.last - t0) / (self.done - d0) * (self.total - self.done)

    @property
    def known(self) -> bool:
        """Whether the total is known: a start report ("0 done", total 0) does not know it, nor
        does an estimator that has not yet forecast how many units its stopping rule needs."""
        return self.total > 0

    def line(self, now: float, *, end: bool = False) -> str:
        elapsed = f"elapsed {clock_text(now - self.started)}"
        if self.known:
            parts = [f"{self.done}/{self.total}", elapsed]
        elif self.done:  # units done, the total not yet forecast
            parts = [f"{self.done}/?", elapsed]
        else:
            parts = [elapsed]
        if end:
            parts.insert(0, f"stopped by the {self.stop}" if self.stop else "done")
        elif self.known or self.done:
            eta = self.eta()
            # counted from the last report: a unit of minutes would otherwise show a stale ETA
            parts.append(f"ETA {clock_text(None if eta is None else max(0.0, eta - (now - self.last)))}")
        else:
            parts.insert(0, "starting")
        if self.value is not None:
            parts.append(value_text(self.value, self.stderr))
        return f"{PREFIX} {self.desc}: " + " · ".join(parts)


class ProgressRenderer:
    """The progress callback and its display; a context manager around the run.

    `interactive` picks the rich bar (a terminal) or plain lines (anything else). `clock` and
    `period` are injectable so that tests run in a fraction of a second.
    """

    def __init__(self, stream: TextIO | None = None, *, interactive: bool | None = None,
                 period: float = DEFAULT_PERIOD, clock: Callable[[], float] = time.monotonic,
                 phase: str = "loading the model and data"):
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.period, self.clock, self.phase = period, clock, phase
        self.started = clock()
        self.tasks: dict[str, Task] = {}
        self.current: Task | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_line = self.started
        self._ticker: threading.Thread | None = None
        self._bar: Any = None

    # -- context ------------------------------------------------------------------------------
    def __enter__(self) -> "ProgressRenderer":
        if self.interactive:
            self._bar = _rich_progress(self.stream, self.clock)
            self._bar.start()
            self._show_phase()
        else:
            self._ticker = threading.Thread(target=self._tick, name="flatcheck-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._bar is not None:
            self._bar.stop()
        if exc_type is None and not self.interactive:
            with self._lock:  # probes that stopped before their total (a stopping rule) end here
                for task in self.tasks.values():
                    if not task.finished:
                        self._finish(task, self.clock())

    # -- the callback -------------------------------------------------------------------------
    def __call__(self, desc: str, done: int, total: int, *, value: float | None = None,
                 stderr: float | None = None) -> None:
        now = self.clock()
        with self._lock:
            task = self.tasks.get(desc)
            # the same description counting from the start again is a new run of the probe
            # (invariance runs every probe twice, gate may rerun): a task of its own
            if task is None or done < task.done or (task.finished and done <= task.done):
                if self.current is not None and not self.current.finished and not self.interactive:
                    self._finish(self.current, now)  # the previous stage stopped early
                # a probe that reports "0 done" first says when it began; else it began when the
                # previous one last reported (or when the run did)
                start = now if done == 0 else self.current.last if self.current is not None else self.started
                task = self.tasks[desc] = Task(desc, started=start)
            self.current = task
            task.update(now, done, total, value, stderr)
            if self._bar is not None:
                self._hide_phase()
                self._draw(task)
            elif task.known and done >= total and not task.finished:
                self._finish(task, now)

    def stopped(self, desc: str, reason: str) -> None:
        """The probe of `desc` ended short of its total because of `reason` ("budget"): its end
        line says so, with how far it got (report_stop)."""
        with self._lock:
            task = self.tasks.get(desc)
            if task is None:
                return
            task.stop = reason
            if self._bar is None and not task.finished:
                self._finish(task, self.clock())

    # -- what several runs in one renderer need (scan) --------------------------------------------
    def stage(self, text: str) -> None:
        """A new stage before any probe reports (a scan's next model loading): the ticker says
        `text` until the first callback."""
        with self._lock:
            if self.current is not None and not self.current.finished and not self.interactive:
                self._finish(self.current, self.clock())
            self.phase, self.current = text, None
            if self._bar is not None:
                self._hide_phase()
                self._show_phase()

    def note(self, text: str) -> None:
        """A line of its own (a scan's model done), above the bars at a terminal."""
        with self._lock:
            if self._bar is not None:
                self._bar.console.print(text, markup=False, highlight=False)
            else:
                self._write(text, self.clock())

    # -- plain lines ----------------------------------------------------------------------------
    def _finish(self, task: Task, now: float) -> None:
        task.finished = True
        self._write(task.line(now, end=True), now)

    def _write(self, text: str, now: float) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()
        self._last_line = now

    def _tick(self) -> None:
        while not self._stop.wait(max(0.0, self._last_line + self.period - self.clock())):
            with self._lock:
                now = self.clock()
                if now - self._last_line < self.period or self._stop.is_set():
                    continue  # a probe's end line came in between
                task = self.current
                if task is not None and not task.finished:
                    self._write(task.line(now), now)
                else:
                    what = self.phase if task is None else f"{task.desc} done, next probe starting"
                    self._write(f"{PREFIX}: {what} · elapsed {clock_text(now - self.started)}", now)

    # -- the bar --------------------------------------------------------------------------------
    _phase_id: Any = None

    def _show_phase(self) -> None:
        # a pulsing bar while the model and data load: the screen is not blank for those seconds
        self._phase_id = self._bar.add_task(self.phase, total=None, eta="", estimate="", t0=self.clock())

    def _hide_phase(self) -> None:
        if self._phase_id is not None:
            self._bar.remove_task(self._phase_id)
            self._phase_id = None

    def _draw(self, task: Task) -> None:
        if task.bar_id is None:
            task.bar_id = self._bar.add_task(task.desc, total=task.total or None, eta="?", estimate="",
                                             t0=task.started)
        eta = task.eta()
        # an unknown total (the probe's start report) pulses until the first unit is done
        self._bar.update(task.bar_id, completed=task.done, total=task.total or None, eta=clock_text(eta),
                         estimate=value_text(task.value, task.stderr))


def _rich_progress(stream: TextIO, clock: Callable[[], float]) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn
    from rich.text import Text

    class Elapsed(ProgressColumn):
        """Since the probe began (rich's own column starts at the first report, after a unit)."""

        def render(self, task: Any) -> Text:
            return Text(clock_text(clock() - task.fields["t0"]), style="progress.elapsed")

    # transient: the bars give way to the result tables; the ETA column is ours (Task.eta)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Elapsed(),
                    TextColumn("ETA {task.fields[eta]}"), TextColumn("{task.fields[estimate]}"),
                    console=Console(file=stream), transient=True)


def report_stop(listener: Any, desc: str, reason: str) -> None:
    """Tell a progress listener that `desc` stopped short of its total because of `reason`,
    where it can say so (ProgressRenderer.stopped); a plain callback (a user's, a scan's
    forwarder) has no such method and is left alone, its signature unchanged."""
    hook = getattr(listener, "stopped", None)
    if hook is not None:
        hook(desc, reason)


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


# what a checkpoint's file name ends with (models/checkpoint.py reads these)
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def starting_line(argv: list[str]) -> str | None:
    """The first line of a run command, written before anything heavy is imported (entry.py):
    what is being loaded. None for commands that load no model (help, list-probes, report …),
    under --quiet, and on ranks other than 0."""
    if len(argv) < 2 or any(a in ("-q", "--quiet", "-h", "--help") for a in argv[1:]):
        return None
    if os.environ.get("RANK", "0") != "0":
        return None
    command = argv[1]
    if command not in run_commands():
        return None
    models = [a for a in argv[2:] if a.lower().endswith(CHECKPOINT_SUFFIXES)]
    what = ", ".join(models[:3]) + (" …" if len(models) > 3 else "") if models else "the model"
    return f"{PREFIX} {command}: starting · importing torch, then loading {what} and the data"


@functools.cache  # read on every start (entry's early checks, then the progress line): once is enough
def run_commands() -> frozenset[str]:
    """Commands that load a model: every probe's own command and the multi-probe commands. A
    probe's command is named for the module that registers it, found by its `@register_probe`
    line so that nothing is imported (the package also holds the registry, the gating protocol,
    the catalogue and the probes' shared kit, which are no commands)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(__file__)), "probes")
    names = set()
    for f in os.listdir(folder):
        if f.endswith(".py") and not f.startswith("_"):
            with open(os.path.join(folder, f), encoding="utf-8") as fh:
                if any(line.startswith("@register_probe") for line in fh):
                    names.add(f[:-3].replace("_", "-"))
    return frozenset(names | {"probe", "gate", "scan", "invariance", "track"})
