"""Progress within a unit (a backend's passes over the samples, report/pulse.py), the firsts
written at once, a long run's forecast with how to shorten it, and an ETA past --budget: the
mechanism, on a fake clock and on small models; no timing is asserted."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch

from flatcheck.backends.autograd import AutogradBackend
from flatcheck.backends.func import FuncBackend
from flatcheck.engines.microbatch import BatchPlan
from flatcheck.linalg.forecast import Prior
from flatcheck.report.pulse import Passes, listening
from flatcheck.report import progress as progress_module
from flatcheck.report.progress import FIRST_AFTER, LONG_RUN, ProgressRenderer
from flatcheck.errors import words
from flatcheck.settings import flag_of
from tests.support.clock import FakeClock, lines_of
from tests.support.head import make_problem, mlp

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "demo" / "digits_cnn.safetensors"
SPEC = ROOT / "model_specs" / "demo_digits.yaml"


# ---------------------------------------------------------------- the display

def test_a_count_within_a_product_is_written_once_the_probe_has_run_a_while():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("lmax (lanczos)", 0, 0)
        clock.now += FIRST_AFTER / 2
        Passes(64, 1).add(32)  # too early to write: a fast probe writes its end line only
        assert lines_of(out) == []
        clock.now += FIRST_AFTER
        Passes(64, 1).add(32)
        assert lines_of(out) == ["flatcheck lmax (lanczos): product 1: samples 32/64 · elapsed 0:00:15"]
        Passes(64, 1).add(48)  # a count is already out: the ticker says the rest
        clock.now += 5
        progress("lmax (lanczos)", 1, 0)
        assert "product" not in progress.current.line(clock.now)  # a unit's report ends its count within
        clock.now += 1
        passes = Passes(64, 1)
        passes.add(16)
        assert progress.current.line(clock.now) == \
            "flatcheck lmax (lanczos): 1/? · product 2: samples 16/64 · elapsed 0:00:21 · ETA ?"
        passes.add(48)  # the call's last pass: its caller's report says it, not a count within
        assert progress.current.within == (16, 64, 1) and progress.current.samples == 64
        clock.now += 1
        progress("lmax (lanczos)", 2, 5)
        assert lines_of(out)[-1] == "flatcheck lmax (lanczos): 2/5 · elapsed 0:00:22 · ETA 0:00:06"  # the first ETA
    assert lines_of(out)[-1].startswith("flatcheck lmax (lanczos): done · 2/2")  # run its course: N/N


def test_a_block_counts_vectors():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("trace (hutchinson)", 0, 0)
        clock.now += FIRST_AFTER + 1
        block = Passes(40, 5)
        block.add(40)
        block.add(20)
        assert lines_of(out) == ["flatcheck trace (hutchinson): block: vectors 1/5 · elapsed 0:00:11"]
        # half a vector is no count: the block's share (stranger21: `vectors 0.64/4`)
        assert progress.current.line(clock.now).startswith("flatcheck trace (hutchinson): block: 30% of 5 vectors ·")


def test_nothing_listens_outside_a_renderer():
    passes = Passes(64, 1)
    assert passes.listener is None
    passes.add(32)  # nothing to tell, nothing fails
    heard = []
    with listening(lambda *a: heard.append(a)):
        Passes(10, 2).add(10)
        Passes(10, 2).add(5, 2)
    Passes(10, 2).add(10)
    assert heard == [(10, 20, 2), (10, 20, 2)]


@pytest.mark.parametrize("cli", [True, False])
def test_a_long_run_says_so_at_once_with_fewer_samples_and_the_budget(cli):
    clock, out = FakeClock(), io.StringIO()
    # the command line names its flags; measure(progress=True) its keywords
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock, name_of=flag_of if cli else None) as progress:
        progress("spectrum (SLQ)", 0, 0)
        clock.now += 3
        Passes(64, 1).add(32)
        clock.now += 3
        progress("spectrum (SLQ)", 1, 200)
        assert lines_of(out) == []  # one unit, which carries the one-off costs: no rate yet
        clock.now += 3
        progress("spectrum (SLQ)", 2, 200)
        # 198 units at 3 s: about 10 minutes in all; a product's cost goes with the samples. Then,
        # though it has run less than FIRST_AFTER, the first count and ETA of a run that long
        fewer = "--samples 8 (about 0:01:15), or --budget SECONDS" if cli else "samples=8 (about 0:01:15), or budget=SECONDS"
        assert lines_of(out) == [
            f"flatcheck spectrum (SLQ): this run will take about 0:10:03; for a shorter one use {fewer}, "
            "which stops it on time",
            "flatcheck spectrum (SLQ): 2/200 · elapsed 0:00:09 · ETA 0:09:54"]
        clock.now += 3
        progress("spectrum (SLQ)", 3, 200)
        assert len(lines_of(out)) == 2  # each said once


def test_a_long_run_under_a_command_without_a_budget_offers_none():
    """gate refuses --budget (its counts are fixed): its long-run line offered it (reviewer19)."""
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock, name_of=flag_of, budget=False) as progress:
        progress("trace (hutchinson)", 0, 0)
        for i in range(1, 3):
            clock.now += 3
            progress("trace (hutchinson)", i, 200)
    hint = next(line for line in lines_of(out) if "will take" in line)
    assert hint.endswith("for a shorter one use --samples (fewer samples)") and "budget" not in hint


def test_a_run_within_the_long_run_limit_gives_no_hint():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        for i in range(1, 20):
            clock.now += 0.9 * LONG_RUN / 20
            progress("trace (hutchinson)", i, 20)
    assert not any("will take" in line for line in lines_of(out))


def test_an_eta_past_the_budget_says_the_budget_stops_it():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("spectrum (SLQ)", 0, 0)
        progress.budget("spectrum (SLQ)", 60.0)
        for i in range(1, 4):
            clock.now += 5
            progress("spectrum (SLQ)", i, 200)
        line = progress.current.line(clock.now)
        # the count's total and the ETA are what the budget leaves: 45 s at 5 s a unit
        assert words(line, flag_of).endswith("3/12 · elapsed 0:00:15 · ETA 0:00:45 · --budget stops it in 0:00:45"), line
        assert words(line).endswith("ETA 0:00:45 · budget stops it in 0:00:45"), line
    # a budget that ends the run within LONG_RUN makes the forecast moot: no hint
    assert not any("will take" in line for line in lines_of(out))


def test_the_budget_reaches_the_display_from_a_probe(monkeypatch):
    from flatcheck import api
    from flatcheck.config import RunConfig, probe_requests

    heard = {}

    class Listener:
        def __call__(self, desc, done, total, **_):
            pass

        def budget(self, desc, seconds):
            heard[desc] = seconds

    config = RunConfig(checkpoint=CKPT, spec=SPEC, probes=probe_requests("lmax", {"lmax": {"max_iter": 3}}),
                       data="digits", samples=16, seed=0, budget=100.0)
    api.run(config, Listener())
    assert 0 < heard["lmax (lanczos)"] <= 100.0


# ---------------------------------------------------------------- the backends' counts

def record(call, builds: list | None = None) -> tuple[list[tuple[int, int, int]], object]:
    """The counts a call makes, and into `builds` the (count, seconds) of each kept build's end."""
    heard: list[tuple[int, int, int]] = []

    def listener(*count, built=0.0):
        if built:
            (builds if builds is not None else []).append((count, built))
        else:
            heard.append(count)

    with listening(listener):
        out = call()
    return heard, out


@pytest.fixture
def problem():
    torch.manual_seed(0)
    return make_problem(mlp(True), n=19, batch_size=8)  # batches of 8, 8 and 3


def test_autograd_counts_each_vector_over_each_batch_and_changes_no_value(problem):
    backend = AutogradBackend(problem)
    V = torch.randn(2, problem.layout.dim, dtype=torch.float64)
    heard, hv = record(lambda: backend.hvp(V))
    # batch by batch, the block's two vectors in each, to the call's last pass
    assert heard == [(8, 38, 2), (16, 38, 2), (24, 38, 2), (32, 38, 2), (35, 38, 2), (38, 38, 2)]
    assert torch.equal(hv, AutogradBackend(problem).hvp(V))
    S = torch.ones(2, problem.layout.dim, dtype=torch.int8)
    assert record(lambda: backend.hvp_sums(S))[0] == heard
    assert record(lambda: backend.vhv(S))[0] == heard
    assert record(lambda: backend.ggn_vp(V))[0] == [(16, 38, 2), (32, 38, 2), (38, 38, 2)]  # a block per batch


def test_autograd_tells_each_kept_build_and_no_other():
    # one batch: its graph is built and kept in the first call, reused after it
    torch.manual_seed(0)
    one = make_problem(mlp(True), n=8, batch_size=8)
    V = torch.randn(2, one.layout.dim, dtype=torch.float64)
    for method, arg in (("hvp", V), ("hvp_sums", V.sign().to(torch.int8)), ("vhv", V.sign().to(torch.int8)),
                        ("ggn_vp", V)):
        backend, builds = AutogradBackend(one), []
        first, _ = record(lambda: getattr(backend, method)(arg), builds)
        # at the build's end, before the first pass: nothing counted yet
        assert [count for count, _ in builds] == [(0, 16, 2)], method
        assert builds[0][1] > 0
        assert first[-1] == (16, 16, 2)
        again = []
        record(lambda: getattr(backend, method)(arg), again)
        assert again == [], method  # the kept graph costs the next call nothing
    # three batches: the first call keeps nothing (flatcheck.engines.kept), the second keeps them
    torch.manual_seed(0)
    three = make_problem(mlp(True), n=19, batch_size=8)
    backend = AutogradBackend(three)
    V = torch.randn(1, three.layout.dim, dtype=torch.float64)
    calls = [[], [], []]
    for builds in calls:
        record(lambda: backend.hvp(V), builds)
    assert calls[0] == [] and [count for count, _ in calls[1]] == [(0, 19, 1), (8, 19, 1), (16, 19, 1)]
    assert calls[2] == []


def test_the_rate_starts_after_a_kept_build_and_leaves_later_ones_out():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("lmax (lanczos)", 0, 0)
        clock.now += 6  # a basis's allocation, then the graph's building
        passes = Passes(64, 1)
        passes.built(4.0)
        clock.now += 3  # the first product's own pass
        passes.add(64)
        progress("lmax (lanczos)", 1, Prior(10))
        task = progress.current
        # from the build's end: 3 s a product, nine to go; a prior's total is shown as a guess
        assert task.eta() == pytest.approx(27.0)
        assert lines_of(out) == ["flatcheck lmax (lanczos): 1/~10 · elapsed 0:00:09 · ETA ~0:00:27"]
        clock.now += 5  # a product that built a batch's graph (kept) in 2 of its 5 s
        block = Passes(64, 2)
        block.built(2.0)
        block.add(64, 2)
        progress("lmax (lanczos)", 3, 10)
        assert task.eta() == pytest.approx((3 + 3) / 3 * 7)
        # the run's own forecast, after a prior's, is written at once
        assert lines_of(out)[-1] == "flatcheck lmax (lanczos): 3/10 · elapsed 0:00:14 · ETA 0:00:14"


def test_micro_batches_are_counted_as_the_pieces_they_are(problem):
    backend = AutogradBackend(problem)
    # --max-memory's cut (limit_memory), four samples a piece
    backend.batch_plan = BatchPlan(per_sample=1, allowance=4, size=4, largest_batch=8)
    V = torch.randn(1, problem.layout.dim, dtype=torch.float64)
    heard, _ = record(lambda: backend.hvp(V))
    assert heard == [(4, 19, 1), (8, 19, 1), (12, 19, 1), (16, 19, 1), (19, 19, 1)]  # 4+4, 4+4, 3


def test_func_counts_each_batch_of_a_vmapped_block(problem):
    backend = FuncBackend(problem)
    V = torch.randn(3, problem.layout.dim, dtype=torch.float64)
    assert record(lambda: backend.hvp(V))[0] == [(24, 57, 3), (48, 57, 3), (57, 57, 3)]
    assert record(lambda: backend.ggn_vp(V))[0] == [(24, 57, 3), (48, 57, 3), (57, 57, 3)]


def test_a_cli_trace_shows_its_count_within_a_block(monkeypatch):
    """The streamed Hutchinson block (the default trace with per-layer parts) counts its vectors
    as it goes; with FIRST_AFTER at 0 the first count is written at once, before the block ends."""
    from flatcheck import api
    from flatcheck.config import RunConfig, probe_requests

    monkeypatch.setattr(progress_module, "FIRST_AFTER", 0.0)
    out = io.StringIO()
    config = RunConfig(checkpoint=CKPT, spec=SPEC, data="digits", samples=32, batch_size=16, seed=0,
                       probes=probe_requests("trace", {"trace": {"probes_max": 4, "block_size": 4}}))
    with ProgressRenderer(out, interactive=False, period=3600) as progress:
        api.run(config, progress)
    lines = lines_of(out)
    assert re.match(r"flatcheck trace \(hutchinson\): (block: vectors \d/4|block: \d+% of 4 vectors|product 1: samples \d+/32) · "
                    r"elapsed", lines[0]), lines
    assert lines[-1].startswith("flatcheck trace (hutchinson): done · 4/4")


def test_a_count_within_a_block_gives_the_rate_before_the_block_ends():
    # the first block carries the one-off costs; a vector of the second block times a probe
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("trace (hutchinson)", 0, 0)
        clock.now += 40
        progress("trace (hutchinson)", 6, 100)
        assert progress.current.eta() is None
        clock.now += 3
        Passes(64, 6).add(64)
        task = progress.current
        assert task.progress() == 7 and task.eta() == pytest.approx(3.0 * 93)
        assert lines_of(out)[-1].endswith("6/100 · block: vectors 1/6 · elapsed 0:00:43 · ETA 0:04:39")
        clock.now += 10  # aged from the count, not from the block's start
        assert task.remaining(clock.now) == pytest.approx(3.0 * 93 - 10)


def test_counts_within_the_first_block_time_the_work_after_the_first_count():
    # the first count carries the graph's building: left out of the rate, as a first unit is
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("trace (hutchinson)", 0, 0)
        block = Passes(64, 6)
        clock.now += 20
        block.add(64)
        task = progress.current
        assert task.eta() is None  # no total yet, and one count: no rate
        clock.now += 4
        block.add(64)
        clock.now += 4
        block.add(64)
        assert task.progress() == 3 and task.eta() is None  # the rule has not forecast a total yet
        task.total = 100  # as a stderr forecast would
        assert task.eta() == pytest.approx(4.0 * 97)


def test_an_eta_that_drifts_far_from_the_last_line_is_written_at_once():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("lmax (lanczos)", 0, 0)
        for done, total in ((1, 8), (2, 8), (3, 8)):
            clock.now += 4
            progress("lmax (lanczos)", done, total)
        # the first ETA (6 units at 4 s), at the second unit; the third says the same, aged
        assert lines_of(out) == ["flatcheck lmax (lanczos): 2/8 · elapsed 0:00:08 · ETA 0:00:24"]
        clock.now += 4
        progress("lmax (lanczos)", 4, 13)  # 36 s against the 16 s the line said, aged: written
        assert lines_of(out)[-1] == "flatcheck lmax (lanczos): 4/13 · elapsed 0:00:16 · ETA 0:00:36"
        clock.now += 4
        progress("lmax (lanczos)", 5, 16)  # 44 s against 32: within the factor
        clock.now += 4
        progress("lmax (lanczos)", 6, 10)  # 16 s against 28: within the factor
        assert len(lines_of(out)) == 2
        clock.now += 4
        progress("lmax (lanczos)", 7, 9)  # 8 s against 24
        assert lines_of(out)[-1] == "flatcheck lmax (lanczos): 7/9 · elapsed 0:00:28 · ETA 0:00:08"
        clock.now += 1
        progress("lmax (lanczos)", 8, 30)  # 79 s against 7, but the last line is a second old
        assert len(lines_of(out)) == 3


def test_units_of_another_cost_are_timed_afresh():
    """Hutch++ without parts: a third of costly products (its sketch), then quadratic forms at
    a tenth of the cost. Timed at the sketch's rate, the forms' ETA said 38 s for 4 s of work
    (stranger19: `20/48 · ETA 0:00:14`, done at once); from pulse.pace_changes on, the rate
    is the forms' own."""
    from flatcheck.report.pulse import pace_changes

    def run(change: bool) -> float | None:
        clock = FakeClock()
        with ProgressRenderer(io.StringIO(), interactive=False, period=3600, clock=clock) as progress:
            progress("trace (hutchpp)", 0, 30)
            for i in range(1, 11):
                clock.now += 2.0
                progress("trace (hutchpp)", i, 30)
            if change:
                pace_changes()
                assert progress.current.remaining(clock.now) is None  # no rate of the forms yet
            clock.now += 3.0  # the first form carries its own build (tracing the tangent route)
            progress("trace (hutchpp)", 11, 30)
            clock.now += 0.2
            progress("trace (hutchpp)", 12, 30)
            return progress.current.remaining(clock.now)

    assert run(True) == pytest.approx(18 * 0.2)
    assert run(False) == pytest.approx(18 * 21.2 / 11)  # the mean rate since the first product
    pace_changes()  # nobody listening: nothing happens


def test_units_ahead_are_priced_at_their_expected_cost():
    """Hutch++ says before its sketch that its last two thirds (quadratic forms) will cost
    about half a sketch product each: the ETA during the sketch prices them so, and from the
    change of pace until a form is timed it is the sketch's rate times that cost, each marked
    as a guess (`~`); then the forms' own rate, unmarked."""
    from flatcheck.report.pulse import pace_changes

    clock = FakeClock()
    with ProgressRenderer(io.StringIO(), interactive=False, period=3600, clock=clock) as progress:
        progress("trace (hutchpp)", 0, 30)
        pace_changes(ahead=(10, 0.5))
        for i in range(1, 5):
            clock.now += 2.0
            progress("trace (hutchpp)", i, 30)
        task = progress.current
        assert task.remaining(clock.now) == pytest.approx(6 * 2.0 + 20 * 2.0 * 0.5)  # not 26 · 2.0
        assert "ETA ~0:00:32" in task.line(clock.now)
        for i in range(5, 11):
            clock.now += 2.0
            progress("trace (hutchpp)", i, 30)
        assert task.remaining(clock.now) == pytest.approx(20 * 1.0)
        pace_changes()  # the forms begin
        assert task.remaining(clock.now) == pytest.approx(20 * 1.0)  # carried over, still a guess
        assert "ETA ~0:00:20" in task.line(clock.now)
        clock.now += 3.0  # the first form carries its own build
        progress("trace (hutchpp)", 11, 30)
        clock.now += 0.2
        progress("trace (hutchpp)", 12, 30)
        assert task.remaining(clock.now) == pytest.approx(18 * 0.2)
        assert "ETA 0:00:04" in task.line(clock.now)
