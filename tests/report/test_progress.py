"""Progress on stderr: the first line within a second, a plain line on a timer and at
each probe's end when stderr is not a terminal, an ETA from the completed units, --quiet silences."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flatcheck.linalg.forecast import Prior
from flatcheck.report.progress import PREFIX, ProgressRenderer, Task
from flatcheck.report.starting import starting_line
from flatcheck.settings import flag_of
from tests.support.clock import FakeClock, lines_of
from tests.support.proc import HANG_GUARD

ROOT = Path(__file__).resolve().parents[2]
CKPT = ROOT / "demo" / "digits_cnn.safetensors"
SPEC = ROOT / "model_specs" / "demo_digits.yaml"
RUN = [sys.executable, "-m", "flatcheck", "trace", str(CKPT), "--spec", str(SPEC), "--samples", "64",
       "--batch-size", "32", "--no-layers"]
LINE = re.compile(r"^flatcheck (?P<desc>.+?): (?P<done>done · )?(?P<n>\d+)/(?P<total>\d+) · elapsed (\d+:\d\d:\d\d)"
                  r"(?: · ETA (?P<eta>[\d:?]+))?(?: · (?P<value>\S+)(?: ± (?P<stderr>\S+))?(?: \(rough ±: dof \d+\))?)?$")


def wait_until(condition, period: float) -> None:
    """Poll `condition` until it holds: the ticker runs on its own thread, and how soon it gets
    to write depends on the machine's load, so the tests wait for what it writes, not a time."""
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        assert time.monotonic() < deadline, "the ticker never wrote it"
        time.sleep(period / 5)


# ---------------------------------------------------------------- the ETA

def test_eta_leaves_out_the_first_unit_and_holds_within_2x_after_10_percent():
    # the first unit carries the one-off costs (30 s of tracing), the others take 1 s ± 40 %:
    # the ETA must stay within 2x of the time actually left from 10 % of the work on
    clock = FakeClock()
    task = Task("trace", started=clock.now)
    total, costs = 100, [30.0] + [1.0 + 0.4 * ((7 * i) % 11 - 5) / 5 for i in range(1, 100)]
    finish = clock.now + sum(costs)
    ratios = []
    for i, cost in enumerate(costs, start=1):
        clock.now += cost
        task.update(clock.now, i, total, None, None)
        eta = task.eta()
        if i == 1:
            assert eta is None  # one report: no rate yet
        elif i >= total // 10 and i < total:
            ratios.append(eta / (finish - clock.now))
    assert 0.5 <= min(ratios) and max(ratios) <= 2.0, (min(ratios), max(ratios))
    # averaging the first unit in would have said 4x the truth at 10 %
    naive = (sum(costs[:10]) / 10) * 90 / sum(costs[10:])
    assert naive > 2.0


def test_units_without_warm_up_forecast_from_the_first_one_done():
    # a scan's models: each loads afresh, so the first model's seconds are a model's seconds
    clock = FakeClock()
    models = Task("models", started=clock.now, warmup=False)
    clock.now += 144.3
    models.update(clock.now, 1, 2, None, None)
    assert models.eta() == pytest.approx(144.3)  # 1 left × 144.3 s per model
    clock.now += 60.0
    models.update(clock.now, 2, 4, None, None)
    assert models.eta() == pytest.approx(2 * (144.3 + 60.0) / 2)
    # resumed: 3 models were already done, in no time here; the rate is of the one run now
    resumed = Task("models", started=clock.now, warmup=False)
    clock.now += 50.0
    resumed.update(clock.now, 4, 6, None, None)
    assert resumed.eta() == pytest.approx(2 * 50.0)


def test_eta_is_unknown_until_a_second_report():
    task = Task("lmax", started=0.0)
    assert task.eta() is None
    task.update(5.0, 1, 10, None, None)
    assert task.eta() is None
    task.update(7.0, 2, 10, None, None)
    assert task.eta() == pytest.approx(16.0)


# ---------------------------------------------------------------- plain lines off a terminal

def test_plain_lines_at_each_probe_end_with_value_and_stderr():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        for i in range(1, 5):
            clock.now += 2
            progress("trace (hutchinson)", i, 4, value=40.0 + i, stderr=1.5)
        clock.now += 1
        progress("lmax (power)", 1, 20)
        progress("lmax (power)", 2, 20, value=7.25, stderr=None)
        # lmax converges at 2 of 20: its end line comes when the run ends
    got = [LINE.match(line) for line in lines_of(out)]
    assert all(got), lines_of(out)
    assert [(m["desc"], bool(m["done"]), m["n"], m["total"]) for m in got] == [
        ("trace (hutchinson)", True, "4", "4"), ("lmax (power)", True, "2", "2")]
    assert (got[0]["value"], got[0]["stderr"]) == ("44", "1.5")
    assert lines_of(out)[1].endswith(" · 7.25")  # a value without an error bar


def test_an_end_line_reads_the_count_done_over_itself():
    """A stopping rule met in a block larger than its last forecast ended "done · 72/64"
    (Hutchinson at rtol, stranger test); one met before its forecast "done · 2/20". Done is done:
    N/N. A budget stop keeps the total it fell short of."""
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("trace (hutchinson)", 0, 0)
        for done, total in ((48, 100), (72, 64)):  # the rule's forecast fell below the block's end
            clock.now += 1
            progress("trace (hutchinson)", done, total, value=1.656, stderr=0.078)
        progress("lmax (lanczos)", 3, 40)  # converged at 3 of a forecast 40: ends with the run
        progress("spectrum (SLQ)", 7, 300)
        progress.stopped("spectrum (SLQ)", "budget")
    assert [line.split(" · elapsed")[0] for line in lines_of(out)] == [
        "flatcheck trace (hutchinson): done · 72/72", "flatcheck lmax (lanczos): done · 3/3",
        "flatcheck spectrum (SLQ): stopped by the budget · 7/300"]


def test_no_end_line_when_the_run_fails():
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with ProgressRenderer(out, interactive=False, period=3600) as progress:
            progress("trace", 1, 4)
            raise RuntimeError("boom")
    assert out.getvalue() == ""  # the error line that follows is the last line


def test_a_single_long_unit_still_gets_lines_from_the_ticker():
    # one unit of work that takes many periods: no callback comes, the ticker writes the lines
    out, period = io.StringIO(), 0.05
    stamps: list[float] = []
    read = threading.local()  # the renderer's clock as each thread last read it: the time of its line

    def clock() -> float:
        read.now = time.monotonic()
        return read.now

    class Stamped(io.StringIO):
        def write(self, s: str) -> int:
            if s.endswith("\n"):
                stamps.append(read.now)
            return out.write(s)

    def running_lines() -> list[str]:
        return [line for line in lines_of(out) if line.startswith("flatcheck lmax (power): 1/3")]

    with ProgressRenderer(Stamped(), interactive=False, period=period, clock=clock) as progress:
        wait_until(lambda: lines_of(out), period)  # loading
        progress("lmax (power)", 1, 3, value=2.0, stderr=0.1)
        wait_until(lambda: len(running_lines()) >= 3, period)  # the second unit, still running
    lines = lines_of(out)
    assert lines[0].startswith(f"{PREFIX}: loading the model and data · elapsed")
    running = [line for line in lines if line.startswith("flatcheck lmax (power): 1/3")]
    assert len(running) >= 3 and "2 ± 0.1" in running[0]
    gaps = [b - a for a, b in zip(stamps, stamps[1:-1])]  # the last line is the probe's end, due at once
    assert min(gaps) >= period, gaps  # the ticker: never more often than its period
    assert lines[-1].startswith("flatcheck lmax (power): done · 1/1")  # run its course: N/N
    assert threading.active_count() == 1 or all(t.name != "flatcheck-progress" for t in threading.enumerate())


def test_the_bar_gets_our_eta_and_estimate():
    clock = FakeClock()
    with ProgressRenderer(io.StringIO(), interactive=True, clock=clock) as progress:
        for i in range(1, 4):
            clock.now += 10 if i == 1 else 2
            progress("trace", i, 11, value=3.0, stderr=0.5)
        fields = progress._bar.tasks[0].fields
        assert fields["eta"] == "0:00:16" and fields["estimate"] == "3 ± 0.5"  # 8 left at 2 s each
        clock.now += 2
        progress("trace", 4, Prior(12))  # a prior's total: the ETA is a guess, and says so
        assert progress._bar.tasks[0].fields["eta"] == "~0:00:16"


# ---------------------------------------------------------------- the first line

@pytest.mark.parametrize("argv, expected", [
    (["flatcheck", "trace", "m.safetensors", "--spec", "s.yaml"], "loading m.safetensors"),
    (["flatcheck", "adaptive-sharpness", "a.pt"], "loading a.pt"),
    (["flatcheck", "probe", "x"], "loading the model"),
    (["flatcheck", "trace", "m.safetensors", "-q"], None),
    (["flatcheck", "trace", "--help"], None),
    (["flatcheck", "list-probes"], None),
    (["flatcheck", "report", "a.json"], None),
    (["flatcheck"], None),
    # a required option left out: the parser's error comes first, with no loading announced
    (["flatcheck", "gate", "m.safetensors", "--spec", "s.yaml"], None),
    (["flatcheck", "gate", "m.safetensors", "--config", "g.yaml"], "loading m.safetensors"),
    (["flatcheck", "gate", "m.safetensors", "--config=g.yaml"], "loading m.safetensors"),
    (["flatcheck", "scan", "--checkpoints", "d"], None),
    (["flatcheck", "scan", "--checkpoints", "d", "--out", "r.jsonl"], "loading the model"),
])
def test_starting_line(argv, expected):
    line = starting_line(argv)
    assert (line is None) if expected is None else (expected in line and line.startswith(f"{PREFIX} {argv[1]}: "))


# ---------------------------------------------------------------- the CLI, stderr to a pipe

def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


# `python -m flatcheck …` that records which of the imports that take the seconds of a start
# (torch, numpy, typer, rich) were done when stderr got its first line
FIRST_LINE_SPY = """
import json, runpy, sys

record, real = sys.argv.pop(1), sys.stderr


class FirstLine:
    def write(self, text):
        sys.stderr = real
        with open(record, "w") as f:
            json.dump(sorted(m for m in ("numpy", "rich", "torch", "typer") if m in sys.modules), f)
        return real.write(text)

    def __getattr__(self, name):
        return getattr(real, name)


sys.stderr = FirstLine()
runpy.run_module("flatcheck", run_name="__main__", alter_sys=True)
"""


@pytest.mark.process
def test_cli_off_a_terminal_first_line_within_a_second_then_timer_and_end_lines(tmp_path):
    # within a second: the line is written before anything heavy is imported. The process says
    # what it had imported by then; a clock would measure the machine's load as well
    record = tmp_path / "imported.json"
    proc = subprocess.Popen([sys.executable, "-c", FIRST_LINE_SPY, str(record), *RUN[3:], "--probes-max", "24"],
                            cwd=ROOT, env=env(FLATCHECK_PROGRESS_SECONDS="0.3"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    _, stderr = proc.communicate(timeout=HANG_GUARD)
    assert proc.returncode == 0, stderr
    assert first.startswith("flatcheck trace: starting") and "digits_cnn.safetensors" in first
    assert json.loads(record.read_text()) == [], "imported before the first line"
    lines = stderr.splitlines()
    assert all(line.startswith(PREFIX) for line in lines), lines
    # the timer, while loading and while the first block of probes runs (the probe's start report
    # names it from its start on)
    assert any(line.startswith(("flatcheck: loading the model and data", "flatcheck trace (hutchinson): starting"))
               for line in lines), lines
    end = [m for m in map(LINE.match, lines) if m and m["done"]]
    assert len(end) == 1 and end[0]["desc"] == "trace (hutchinson)" and end[0]["n"] == end[0]["total"] == "24"
    assert end[0]["value"] and end[0]["stderr"]
    assert lines[-1] == end[0].string


@pytest.mark.process
def test_cli_quiet_writes_nothing_to_stderr():
    proc = subprocess.run(RUN + ["--probes-max", "2", "-q"], cwd=ROOT, env=env(FLATCHECK_PROGRESS_SECONDS="0.1"),
                          capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "Tr(H)" in proc.stdout


@pytest.mark.process
def test_cli_refuses_a_bad_period():
    proc = subprocess.run(RUN + ["--probes-max", "2"], cwd=ROOT, env=env(FLATCHECK_PROGRESS_SECONDS="soon"),
                          capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].startswith("error: $FLATCHECK_PROGRESS_SECONDS")


def test_an_end_reported_twice_is_one_end():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("lmax (lanczos)", 0, 0)
        for done in (2, 4, 4):  # the step that met the stop, then the estimator's end
            clock.now += 1
            progress("lmax (lanczos)", done, 4)
    assert lines_of(out) == ["flatcheck lmax (lanczos): done · 4/4 · elapsed 0:00:02"]


def test_a_probe_run_twice_gets_two_end_lines():
    # invariance runs the probes before and after the rescaling under one renderer
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        for _ in range(2):
            for i in range(1, 4):
                clock.now += 1
                progress("trace (hutchinson)", i, 3, value=5.0, stderr=0.5)
    ends = [line for line in lines_of(out) if ": done · 3/3" in line]
    assert len(ends) == 2 and all(line.endswith("5 ± 0.5") for line in ends)


@pytest.mark.process
def test_scan_off_a_terminal_says_which_model_loads_and_each_model_done(tmp_path):
    models = tmp_path / "models.txt"
    models.write_text("test_resnet\ntest_convnext\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "flatcheck", "scan", "--models-file", str(models), "--probes", "gini,trace",
           "-o", "trace.probes_max=2", "--data", "synthetic", "--samples", "8", "--batch-size", "8",
           "--out", str(tmp_path / "scan.jsonl")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env(FLATCHECK_PROGRESS_SECONDS="0.3"), capture_output=True, text=True,
                          timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert all(line.startswith(PREFIX) for line in lines), lines
    assert any(line.startswith("flatcheck: model 1/2: loading test_resnet") for line in lines)
    done = [line for line in lines if line.startswith("flatcheck scan: ok")]
    assert [d.split()[3] for d in done] == ["test_resnet", "test_convnext"], done
    # each model loads afresh, so one model done is enough for a forecast of the next
    assert re.search(r"1/2 models · ETA \d+:\d\d:\d\d$", done[0]), done
    assert "2/2 models · ETA 0:00:00" in done[1]
    assert any(line.startswith("flatcheck test_convnext: trace (hutchinson): done · 2/2") for line in lines)


def test_a_zero_done_report_starts_the_clock_and_is_not_a_unit():
    clock = FakeClock()
    out = io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        clock.now += 50  # loading
        progress("lmax", 0, 4)
        clock.now += 20  # the first unit: tracing and the like
        progress("lmax", 1, 4)
        assert progress.current.eta() is None  # one unit done: no rate yet
        clock.now += 2
        progress("lmax", 2, 4)
        assert progress.current.eta() == pytest.approx(4.0)
        clock.now += 2
        progress("lmax", 4, 4)
    # past FIRST_AFTER seconds the first count and the first ETA are written at once, not at a tick
    assert lines_of(out) == ["flatcheck lmax: 1/4 · elapsed 0:00:20 · ETA ?",
                             "flatcheck lmax: 2/4 · elapsed 0:00:22 · ETA 0:00:04",
                             "flatcheck lmax: done · 4/4 · elapsed 0:00:24"]


# ---------------------------------------------------------------- a probe's start, a budget's stop

def test_a_start_report_names_the_probe_before_its_first_unit():
    # the start report ("0 done", total not yet known) comes before the first block of products:
    # the ticker names the probe from then on instead of "loading the model and data"
    out, period = io.StringIO(), 0.05
    with ProgressRenderer(out, interactive=False, period=period) as progress:
        wait_until(lambda: lines_of(out), period)  # loading
        progress("trace (hutchinson)", 0, 0)
        # the first block, still running
        wait_until(lambda: sum(line.startswith("flatcheck trace") for line in lines_of(out)) >= 2, period)
        progress("trace (hutchinson)", 10, 20, value=3.0, stderr=0.5)
        assert progress.current.eta() is None  # the block is the first unit: no rate yet
        progress("trace (hutchinson)", 20, 20, value=3.0, stderr=0.5)
    lines = lines_of(out)
    start = next(i for i, line in enumerate(lines) if "trace" in line)
    assert lines[0].startswith(f"{PREFIX}: loading the model and data · elapsed")
    # one start: the ticker's lines after the first, still before any count, say it goes on
    # (two lines that each said "starting" read as two starts: stranger21)
    assert len(lines) - start >= 3, lines
    assert lines[start].startswith("flatcheck trace (hutchinson): starting · elapsed "), lines
    assert all(line.startswith("flatcheck trace (hutchinson): still starting · elapsed ")
               for line in lines[start + 1:-1]), lines
    assert re.match(r"flatcheck trace \(hutchinson\): done · 20/20 · elapsed \d+:\d\d:\d\d · 3 ± 0.5$", lines[-1])


def test_a_probe_that_only_started_ends_with_a_plain_done_line():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress("gap", 0, 0)
        clock.now += 3
    assert lines_of(out) == ["flatcheck gap: done · elapsed 0:00:03"]


def test_a_probe_that_reports_no_units_still_ends_with_its_line():
    """head-trace and relative-flatness (closed forms) wrote no end line, alone or within
    `probe` (stranger test): the run tells the display each probe's bounds (api.run), and a
    probe that wrote no end line of its own gets one, with its headline; one that did gets no
    second, and a stage it left short of its forecast ends with the probe, not later."""
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress.began("head-trace")
        clock.now += 2
        progress.ended("head-trace", 0.4685, None)
        progress.began("lmax")
        progress("lmax (lanczos)", 0, 0)
        clock.now += 1
        progress("lmax (lanczos)", 3, 40, value=2.146)  # converged before its forecast
        clock.now += 1
        progress.ended("lmax", 2.146, None, None, 1.4e-7)  # its bound, as the table shows it
        clock.now += 5  # relative-flatness runs: lmax's end line is not this late
        progress.began("relative-flatness")
        progress.ended("relative-flatness", 2.846, 0.01)
        # a count of samples has no running value: the probe's headline completes its line,
        # not a part's ("decomposition: Tr(G)"), which it would mislabel
        progress.began("jacobian")
        progress("jacobian (exact)", 0, 0)
        progress("jacobian (exact)", 16, 16)
        clock.now += 1
        progress.ended("jacobian", 41.86, None)
        progress.began("decomposition")
        progress("decomposition", 0, 0)
        progress("decomposition", 16, 16)
        progress("decomposition: Tr(G)", 0, 0)
        progress("decomposition: Tr(G)", 1, 1)
        progress.ended("decomposition", 0.5, None)
    assert lines_of(out) == ["flatcheck head-trace: done · 1/1 · elapsed 0:00:02 · 0.4685",
                             "flatcheck lmax (lanczos): done · 3/3 · elapsed 0:00:02 · 2.146 (within 1.4e-07)",
                             "flatcheck relative-flatness: done · 1/1 · elapsed 0:00:00 · 2.846 ± 0.01",
                             "flatcheck jacobian (exact): done · 16/16 · elapsed 0:00:00 · 41.86",
                             "flatcheck decomposition: done · 16/16 · elapsed 0:00:00",
                             "flatcheck decomposition: Tr(G): done · 1/1 · elapsed 0:00:00"]


def end_lines_of_run(names: list[str], cheap: dict) -> tuple[list[str], list[str]]:
    """The descriptions of the end lines of one api.run of `names` on the demo model, and all lines."""
    from flatcheck import api
    from flatcheck.config import RunConfig, probe_requests

    config = RunConfig(checkpoint=CKPT, spec=SPEC, probes=probe_requests(names, {k: v for k, v in cheap.items()
                                                                                 if k in names}),
                       data="digits", samples=16, batch_size=16, seed=0)
    out = io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600) as progress:
        api.run(config, progress)
    return [m["desc"] for m in map(LINE.match, lines_of(out)) if m and m["done"]], lines_of(out)


def test_closed_form_and_sample_count_probes_end_with_their_headline_within_a_run():
    ends, lines = end_lines_of_run(["head-trace", "gini", "relative-flatness", "jacobian"], {})
    assert ends == ["head-trace", "gini", "relative-flatness", "jacobian (exact)"], lines
    assert all(LINE.match(line)["value"] for line in lines), lines  # each with its headline


@pytest.mark.workflow
def test_every_listed_probe_ends_with_a_line_within_probe():
    from flatcheck.probes.registry import list_probes

    names = list_probes()
    cheap = {"trace": {"probes_max": 4, "block_size": 4}, "lmax": {"k": 1, "max_iter": 3},
             "spectrum": {"lanczos_steps": 3, "starts": 2},
             "adaptive-sharpness": {"method": "second-order", "probes_max": 4}}
    ends, lines = end_lines_of_run(names, cheap)
    # a probe's lines are named for it, or for its stage: "lmax (lanczos)", "decomposition: Tr(G)"
    missing = [n for n in names if not any(d == n or d.startswith((n + " ", n + ":")) for d in ends)]
    assert not missing, lines


def test_a_start_report_pulses_at_a_terminal():
    with ProgressRenderer(io.StringIO(), interactive=True, clock=FakeClock()) as progress:
        progress("lmax (lanczos)", 0, 0)
        bar = progress._bar.tasks
        assert [t.description for t in bar] == ["lmax (lanczos)"] and bar[0].total is None  # phase bar gone
        progress("lmax (lanczos)", 1, 8)
        assert bar[0].total == 8 and bar[0].completed == 1


def test_a_budget_stop_says_so_with_how_far_it_got():
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock, name_of=flag_of) as progress:
        for i in range(1, 8):
            clock.now += 1
            progress("spectrum (SLQ)", i, 300)
        progress.stopped("spectrum (SLQ)", "budget")
        progress.stopped("never reported", "budget")  # nothing to say
    # 300 units at 1 s: past LONG_RUN, which it says as soon as it has a rate, and its first count
    # and ETA with it (a run that long is no fast probe)
    assert lines_of(out) == [
        "flatcheck spectrum (SLQ): this run will take about 0:05:00; for a shorter one use --samples (fewer "
        "samples), or --budget SECONDS, which stops it on time",
        "flatcheck spectrum (SLQ): 2/300 · elapsed 0:00:02 · ETA 0:04:58",
        "flatcheck spectrum (SLQ): stopped by the budget · 7/300 · elapsed 0:00:07"]


def recorded_calls(probe: str, **options) -> list[tuple]:
    """The progress calls of one probe run on the demo model, in order."""
    from flatcheck import api
    from flatcheck.config import RunConfig, probe_requests

    calls: list[tuple] = []

    def listener(desc, done, total, *, value=None, stderr=None):
        calls.append((desc, done, total))

    config = RunConfig(checkpoint=CKPT, spec=SPEC, probes=probe_requests(probe, {probe: options}), data="digits",
                       samples=32, batch_size=16, seed=0)
    api.run(config, listener)
    return calls


@pytest.mark.parametrize("probe, options, desc", [
    ("trace", {"probes_max": 4, "block_size": 4, "parts": False}, "trace (hutchinson)"),
    ("lmax", {"k": 1, "max_iter": 3}, "lmax (lanczos)"),
    ("spectrum", {"lanczos_steps": 3, "starts": 2}, "spectrum (SLQ)"),
    ("gini", {}, "gini"),
])
def test_every_probe_reports_its_start_before_its_first_unit(probe, options, desc):
    calls = recorded_calls(probe, **options)
    assert calls[0] == (desc, 0, 0), calls[:3]
    assert calls[-1][1] == calls[-1][2] > 0  # and its last unit, done of a known total


@pytest.mark.parametrize("probe, options, desc", [
    ("mls", {"method": "exact"}, "mls"),
    ("mls", {"method": "estimate", "nmls": False, "projections": 2, "lanczos_iters": 2}, "mls (estimate)"),
    ("jacobian", {"method": "estimate", "projections": 2, "lanczos_iters": 2}, "jacobian (estimate)"),
    ("decomposition", {"method": "exact"}, "decomposition"),
])
def test_per_sample_probes_count_samples_as_they_go(probe, options, desc):
    """A batch of slow samples (1,000 rows each on a ViT) showed "starting" and then "1/1", with no
    count or ETA between (stranger test): progress is in samples, after every chunk."""
    calls = [c for c in recorded_calls(probe, **options) if c[0] == desc]
    assert calls[0] == (desc, 0, 0) and calls[-1] == (desc, 32, 32), calls
    done = [d for _, d, _ in calls[1:]]
    assert done == sorted(done) and len(done) >= 2 and all(t == 32 for _, _, t in calls[1:])


def test_cli_gini_and_gap_write_their_end_line_off_a_terminal():
    from flatcheck.cli import app
    from tests.support.cli import make_runner

    for probe in ("gini", "gap"):
        result = make_runner().invoke(app, [probe, str(CKPT), "--spec", str(SPEC), "--samples", "32"])
        assert result.exit_code == 0, result.output
        ends = [m for m in map(LINE.match, result.stderr.splitlines()) if m and m["done"]]
        assert [(m["desc"], m["n"], m["total"]) for m in ends] == [(probe, "1" if probe == "gini" else "2",
                                                                     "1" if probe == "gini" else "2")]
        assert ends[0]["value"], ends[0].string


@pytest.mark.process
def test_cli_spectrum_under_a_budget_ends_with_the_products_it_made():
    proc = subprocess.run([sys.executable, "-m", "flatcheck", "spectrum", str(CKPT), "--spec", str(SPEC),
                           "--samples", "64", "--budget", "0.3", "--json", "-"], cwd=ROOT,
                          env=env(FLATCHECK_PROGRESS_SECONDS="3600"), capture_output=True, text=True, timeout=HANG_GUARD)
    assert proc.returncode == 0, proc.stderr
    result = __import__("json").loads(proc.stdout)["results"]["spectrum"]
    assert result["details"]["stop_reason"] == "budget"
    last = proc.stderr.splitlines()[-1]
    # 2 starts × (100 steps and the product for the part outside each basis)
    assert last.startswith(f"flatcheck spectrum (SLQ): stopped by the budget · {result['matvecs']}/202 · "), last


@pytest.mark.parametrize("probe, options, desc", [
    ("trace", {"probes_max": 40}, "trace (hutchinson)"),
    ("lmax", {"k": 1}, "lmax (lanczos)"),
    ("adaptive-sharpness", {"method": "second-order", "probes_max": 40}, "adaptive-sharpness (second order)"),
])
def test_a_budget_stop_of_an_iterative_probe_is_told_to_the_display(probe, options, desc):
    """trace, lmax and adaptive sharpness stopped by --budget end their line "stopped by the
    budget", as spectrum does, not as though they had run their course."""
    import time as _time

    from flatcheck.probes.registry import ProbeContext, create_probe, parse_options
    from tests.support.dense import make_case

    events = []

    class Listener:
        def __call__(self, desc, done, total, **_k):
            events.append(("progress", desc))

        def stopped(self, desc, reason):
            events.append(("stopped", desc, reason))

    ctx = ProbeContext(make_case("mlp").backend(), seed=0, progress=Listener(), deadline=_time.monotonic() - 1)
    result = create_probe(probe).run(ctx, parse_options(probe, options))
    assert result.details["stop_reason"] == "budget"
    assert events[-1] == ("stopped", desc, "budget")


def test_adaptive_sharpness_progress_shows_the_headline_units():
    """The second-order route estimates Tr(diag|w| H diag|w|); the headline is ρ²/2 times it,
    and so is the running estimate on the progress line."""
    from flatcheck.probes.registry import ProbeContext, create_probe, parse_options
    from tests.support.dense import make_case

    seen = []
    ctx = ProbeContext(make_case("mlp").backend(), seed=0,
                       progress=lambda desc, done, total, value=None, stderr=None: seen.append((desc, value)))
    result = create_probe("adaptive-sharpness").run(ctx, parse_options("adaptive-sharpness", {
        "method": "second-order", "probes_max": 12, "rho": 0.01}))
    last = [v for d, v in seen if d == "adaptive-sharpness (second order)" and v is not None][-1]
    assert last == pytest.approx(result.value, rel=1e-12)


# ---------------------------------------------------------------- forecast totals

def test_a_count_without_a_forecast_shows_n_of_unknown_and_no_eta():
    clock = FakeClock()
    task = Task("lmax (lanczos)", started=clock.now)
    clock.now += 5
    task.update(clock.now, 1, 0, 3.0, None)
    assert task.eta() is None
    assert task.line(clock.now) == "flatcheck lmax (lanczos): 1/? · elapsed 0:00:05 · ETA ? · 3"


def test_the_eta_follows_a_forecast_total_and_counts_from_the_last_report():
    """A stopping rule's forecast (the total) may change from one report to the next; the ETA is
    the mean rate since the first unit times what the latest forecast leaves, less the time
    since that report."""
    clock = FakeClock()
    task = Task("lmax (lanczos)", started=clock.now)
    for done, total in [(1, 0), (2, 20), (3, 12), (4, 8)]:
        clock.now += 10.0
        task.update(clock.now, done, total, None, None)
    assert task.eta() == pytest.approx(10.0 * 4)  # 10 s a unit, 4 units forecast left
    clock.now += 15.0  # the ticker's line, 15 s after the last report
    assert task.line(clock.now).endswith("4/8 · elapsed 0:00:55 · ETA 0:00:25")


def test_run_commands_are_the_registered_probes_and_the_multi_probe_commands():
    """The probes package also holds the registry, the gating protocol, the catalogue and the
    shared kit: none of them is a command that loads a model."""
    from flatcheck.probes.registry import list_probes
    from flatcheck.report.starting import run_commands

    assert run_commands() == set(list_probes()) | {"probe", "gate", "scan", "invariance", "track"}


def test_a_headline_on_few_degrees_of_freedom_ends_its_line_marked_rough():
    """spectrum's default 2 starts give its headline's stderr 1 dof: its end line marks the ±
    rough, as the table does (render.fmt_result); a stderr on many dof is left bare."""
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress.began("spectrum")
        progress("spectrum (SLQ)", 0, 0)
        progress("spectrum (SLQ)", 200, 200)
        progress.ended("spectrum", 120.4, 4.6, 1)
        progress.began("relative-flatness")
        progress.ended("relative-flatness", 2.846, 0.01, 40)
    spectrum, flatness = lines_of(out)
    assert spectrum.startswith("flatcheck spectrum (SLQ): done · 200/200") and spectrum.endswith(
        "120.4 ± 4.6 (rough ±: dof 1)"), spectrum
    assert flatness.endswith("2.846 ± 0.01"), flatness


def test_a_last_stage_that_reported_its_estimate_ends_marked_rough_on_few_dof():
    """Hutch++ at 6 products (k = 2) reports its own estimate on its last line: the headline's
    dof (1) marks that line too; a stage whose estimate is not the headline's (adaptive
    sharpness's second-order line under a Monte Carlo headline) is left unmarked."""
    clock, out = FakeClock(), io.StringIO()
    with ProgressRenderer(out, interactive=False, period=3600, clock=clock) as progress:
        progress.began("trace")
        progress("trace (hutchpp)", 0, 0)
        progress("trace (hutchpp)", 6, 6, value=7.186, stderr=0.4)
        progress.ended("trace", 7.186, 0.4, 1)
        progress.began("adaptive-sharpness")
        progress("adaptive-sharpness (second order)", 0, 0)
        progress("adaptive-sharpness (second order)", 8, 8, value=0.25, stderr=0.1)
        progress.ended("adaptive-sharpness", 0.31, 0.2, 3)
    trace, sharpness = lines_of(out)
    assert trace.endswith("7.186 ± 0.4 (rough ±: dof 1)"), trace
    assert sharpness.endswith("0.25 ± 0.1"), sharpness
