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

Within a unit the backends count their passes over the samples (report/pulse.py): a product
over 64 samples of a ResNet is one call of tens of seconds, and the line shows how far it got
(`product 1: samples 32/64`, `block: vectors 3/5`). A probe's first count, its first ETA and
its first ETA from the run's own forecast (not a prior's) are written as soon as they exist,
once it has run FIRST_AFTER seconds or is forecast to run past that (a fast probe writes no
more than its end line), instead of waiting for the ticker, and so is an ETA that has moved
far from what the last line said (CORRECTION); once the run's length can be told (a rate and a
total), a run forecast to take longer than LONG_RUN says so at once, with how to make it
shorter (only in its first half: past it, a shorter run started afresh saves nothing). Where
--budget ends a probe short of its total, the count's total and the ETA are what the budget
leaves at the current rate, and the line says the budget stops it (once its share is spent,
that the unit in progress is the last). A line before any count says `starting` once, then
`still starting`. A count within a block is whole vectors, or the block's share in percent.

The ETA comes from the work done after the one-off costs (building the graph that later
products reuse, tracing, the first forward pass, allocator warm-up), which would inflate every
later estimate if averaged in: from where a backend said it finished a kept build
(report/pulse.Passes.built), else from the first unit (or a block's first count within one);
builds after that are left out of the rate. A windowed rate would swing with the machine's
load. The total is the estimator's own forecast of the units its stopping rule needs (an error
bound's decay, a standard error against its rtol, a budget), not its cap, and may change as the
run goes; a total of 0 after units are done means "not yet forecast": the line shows the count
as `n/?`. A total that is a prior (linalg/forecast.Prior: what such a stop usually takes, before
the run's own progress can tell) is shown as one: `1/~10 · … · ETA ~0:00:27`.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from typing import Any, Callable, TextIO

from ..errors import words

# the task's line and its parts: re-exported, as callers and tests read them here
from .task import CORRECTION, LONG_RUN, PREFIX, Task, clock_text, value_text  # noqa: F401

# the off-terminal line's period: at most every 10 s, at least every 30 s, so a CI log
# shows life without flooding;
# FLATCHECK_PROGRESS_SECONDS overrides it (tests use a fraction of a second)
DEFAULT_PERIOD = 15.0
PERIOD_ENV = "FLATCHECK_PROGRESS_SECONDS"
# a probe that has run this long, or is forecast to run past this, writes its first count and
# its first ETA at once (not at the next tick): a CI log learns within seconds how far a long
# probe is and when it will end
FIRST_AFTER = 10.0


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


class ProgressRenderer:
    """The progress callback and its display; a context manager around the run.

    `interactive` picks the rich bar (a terminal) or plain lines (anything else). `clock` and
    `period` are injectable so that tests run in a fraction of a second.
    """

    def __init__(self, stream: TextIO | None = None, *, interactive: bool | None = None,
                 period: float = DEFAULT_PERIOD, clock: Callable[[], float] = time.monotonic,
                 phase: str = "loading the model and data", name_of: Callable[[str], str] | None = None,
                 budget: bool = True):
        self.stream = stream if stream is not None else sys.stderr
        # how the settings a line names are said: the CLI passes its flags (settings.flag_of);
        # in code they read as keywords (`samples=64`, `budget=SECONDS`)
        self.name_of = name_of
        self.budget_ok = budget  # the command takes --budget (a gate does not)
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
        self._listening: Any = None
        self._ends = 0  # end lines written: a probe that added none gets one (ended)
        self._probe: tuple[str, float, int] | None = None  # the probe running: (name, began, _ends then)
        # a stage's end line without a value, held until its probe ends (ended): the probe's
        # headline completes it. (task, when it finished)
        self._held: tuple[Task, float] | None = None

    # -- context ------------------------------------------------------------------------------
    def __enter__(self) -> "ProgressRenderer":
        from .pulse import listening

        # the backends' counts within a call (report/pulse.py) come to `within`
        self._listening = listening(self.within)
        self._listening.__enter__()
        if self.interactive:
            self._bar = _rich_progress(self.stream, self.clock)
            self._bar.start()
            self._show_phase()
        else:
            self._ticker = threading.Thread(target=self._tick, name="flatcheck-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._listening is not None:
            self._listening.__exit__(None, None, None)
            self._listening = None
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self._bar is not None:
            self._bar.stop()
        if exc_type is None and not self.interactive:
            with self._lock:  # probes that stopped before their total (a stopping rule) end here
                self._flush()
                for task in self.tasks.values():
                    if not task.finished:
                        self._finish(task, self.clock())

    # -- the callback -------------------------------------------------------------------------
    def __call__(self, desc: str, done: int, total: int, *, value: float | None = None,
                 stderr: float | None = None) -> None:
        now = self.clock()
        with self._lock:
            task = self.tasks.get(desc)
            if task is not None and task.finished and 0 < done == task.done == total == task.total:
                return  # its end again (a last step that met the stop, then the end): no new run
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
            else:
                self._say_news(task, now)

    def within(self, done: int, total: int, vectors: int, built: float = 0.0, anew: bool = False,
               ahead: tuple[int, float] | None = None) -> None:
        """A backend's count within the unit in progress (report/pulse.Passes): `done` of
        `total` sample passes, over `vectors` vectors; with `built`, a kept build's end; with
        `anew`, the units that follow cost otherwise; with `ahead`, the units from one on will
        (pulse.pace_changes)."""
        now = self.clock()
        with self._lock:
            task = self.current
            if task is None or task.finished:
                return
            if anew or ahead is not None:
                if anew:
                    task.time_afresh()
                if ahead is not None:
                    task.ahead = ahead
                return
            task.passed(now, done, total, vectors, built)
            if self._bar is not None:
                self._draw(task)
            else:
                self._say_news(task, now)

    def budget(self, desc: str, seconds: float) -> None:
        """The probe of `desc` has `seconds` of --budget left: an ETA past it says the budget
        will stop it."""
        with self._lock:
            task = self.tasks.get(desc)
            if task is not None:
                task.deadline = self.clock() + seconds

    def _say_news(self, task: Task, now: float) -> None:
        """Off a terminal, at once: a forecast past LONG_RUN whenever it is first known; once
        the probe has run FIRST_AFTER seconds or is forecast to run past that, its firsts (a
        count, an ETA, an ETA from its own forecast) and an ETA that has drifted from the last
        line's."""
        hint = task.long_run_news(now, self.budget_ok)
        if hint is not None:
            self._write(hint, now)
        if now - task.started < FIRST_AFTER and not (task.forecast(now) or 0.0) > FIRST_AFTER:
            return
        if task.shown(now) - task.said or task.drifted(now):
            self._say(task, now)

    def _say(self, task: Task, now: float) -> None:
        """The task's line, and what it showed: no line of its own is needed for it after."""
        line = task.line(now)
        self._write(line, now)
        task.said |= task.shown(now)
        if line.startswith(f"{PREFIX} {task.desc}: starting"):
            task.said.add("start")
        left = task.remaining(now)
        if left is not None:
            task.told = (now, left)

    def stopped(self, desc: str, reason: str, planned: int | None = None) -> None:
        """The probe of `desc` ended short of its total because of `reason` ("budget"): its end
        line says so, with how far it got (report_stop) of the `planned` units, where given."""
        with self._lock:
            task = self.tasks.get(desc)
            if task is None:
                return
            task.stop = reason
            if planned is not None:
                task.total = max(task.total, planned)
            if self._bar is None and not task.finished:
                self._finish(task, self.clock())

    # -- a probe's bounds (api.run) ----------------------------------------------------------------
    def began(self, probe: str) -> None:
        """Probe `probe` begins: its end line is owed from here."""
        with self._lock:
            self._flush()  # a probe that failed and was caught (no ended) still ends its stage
            self._probe = (probe, self.clock(), self._ends)

    def ended(self, probe: str, value: float | None, stderr: float | None, dof: int | None = None,
              bound: float | None = None) -> None:
        """Probe `probe` ended with this headline. Off a terminal its last stage, if it stopped
        short of its total, ends now, and a probe that wrote no end line of its own gets one:
        a closed form (head-trace, relative-flatness) reports no units, yet the guide promises
        a line at each probe's end; its one computation is its one unit (1/1). The probe's last
        line, if it had no value (a count of samples or products), carries the headline."""
        with self._lock:
            now, began = self.clock(), self._probe
            if self._bar is not None:
                self._probe = None
                return
            if self.current is not None and not self.current.finished:
                self._finish(self.current, now)
            self._probe = None
            held = None if self._held is None else self._held[0]
            # the probe's own line ("jacobian (exact)"), not a part's ("decomposition: Tr(G)"),
            # whose line the headline would mislabel
            if held is not None and held.desc.split(" (")[0] == probe:
                if held.value is None:
                    held.value, held.stderr, held.dof, held.bound = value, stderr, dof, bound
                elif _same(held.value, value) and _same(held.stderr, stderr):
                    # the line's own estimate is the headline: its dof and bound are the headline's
                    held.dof, held.bound = dof, bound
            self._flush()
            if began is not None and began[0] == probe and began[2] == self._ends:
                task = Task(probe, started=began[1], dof=dof, bound=bound)
                task.update(now, 1, 1, value, stderr)
                self._finish(task, now)

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
        self._ends += 1
        self._flush()  # a stage held before this one was not its probe's last
        if self._probe is not None:
            # its probe's headline completes it (ended): the value where it has none, the
            # degrees of freedom of its stderr where it has one
            self._held = (task, now)
            return
        self._write(task.line(now, end=True), now)

    def _flush(self) -> None:
        """Write the held end line, as it stands."""
        if self._held is not None:
            task, when = self._held
            self._held = None
            self._write(task.line(when, end=True), when)

    def _write(self, text: str, now: float) -> None:
        self._flush()  # any line after a held one: it was no probe's last stage, and comes first
        self.stream.write(words(text, self.name_of) + "\n")
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
                    self._say(task, now)
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
        now = self.clock()
        hint = task.long_run_news(now, self.budget_ok)
        if hint is not None:
            self._bar.console.print(words(hint, self.name_of), markup=False, highlight=False)
        value = value_text(task.value, task.stderr, task.dof, task.bound)
        estimate = " · ".join(t for t in (task.within_text(), value, task.budget_text(now)) if t)
        estimate = words(estimate, self.name_of)
        # an unknown total (the probe's start report) pulses until the first unit is done
        about = "~" if task.eta_guess and eta is not None else ""  # from a prior: a guess, as the line says
        # a total forecast below the count done (a stopping rule met early) is the count
        total = max(task.goal(), task.done) if task.known else None
        self._bar.update(task.bar_id, completed=task.done, total=total, eta=about + clock_text(eta),
                         estimate=estimate)


def _same(a: float | None, b: float | None) -> bool:
    """Whether a line's estimate is the headline's: equal, to the rounding of a rescale."""
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


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
