"""Smoke test of benchmarks/bench_peers.py: its own code paths on the demo model at toy sizes.

Every flatcheck backend (but distributed) must produce every row without an error; peers that
are not installed appear as rows saying so, and installed peers' failures are rows too (the
benchmark records them, it does not hide them), so nothing here depends on the bench extra.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # importable by name: the forkserver children import it too
from peers import report, runner  # noqa: E402
from peers.rows import Row, median_row  # noqa: E402
from peers.tasks import DataCfg, ModelCfg, Task, plan  # noqa: E402


def toy_plan(*kinds: str) -> list:
    one, two = DataCfg(16, 16), DataCfg(16, 8)
    tasks = {
        "trace": [Task("trace", one, dict(probes=4)), Task("trace", two, dict(probes=3))],
        "trace1": [Task("trace", one, dict(probes=2))],
        "eig": [Task("eig", DataCfg(16, 16, "float64"), dict(k=2, tol=1e-4, max_iter=30, power_iter=30))],
        "slq": [Task("slq", one, dict(steps=4, starts=2))],
        "hvpgrad": [Task("hvpgrad", two, dict(block=2))],
        "block": [Task("block", one, dict(block=3))],
        "ggn": [Task("ggn", one, dict(probes=4))],
    }
    demo = plan(["demo"], False)[0]
    return [ModelCfg("demo", demo.title, demo.spec, demo.data, demo.checkpoint,
                        tuple(t for k in kinds for t in tasks[k]))]


@pytest.fixture(scope="module")
def inline_run():
    args = runner.parse_args(["--inline", "--models", "demo"])
    models = toy_plan("trace", "eig", "slq", "hvpgrad", "block", "ggn")
    return models, *runner.run_all(args, log=lambda s: None, models=models)[1:]


def test_every_backend_every_task(inline_run):
    models, rows, _ = inline_run
    backends, broken = runner.discover_backends()
    assert "autograd" in backends and "distributed" not in backends
    assert not broken, f"flatcheck backends failed to import: {broken}"
    fc = [r for r in rows if r.is_flatcheck]
    # plus the trace with per-layer parts (HVPs), beside the autograd total (forward tangents)
    assert {r.tool for r in fc} == {f"flatcheck[{b}]" for b in backends} | {"flatcheck[autograd+parts]"}
    for r in fc:
        assert r.error is None, f"{r.tool} {r.task}: {r.error}"
        assert r.seconds is not None and r.seconds > 0
    for r in fc:
        if r.task_kind == "trace":
            assert r.hvps == 4 or r.hvps == 3
            assert math.isfinite(r.extra["value"])
        if r.task_kind == "eig":
            assert len(r.extra["values"]) == 2 and r.extra["converged"]
        if r.task_kind == "hvpgrad":
            assert r.extra["ratio"] > 0
        if r.task_kind == "ggn":
            assert r.extra["probes_needed"] >= 1 and r.extra["exact_in_grads"] > 0
    # backends agree: same seed, same probes
    traces = {r.tool: r.extra["value"] for r in fc if r.task_kind == "trace" and "1 batch" in r.task}
    ref = traces["flatcheck[autograd]"]
    assert len(traces) == len(backends) + 1
    assert all(abs(v - ref) <= 1e-3 * abs(ref) + 1e-6 for v in traces.values()), traces
    routes = {r.tool: r.notes for r in fc if r.task_kind == "trace"}
    assert "forward tangents" in routes["flatcheck[autograd]"] and "FAILED" not in routes["flatcheck[autograd]"]
    assert "double-backward HVPs" in routes["flatcheck[autograd+parts]"]


def test_peers_are_rows_not_crashes(inline_run):
    models, rows, _ = inline_run
    for peer, title in runner.PEER_TITLES.items():
        mine = [r for r in rows if r.tool.startswith(title)]
        assert mine, f"no rows for {title}"
        if runner.peer_available(peer) is not None:
            assert all("not installed" in r.error for r in mine)
            continue
        for r in mine:
            assert r.error is not None or r.seconds is not None
            if r.error is None and r.task_kind == "trace":
                assert r.hvps == (4 if "1 batch" in r.task else 3), (r.tool, r.hvps)
                assert r.extra["ratios"], "peer rows carry peer time ÷ flatcheck time"
    if runner.peer_available("pyhessian") is None:  # its density calls torch.eig, removed in torch 2
        slq = [r for r in rows if r.tool == "PyHessian" and r.task_kind == "slq"]
        assert slq and (slq[0].error is None or "eig" in slq[0].error)


def test_tables_and_atomic_save(inline_run, tmp_path):
    models, rows, machine = inline_run
    text = report.markdown(models, rows, machine, "bench_peers.py --inline")
    assert "## demo DigitsCNN" in text and "| flatcheck[autograd] |" in text
    assert "bench_peers.py --inline" in text and machine["versions"]["torch"] in text
    report.print_tables(models, rows, machine)
    path = report.save(text, tmp_path, rows)
    assert path.read_text() == text and (tmp_path / "latest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "latest.md"]  # no temp files left


def test_subprocess_row_and_cli(tmp_path, capsys):
    """One row through the forked-process path (memory isolation), via main() and --save."""
    args = ["--models", "demo", "--tasks", "trace", "--peers", "none", "--backends", "autograd",
            "--save", "--results-dir", str(tmp_path)]
    toy = toy_plan("trace1")
    orig = runner.plan
    runner.plan = lambda models, full: toy
    try:
        assert runner.main(args) == 0
    finally:
        runner.plan = orig
    text = (tmp_path / "latest.md").read_text()
    assert "flatcheck[autograd]" in text and "FAILED" not in text
    assert "--peers none" in text


def _row(seconds, peak=None, error=None, notes="n"):
    return Row("demo", "t", "trace", "flatcheck[autograd]", seconds=seconds, peak_mib=peak, error=error, notes=notes)


def test_median_row_picks_the_median_run_and_the_largest_peak():
    runs = [_row(3.0, 10), _row(1.0, 30), _row(2.0, 20), _row(None, error="boom"), _row(9.0, 5)]
    row = median_row(runs)
    # four that ran: 1, 2, 3, 9 → the lower middle one, 2
    assert row.seconds == 2.0 and row.peak_mib == 30
    assert row.extra["repeats"] == [1.0, 2.0, 3.0, 9.0]
    assert "median time of 4 runs (1–9 s)" in row.notes and "1 of 5 runs FAILED: boom" in row.notes
    assert median_row([_row(5.0)]).notes == "n"  # one run: the row as it was
    failed = median_row([_row(None, error="a"), _row(None, error="b")])
    assert failed.error == "a"
    # a row read for its HVP ÷ gradient takes the run of median ratio, not of median time
    runs = [Row("demo", "t", "hvpgrad", "flatcheck[func]", seconds=s, extra={"ratio": q})
            for s, q in ((1.0, 3.0), (2.0, 1.0), (3.0, 2.0))]
    row = median_row(runs)
    assert row.seconds == 3.0 and row.extra["ratio"] == 2.0 and "median HVP ÷ gradient of 3 runs (1–3)" in row.notes


def test_repeat_runs_each_tool_n_times_and_reports_medians():
    args = runner.parse_args(["--inline", "--models", "demo", "--peers", "none", "--backends", "autograd",
                          "--repeat", "3"])
    log = []
    models, rows, machine = runner.run_all(args, log=log.append, models=toy_plan("trace1"))
    assert [r.tool for r in rows] == ["flatcheck[autograd]", "flatcheck[autograd+parts]"]
    for r in rows:
        times = r.extra["repeats"]
        assert len(times) == 3 and r.seconds == times[1] and "median time of 3 runs" in r.notes
    # the tools take turns: autograd, parts, autograd, parts, …
    assert ["+parts" in line for line in log] == [False, True] * 3
    assert "3 repetitions per row" in report.markdown(models, rows, machine, "x", repeat=3)
    with pytest.raises(SystemExit):
        runner.parse_args(["--repeat", "0"])
