"""One probe's progress as the display keeps it (report/progress.ProgressRenderer): its counts,
its rate and ETA, and the line that says them.

The rate is the mean since an anchor after the one-off costs (report/pulse.Passes.built, or the
first unit); units past a change of pace that a probe announced (`ahead`: Hutch++'s quadratic
forms after its sketch) are priced at their expected cost until they are timed, and an ETA
resting on any prior is marked `~`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import setting

PREFIX = "flatcheck"  # every progress line starts with it; error lines start with "error:"
# an ETA that has moved from what the last line said (aged since) by more than this factor and
# these seconds is written at once: a log's last ETA is the one a reader believes. Not a smaller
# factor: an error bound's forecast swings by a third from one step to the next where the bound
# holds level for a few steps (linalg/forecast.py), noise that a log need not repeat
CORRECTION = 2.0
CORRECTION_SECONDS = 5.0
# a run forecast to take longer than this says so, with the flags that make it shorter
LONG_RUN = 180.0


def clock_text(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def value_text(value: float | None, stderr: float | None, dof: int | None = None,
               bound: float | None = None) -> str:
    if value is None:
        return ""
    from .render import fmt_result

    # "0 within noise: …", "(within 1.4e-07)" and "(rough ±: dof 1)" as the tables say them
    return fmt_result(value, stderr, error_bound=bound, dof=dof)


@dataclass
class Task:
    """One probe's (or one estimator stage's) progress, keyed by its description."""

    desc: str
    started: float
    total: int = 0
    done: int = 0
    value: float | None = None
    stderr: float | None = None
    dof: int | None = None  # the degrees of freedom of the headline's stderr, where it ended with one
    bound: float | None = None  # the headline's error bound, where an iteration stopped within one
    anchor: tuple[float, int] | None = None  # (time, done) at the first completed-work report
    last: float = 0.0
    finished: bool = False
    stop: str | None = None  # what ended it short of its total ("budget"), when it said so
    # whether the first unit carries one-off costs and is left out of the rate; a unit that
    # repeats its own set-up (a scan's model, loaded afresh) counts from `started`, so that
    # the ETA shows once one unit is done
    warmup: bool = True
    # the unit in progress, as its backend calls count it (report/pulse.py): (sample passes
    # done, sample passes in all, vectors); None between units
    within: tuple[int, int, int] | None = None
    # seconds of kept builds after the anchor (report/pulse.Passes.built): left out of the rate
    built: float = 0.0
    guess: bool = False  # the total is a prior (linalg/forecast.Prior), not the run's own forecast
    # (unit, cost): the units from `unit` on are expected to cost `cost` of one before it, a
    # prior until they are timed (pulse.pace_changes(ahead=…): Hutch++'s forms after its sketch)
    ahead: tuple[int, float] | None = None
    # seconds a unit, a prior: the rate before a change of pace times its expected cost, until
    # the units after it have a rate of their own
    prior_rate: float | None = None
    samples: int | None = None  # the samples a product runs over, once a backend has counted them
    deadline: float | None = None  # when --budget stops it (the renderer's clock), if it has one
    # what has been written at once (FIRST_AFTER, LONG_RUN): each once
    said: set = field(default_factory=set, repr=False)
    told: tuple[float, float] | None = None  # (when, ETA) of the last line written with an ETA
    moved: float = 0.0  # when the work last moved on: a unit's report or a count within one
    bar_id: Any = field(default=None, repr=False)

    def update(self, now: float, done: int, total: int, value: float | None, stderr: float | None) -> None:
        if self.anchor is None and done > 0:  # a "0 done" report marks the start, not a unit
            # without warm-up the rate counts from the start, over the units done since
            # (not those done before it, as a resumed scan's are)
            self.anchor = (now, done) if self.warmup else (self.started, done - 1)
        if done != self.done:
            self.within = None
        self.guess = bool(getattr(total, "prior", False))
        self.done, self.total, self.last, self.moved = done, int(total), now, now
        if value is not None:
            self.value, self.stderr = value, stderr

    def passed(self, now: float, done: int, total: int, vectors: int, built: float = 0.0) -> None:
        """A backend's count within the unit in progress: `done` of `total` sample passes over
        `vectors` vectors (report/pulse.Passes); with `built`, the end of a build that later
        calls reuse, which took that many seconds."""
        self.samples = total // max(vectors, 1)
        if built:
            if self.anchor is None and self.warmup:
                # the rate counts from here: what came before (the build, a basis's allocation)
                # is not repeated by the products to come
                self.anchor = (now, self.progress())
            elif self.anchor is not None:
                self.built += built
            return
        if done >= total:  # the call's end: the unit's report follows, and says it
            return
        self.within, self.moved = (done, total, vectors), now
        if self.anchor is None and self.warmup and vectors > 1:
            # a block's first count carries the one-off costs (the graph's building) as a first
            # unit does, and its next vectors time the work: a block of minutes gives its rate
            # within the first block. Not a single product's counts over its batches: each of
            # them builds its batch's graph in the first product
            self.anchor = (now, self.progress())

    def time_afresh(self) -> None:
        """The units from here on are another kind of work (a cheaper form after costlier
        products): the rate is theirs alone, anchored as a first unit's is (the first of them
        may carry a build of its own, as a tangent route's tracing). Till then the ETA is the
        rate before times the cost `ahead` expected of them, marked as a guess (none without it)."""
        rate = self.rate()
        cost = self.ahead[1] if self.ahead is not None else None
        self.prior_rate = rate * cost if rate is not None and cost is not None else None
        self.anchor, self.built, self.ahead = None, 0.0, None

    def rate(self) -> float | None:
        """Seconds a unit, the mean since the anchor (kept builds left out); None before a
        unit's worth has been timed."""
        if self.anchor is None:
            return None
        t0, d0 = self.anchor
        now = self.progress()
        # where a prior prices these units (a change of pace), it holds until one whole unit is
        # timed: a fraction of one (a batch or two of a form) on a loaded machine swung the ETA
        # from ~0:00:24 to 0:01:09 within a second, against 0:00:30 left (stranger21)
        if now <= d0 or (self.prior_rate is not None and now - d0 < 1.0):
            return None
        return max(0.0, self.moved - t0 - self.built) / (now - d0)

    def _priced_ahead(self) -> bool:
        """Whether units past a change of pace still to come are priced at their expected cost."""
        return self.ahead is not None and self.progress() <= self.ahead[0] < self.total

    def units_left(self) -> float:
        """Units left, those past a change of pace (`ahead`) priced at their expected cost."""
        now = self.progress()
        if self._priced_ahead():
            at, cost = self.ahead
            return (at - now) + cost * (self.total - at)
        return max(0.0, self.goal() - now)

    def goal(self) -> int:
        """The count the run is forecast to end at: the total, or fewer where --budget ends it
        first (budget_cut)."""
        cut = self.budget_cut()
        return self.total if cut is None else cut

    def budget_cut(self) -> int | None:
        """The count at which --budget ends the run, where that is short of the total: the
        units its deadline leaves at the current rate, the one in progress finished (a budget
        is checked between units). None without a deadline, a rate, or a cut. A line that
        showed the stopping rule's total (`2/31`, then `3/100` as the rule's forecast moved)
        while the budget ended it at 3 told of work that would never be done (stranger21)."""
        if self.deadline is None or not self.known or self.done >= self.total or self._priced_ahead():
            return None
        rate = self.rate()
        rate = self.prior_rate if rate is None else rate
        if not rate:
            return None
        if self.deadline <= self.moved and self.within is None:
            cut = self.done  # spent at this report: the check after it ends the run
        else:
            reach = self.progress() + max(0.0, self.deadline - self.moved) / rate
            cut = max(math.ceil(reach - 1e-9), self.done + 1)
        return cut if cut < self.total else None

    @property
    def eta_guess(self) -> bool:
        """Whether the ETA rests on a prior: a prior's total, a cost expected of units not yet
        timed, or a rate carried over a change of pace."""
        if self.guess or self._priced_ahead():
            return True
        return self.rate() is None and self.prior_rate is not None

    def progress(self) -> float:
        """Units done, with the part of the unit in progress that its backend has counted: a
        vector's product is a unit (a probe of Hutchinson's, a Lanczos step, a product of SLQ)."""
        if self.within is None:
            return float(self.done)
        done, total, vectors = self.within
        return self.done + done * vectors / max(total, 1)

    def eta(self) -> float | None:
        """Seconds left at the mean rate of the work done after the first report (units, and
        the counted part of the unit in progress: a block of minutes gives a rate before it ends)."""
        if not self.known:
            return None
        if self.done >= self.total:
            return 0.0
        rate = self.rate()
        if rate is None:
            rate = self.prior_rate
        return None if rate is None else rate * self.units_left()

    def remaining(self, now: float) -> float | None:
        """The ETA as it stands at `now`: counted from when the work last moved, since a unit of
        minutes would otherwise show a stale one."""
        eta = self.eta()
        return None if eta is None else max(0.0, eta - (now - self.moved))

    def within_text(self) -> str | None:
        """How far the unit in progress got: `product 4: samples 32/64` for a call with one
        vector (a unit is a product), `block: vectors 3/5` for a block of them."""
        if self.within is None:
            return None
        done, total, vectors = self.within
        if vectors == 1:
            return f"product {self.done + 1}: samples {done}/{total}"
        per = max(1, total // vectors)
        if done % per == 0:
            return f"block: vectors {done // per}/{vectors}"
        # a backend counts by batch, some vector by vector, some all vectors over a batch at
        # once: a part of a vector is no count a reader can take, the block's share is
        return f"block: {100 * done // total}% of {vectors} vectors"

    @property
    def known(self) -> bool:
        """Whether the total is known: a start report ("0 done", total 0) does not know it, nor
        does an estimator that has not yet forecast how many units its stopping rule needs."""
        return self.total > 0

    def line(self, now: float, *, end: bool = False) -> str:
        elapsed = f"elapsed {clock_text(now - self.started)}"
        within = None if end else self.within_text()
        about = "~" if self.guess and not end else ""  # a prior's total
        eta_about = "~" if self.eta_guess and not end else ""  # an ETA from a prior
        if end and not self.stop and self.done:
            # run its course: the count done is the total, whatever the last forecast said (a
            # stopping rule met may have forecast fewer units than the last block took, or more)
            parts = [f"{self.done}/{self.done}", elapsed]
        elif self.known:
            goal = self.total if end else self.goal()  # a stop's line: how far it got of the plan
            parts = [f"{self.done}/{about if goal == self.total else ''}{goal}", elapsed]
        elif self.done:  # units done, the total not yet forecast
            parts = [f"{self.done}/?", elapsed]
        else:
            parts = [elapsed]
        if within is not None:
            parts.insert(len(parts) - 1, within)
        if end:
            parts.insert(0, f"stopped by the {self.stop}" if self.stop else "done")
        elif self.known or self.done:
            left = self.remaining(now)
            parts.append(f"ETA {eta_about if left is not None else ''}{clock_text(left)}")
            budget = self.budget_text(now)
            if budget:
                parts.append(budget)
        elif within is None:
            # a second line before any count (a first product of minutes) is the same start
            parts.insert(0, "still starting" if "start" in self.said else "starting")
        if self.value is not None:
            parts.append(value_text(self.value, self.stderr, self.dof, self.bound))
        return f"{PREFIX} {self.desc}: " + " · ".join(parts)

    def shown(self, now: float) -> set[str]:
        """What a line now shows of the firsts written at once: a count, an ETA, an ETA from
        the run's own forecast (after one from a prior, the line that corrects it)."""
        eta = self.remaining(now) is not None
        return {w for w, r in (("count", self.done > 0 or self.within is not None), ("eta", eta),
                               ("forecast", eta and not self.eta_guess)) if r}

    def drifted(self, now: float) -> bool:
        """Whether the ETA now is far from the last line's, aged since (CORRECTION): by more than
        the factor and the seconds both, and the last line at least those seconds old."""
        left = self.remaining(now)
        if self.told is None or left is None or now - self.told[0] < CORRECTION_SECONDS:
            return False
        stale = max(0.0, self.told[1] - (now - self.told[0]))
        return abs(left - stale) >= CORRECTION_SECONDS and not stale / CORRECTION <= left <= stale * CORRECTION

    def budget_text(self, now: float) -> str | None:
        """`--budget stops it in H:MM:SS` where the budget ends the run short of its total (or
        the ETA runs past the probe's share of the budget); once the share is spent, that the
        unit in progress is the last (not `in 0:00:00` on each line until it ends)."""
        left = self.remaining(now)
        if self.deadline is None or left is None:
            return None
        if self.budget_cut() is None and now + left <= self.deadline:
            return None
        if now >= self.deadline:
            return f"{setting('budget')} spent: it stops when the unit in progress ends"
        return f"{setting('budget')} stops it in {clock_text(self.deadline - now)}"

    def forecast(self, now: float) -> float | None:
        """Seconds the whole run is forecast to take (from its start), once a rate and a total exist."""
        left = self.remaining(now)
        if left is None or not self.known or self.done >= self.total:
            return None
        return now - self.started + left

    def long_run_line(self, now: float, budget: bool = True) -> str | None:
        """What a run forecast past LONG_RUN says at once: how long, and how to make it shorter
        (products cost about in proportion to the samples, and --budget ends it on time)."""
        whole = self.forecast(now)
        if whole is None or whole <= LONG_RUN:
            return None
        if self.deadline is not None and self.deadline - self.started <= LONG_RUN:
            return None  # the budget already ends it within LONG_RUN
        if now - self.started > whole / 2:
            # past halfway a shorter run started afresh saves less than it costs, and the ETA
            # lines say how long: a forecast that first crosses LONG_RUN this late is the
            # stopping rule's noise (3:01 said at 1:33 of a run that took 2:18, stranger21)
            return None
        samples, fewer = self.samples, ""
        if samples is not None and samples > 1:
            fit = 1 << max(0, int(math.log2(max(1.0, samples * LONG_RUN * 0.8 / whole))))
            if fit < samples:
                fewer = f"{setting('samples', fit)} (about {clock_text(whole * fit / samples)})"
        line = (f"{PREFIX} {self.desc}: this run will take about {clock_text(whole)}; for a shorter one use "
                f"{fewer or setting('samples') + ' (fewer samples)'}")
        # `budget`: whether the command takes one (a gate runs fixed counts: none to offer)
        return f"{line}, or {setting('budget', 'SECONDS')}, which stops it on time" if budget else line

    def long_run_news(self, now: float, budget: bool = True) -> str | None:
        """The long-run line (long_run_line) the first time there is one, else None: said once."""
        hint = None if "long" in self.said else self.long_run_line(now, budget)
        if hint is not None:
            self.said.add("long")
        return hint
