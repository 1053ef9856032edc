"""What a CI log showed a stranger (stranger21), replayed on a fake clock: a count's total and ETA
under --budget, a part of a vector within a block, a prior held across Hutch++'s change of pace
until a form is timed, and a long-run forecast that first crosses the limit late. The calls are
those the probes made (their times rounded); no timing is asserted."""

from __future__ import annotations

import io

import pytest

from flatcheck.errors import words
from flatcheck.report.progress import ProgressRenderer
from flatcheck.report.pulse import Passes, pace_changes
from flatcheck.settings import flag_of
from tests.support.clock import FakeClock, lines_of

TRACE = "trace (hutchinson)"


def test_a_budget_bounds_the_count_and_says_once_that_it_is_spent():
    """ResNet-18's trace under --budget 60: a block of two probes, its second 21 s, then one more
    of 21 s started with 11 s left. The line said `2/31 · ETA 0:09:40`, then `3/100 · ETA 0:33:17`, and
    `--budget stops it in 0:00:00` twice; the budget ends it at 3."""
    clock, out = FakeClock(), io.StringIO()
    t0 = clock.now
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock, name_of=flag_of) as progress:
        progress(TRACE, 0, 0)
        progress.budget(TRACE, 60.0)
        clock.now = t0 + 28
        block = Passes(64, 2)
        block.add(64)  # the block's first vector: the anchor (it carries the graph's build)
        clock.now = t0 + 49
        progress(TRACE, 2, 31, value=1627.0, stderr=320.0)
        task = progress.current
        # 21 s a probe, 11 s of budget left: the third probe is the last
        assert lines_of(out)[-1] == ("flatcheck trace (hutchinson): 2/3 · elapsed 0:00:49 · ETA 0:00:21 · "
                                     "--budget stops it in 0:00:11 · 1627 ± 3.2e+02")
        clock.now = t0 + 64  # past the deadline, the third probe still running (a ticker's line)
        line = words(task.line(clock.now), flag_of)
        assert line.startswith("flatcheck trace (hutchinson): 2/3 · ") and "0:00:00" not in line, line
        assert "--budget spent: it stops when the unit in progress ends" in line
        progress._say(task, clock.now)
        written = len(lines_of(out))
        clock.now = t0 + 70
        progress(TRACE, 3, 100, value=1195.0, stderr=520.0)  # the rtol rule's forecast of 3 probes
        assert task.line(clock.now).startswith("flatcheck trace (hutchinson): 3/3 · ")
        assert len(lines_of(out)) == written  # no line of its own: the ETA it would correct was right
        progress.stopped(TRACE, "budget")
    lines = lines_of(out)
    assert not any("3/100 · elapsed" in line and "stopped" not in line for line in lines), lines
    assert lines[-1].startswith("flatcheck trace (hutchinson): stopped by the budget · 3/100 · elapsed 0:01:10")


def test_a_budget_that_leaves_the_total_in_reach_changes_nothing():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress(TRACE, 0, 0)
        progress.budget(TRACE, 600.0)
        for i in range(1, 5):
            clock.now += 5
            progress(TRACE, i, 20)
        line = progress.current.line(clock.now)
    assert "4/20 · elapsed 0:00:20 · ETA 0:01:20" in line and "budget" not in line, line


@pytest.mark.parametrize("done, expected", [
    (1280, "block: 14% of 9 vectors"),  # a vector and 28 % of the next: no count in whole vectors
    (2000, "block: vectors 2/9"),
    (3000, "block: vectors 3/9"),
])
def test_a_count_within_a_block_is_whole_vectors_or_the_blocks_share(done, expected):
    """Hutch++'s pieces of 9 vectors over 1,000 samples, counted by batches of 128: the line
    said `block: vectors 1.28/9` (stranger21: `0.64/4`, `2.5/6`)."""
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("trace (hutchpp)", 0, 0)
        clock.now += 1
        Passes(1000, 9).add(done)
        assert progress.current.within_text() == expected


def _sketched(progress: ProgressRenderer, clock: FakeClock, products: int, seconds: float, total: int):
    """Hutch++'s sketch of `products` products at `seconds` each, its forms announced at half
    a product's cost: the task, at the change of pace."""
    progress("trace (hutchpp)", 0, 0)
    pace_changes(ahead=(products, 0.5))
    for i in range(products):
        clock.now += seconds
        progress("trace (hutchpp)", i + 1, total)
    return progress.current


def test_a_prior_holds_across_a_change_of_pace_until_a_whole_form_is_timed():
    """Hutch++ on the demo CNN, loaded machine: the sketch at 2 s a product, forms priced at half
    that. The first form's first batch carries its build; its next batch, a tenth of a form,
    took 0.5 s on a busy core, and its rate (5 s a form) replaced the prior at once: the ETA
    went from ~0:00:20 to 0:01:40 within a second (stranger21: ~0:00:24 to 0:01:09, with 0:00:30
    left), and the correction was written as a line of its own."""
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        task = _sketched(progress, clock, products=10, seconds=2.0, total=30)
        pace_changes()
        written = len(lines_of(out))
        form = Passes(1000, 10)
        clock.now += 3.0
        form.add(100)  # the forms' anchor: their build is behind it
        clock.now += 0.5
        form.add(100)
        assert task.remaining(clock.now) == pytest.approx((30 - 10.2) * 1.0)  # the prior, still
        assert "ETA ~0:00:20" in task.line(clock.now)
        assert len(lines_of(out)) == written  # no correction: nothing new is known
        for _ in range(9):  # a whole form timed past the anchor, at 0.1 s a tenth: its own rate
            clock.now += 0.1
            form.add(100)
        assert task.remaining(clock.now) == pytest.approx((30 - 11.1) * (0.5 + 9 * 0.1))
        assert "~" not in task.line(clock.now).split("ETA ")[1]


def test_a_forecast_that_first_crosses_the_long_run_limit_past_halfway_says_nothing():
    """ResNet-18's lmax: its forecast of the whole run stayed under 3 minutes until 1:33, then
    read 3:01 once (its stopping rule forecast 20 steps, and it took 16; the run took 2:18): a
    line that advised `--samples 32 (about 0:01:30)` with 1:28 left."""
    clock, out = FakeClock(), io.StringIO()
    t0 = clock.now
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("lmax (lanczos)", 0, 0)
        clock.now = t0 + 10
        progress("lmax (lanczos)", 1, 16)
        for step in range(2, 13):
            clock.now = t0 + 10 + 7.5 * (step - 1)
            # 22 at step 12: 92.5 s in, 10 steps left at 7.5 s, 167.5 s in all; at 24, 182.5 s
            progress("lmax (lanczos)", step, 24 if step == 12 else 16)
        assert progress.current.forecast(clock.now) > 180
    assert not any("will take" in line for line in lines_of(out)), lines_of(out)
