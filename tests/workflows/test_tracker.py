"""flatcheck.Tracker: records as training runs, warm λmax equal to the dense
truth (no stale graph after the optimiser moves the weights), a valid and resumable JSONL,
failed steps recorded without stopping training, nothing imported or traced after the first
tracked step."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
import torch
from torch import nn

import flatcheck
from flatcheck.errors import ModelError
from flatcheck.workflows.results_io import load_results

from tests.support.dense import dense, make_case
from tests.support.proc import HANG_GUARD

ROUNDOFF = 1e-10  # float64 summation order (see test_measure)
OPTIONS = {"lmax": {"tol": 1e-8}, "trace": {"estimator": "exact", "matrix": "ggn"}}
TRACE = {"trace": OPTIONS["trace"]}


def train(case, tracker, steps, lr=0.5, on_step=None):
    opt = torch.optim.SGD(case.model.parameters(), lr=lr)
    out = []
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(case.model(case.X), case.Y)
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(step)
        values = tracker.step(step, lr=lr, loss=loss.detach())
        if values is not None:
            out.append((step, values, dense(case) if values.get("lmax") is not None else None))
    return out


def test_tracked_values_follow_the_weights_and_warm_starts_agree(tmp_path):
    case = make_case("mlp", n=23, batch_size=23)
    out = tmp_path / "track.jsonl"
    with flatcheck.Tracker(case.model, (case.X, case.Y), probes=["lmax", "trace"], every=4, out=out,
                           options=OPTIONS, batch_size=23) as tracker:
        seen = train(case, tracker, 17)
    assert [s for s, _, _ in seen] == [0, 4, 8, 12, 16]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 4, 8, 12, 16]
    lmaxes = []
    for (step, values, (H, G)), record in zip(seen, records):
        assert record["kind"] == "flatcheck.track" and record["status"] == "ok"
        assert record["extra"]["lr"] == 0.5 and isinstance(record["extra"]["loss"], float)
        lm = record["results"]["lmax"]
        # the products use this step's weights (a graph of older ones would give another H)
        top = torch.linalg.eigvalsh(H)[-1].item()
        assert abs(values["lmax"] - top) <= lm["details"]["residuals"][0] + ROUNDOFF * top, step
        assert values["trace"] == pytest.approx(G.trace().item(), rel=ROUNDOFF)
        assert lm["details"]["warm_start"] is (step > 0)
        assert record["tracker"]["products"] == lm["matvecs"] + record["results"]["trace"]["matvecs"]
        lmaxes.append(values["lmax"])
    assert len(set(lmaxes)) == len(lmaxes)  # the weights moved: every λmax differs
    # one key per record, all in one comparison: report reads the file as one trajectory
    assert len({(r["model"], r["fingerprint"]) for r in records}) == 1
    assert len(load_results([out]).records) == 5


def test_restart_drops_records_past_the_restart_step_and_reads_a_cut_file(tmp_path):
    case = make_case("mlp", n=23, batch_size=23)
    out = tmp_path / "track.jsonl"
    with flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=2, out=out,
                           options=TRACE) as tracker:
        for step in range(9):
            tracker.step(step)
    with open(out, "ab") as fh:  # a run killed mid-write
        fh.write(b'{"schema_version": "2.1", "step": 9')
    assert len(load_results([out]).records) == 5
    with flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=2, out=out,
                           options=TRACE) as tracker:
        for step in range(4, 7):  # restarted from the step-4 checkpoint
            tracker.step(step, resumed=True)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2, 4, 6]
    assert [r["extra"].get("resumed") for r in records] == [None, None, True, True]


def test_a_diverged_step_is_an_error_record_and_training_goes_on(tmp_path):
    case = make_case("mlp", n=23, batch_size=23)
    out = tmp_path / "track.jsonl"

    def blow_up(step):
        if step == 4:
            with torch.no_grad():
                case.model[1].weight.fill_(float("inf"))

    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes=["lmax", "trace"], every=2, out=out,
                                options=OPTIONS)
    seen = train(case, tracker, 7, on_step=blow_up)
    tracker.close()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["status"] for r in records] == ["ok", "ok", "error", "error"]
    assert "not finite" in records[2]["error"] and records[2]["extra"]["loss"] is not None
    assert records[3]["extra"]["loss"] is None  # a NaN loss is written as null, not as invalid JSON
    assert seen[2][1] == {"lmax": None, "trace": None}
    fresh = make_case("mlp", n=23, batch_size=23)
    strict = flatcheck.Tracker(fresh.model, (fresh.X, fresh.Y), probes="trace", every=1, out=None, strict=True,
                               options=TRACE)
    with torch.no_grad():
        fresh.model[1].weight.fill_(float("nan"))
    with pytest.raises(ModelError, match="not finite"):
        strict.step(0)


def test_tracked_steps_import_and_trace_nothing_after_the_first(tmp_path, monkeypatch):
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    traced = []
    real = proxy_tensor.make_fx
    monkeypatch.setattr(proxy_tensor, "make_fx", lambda *a, **k: traced.append(1) or real(*a, **k))
    case = make_case("cnn", n=12, batch_size=12)
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), every=1, out=tmp_path / "t.jsonl",
                                options={"trace": {"probes_max": 10}})
    opt = torch.optim.SGD(case.model.parameters(), lr=0.1)
    modules = None
    for step in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(case.model(case.X), case.Y).backward()
        opt.step()
        assert all(v is not None for v in tracker.step(step).values()), tracker.last_record["error"]
        if step == 0:
            modules, traces = set(sys.modules), len(traced)
    assert set(sys.modules) - modules == set()
    assert len(traced) == traces
    tracker.close()


def test_warm_lmax_equals_a_cold_one_and_costs_fewer_products():
    case = make_case("cnn", n=23, batch_size=23)
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax", every=1, out=None,
                                options={"lmax": {"tol": 1e-6}})
    opt = torch.optim.SGD(case.model.parameters(), lr=0.05)
    for step in range(4):
        opt.zero_grad()
        nn.functional.cross_entropy(case.model(case.X), case.Y).backward()
        opt.step()
        tracker.step(step)
        warm = tracker.last_record["results"]["lmax"]
        cold = flatcheck.measure(case.model, (case.X, case.Y), probes="lmax",
                                 options={"lmax": {"k": 1, "tol": 1e-6}}).results["lmax"]
        tolerance = warm["details"]["residuals"][0] + cold.details["residuals"][0]
        assert abs(warm["value"] - cold.value) <= tolerance, step
        if step > 0:
            assert warm["details"]["warm_start"] and warm["matvecs"] < cold.matvecs


def test_float64_tracking_of_a_float32_model_follows_its_weights():
    case = make_case("mlp", n=23, batch_size=23)
    model = case.model.float()
    tracker = flatcheck.Tracker(model, (case.X.float(), case.Y), probes="trace", every=1, out=None,
                                options=TRACE, dtype="float64")
    assert tracker.session.model is not model
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(2):
        opt.zero_grad()
        nn.functional.cross_entropy(model(case.X.float()), case.Y).backward()
        opt.step()
        got = tracker.step(step)["trace"]
        want = flatcheck.measure(model, (case.X.float(), case.Y), probes="trace", options=TRACE,
                                 dtype="float64").results["trace"].value
        assert got == want
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.workflow
def test_the_training_example_runs_small(tmp_path):
    """examples/track_training.py at toy size: both learning rates tracked, every record ok,
    the PNG written, the JSONL files readable by report."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import track_training

    runs = track_training.main(["--steps", "4", "--every", "2", "--lrs", "0.5,1", "--samples", "48",
                                "--out", str(tmp_path / "plot.png"), "--jsonl", str(tmp_path)])
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for run in runs:
        assert [r["step"] for r in run["records"]] == [0, 2, 4]
        assert all(r["status"] == "ok" for r in run["records"]), [r["error"] for r in run["records"]]
        assert set(run["records"][0]["results"]) == {"lmax", "trace", "jacobian"}
        s = track_training.summary(run)
        assert s["two_over_lr"] == 2 / run["lr"] and s["errors"] == 0
    records = load_results(sorted(tmp_path.glob("*.jsonl"))).records
    assert len(records) == 12  # 2 runs × 3 steps × (curvature file + Jacobian file)


def _rescale_relu(model: nn.Module, c: float) -> None:
    """Scale the ReLU's input layer by c and the layer after it by 1/c: the same function (ReLU
    is positively homogeneous), but the Hessian's block of the last layer scales by c² and the
    middle layer's by 1/c², so the top eigenvector moves from one block to the other."""
    with torch.no_grad():
        model[3].weight.mul_(c)
        model[3].bias.mul_(c)
        model[5].weight.div_(c)


def test_a_top_eigenvector_that_changed_between_tracked_steps_is_found_warm():
    """A crossing: the weights are edited between two tracked steps so that the top eigenvector
    moves to another block; the warm λmax (random part of the start alone, no periodic cold
    step) still equals the dense top eigenvalue within its residual."""
    case = make_case("mlp", n=23, batch_size=23)
    _rescale_relu(case.model, 5.0)
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax", every=1, out=None,
                                options={"lmax": {"tol": 1e-8}}, cold_every=None)
    tracker.step(0)
    old = tracker.session.warm[("lmax", "hessian", 1)][0].clone()
    _rescale_relu(case.model, 1 / 25)
    tracker.step(1)
    lm = tracker.last_record["results"]["lmax"]
    H, _ = dense(case)
    eigs = torch.linalg.eigh(H)
    top = eigs.eigenvalues[-1].item()
    # it is a crossing: the old top vector is nearly orthogonal to the new one and its Rayleigh
    # quotient is far below the new top (a warm start that stayed with it would be caught here)
    assert abs(old @ eigs.eigenvectors[:, -1]).item() < 0.1
    assert (old @ H @ old).item() < 0.5 * top
    assert lm["details"]["warm_start"] and lm["details"]["converged"] == [True]
    assert abs(lm["value"] - top) <= lm["details"]["residuals"][0] + ROUNDOFF * top


def test_every_cold_every_th_tracked_step_starts_cold():
    case = make_case("mlp", n=23, batch_size=23)
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax", every=2, out=None,
                                options={"lmax": {"tol": 1e-6}}, cold_every=2)
    warm = []
    for step in range(9):
        if tracker.step(step) is not None:
            warm.append(tracker.last_record["results"]["lmax"]["details"]["warm_start"])
    assert warm == [False, True, False, True, False]
    with pytest.raises(flatcheck.errors.ConfigError, match="cold_every"):
        flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax", out=None, cold_every=0)


def test_the_warm_start_is_the_last_two_eigenvectors_extrapolated(monkeypatch):
    """λmax starts warm from a block: the top eigenvector carried one step on, v_t + (v_t − v_{t−1})
    (signs aligned) once two converged, v_t when they differ (overlap below EXTRAPOLATE_OVERLAP),
    and beside it the next eigenvector (the gap's), carried on the same way; cold after the guard."""
    from flatcheck.probes import lmax
    from flatcheck.workflows import track

    a = torch.tensor([[1.0, 0.0, 0.0]])
    b = torch.tensor([[0.96, 0.28, 0.0]])  # unit, overlap 0.96
    want = 2 * b - a
    assert torch.equal(track.extrapolated_start(a, b), want)
    assert torch.equal(track.extrapolated_start(-a, b), want)  # an eigenvector's sign is arbitrary
    c = torch.tensor([[0.0, 0.0, 1.0]])
    assert track.extrapolated_start(a, c) is c
    starts, blocks = [], []

    def spy(real):
        def call(op, k, *args, **kwargs):
            start = args[0] if args else kwargs.get("start")
            starts.append(None if start is None else start.clone())
            res = real(op, k, *args, **kwargs)
            blocks.append(torch.cat([res.vectors, res.next_vector[None]]))
            return res
        return call

    monkeypatch.setattr(lmax, "block_lanczos_top", spy(lmax.block_lanczos_top))
    monkeypatch.setattr(lmax, "block_top", spy(lmax.block_top))
    case = make_case("mlp", n=23, batch_size=23)
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax", every=1, out=None,
                                options={"lmax": {"tol": 1e-8}}, cold_every=4)
    train(case, tracker, 6, lr=0.05)
    assert starts[0] is None and torch.equal(starts[1], blocks[0])
    for i in (2, 3):
        assert starts[i].shape == (2, blocks[i - 1].shape[1])
        for row in (0, 1):  # the top eigenvector's row, then the gap's
            last, before = blocks[i - 1][row:row + 1], blocks[i - 2][row:row + 1]
            assert torch.equal(starts[i][row:row + 1], track.extrapolated_start(before, last))
            assert not torch.equal(starts[i][row:row + 1], last)  # the weights moved: an extrapolation
    assert starts[4] is None and torch.equal(starts[5], blocks[4])  # the guard's cold step: history gone


def test_probes_as_a_mapping_carry_their_options_over_the_defaults():
    case = make_case("mlp", n=23, batch_size=23)
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes={"lmax": {"tol": 1e-6}, "trace": TRACE["trace"]},
                                every=1, out=None)
    options = {r.name: r.options for r in tracker.session.config.probes}
    assert options["lmax"].k == 1 and options["lmax"].tol == 1e-6  # DEFAULT_OPTIONS under the caller's
    assert options["trace"].estimator == "exact"
    comma = flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax,trace", every=1, out=None)
    assert {r.name: r.options for r in comma.session.config.probes}["lmax"].k == 1


def test_the_file_is_let_go_when_the_tracker_is_closed_left_or_dropped(tmp_path):
    """A notebook cell run again makes a new tracker on the same file: the old one's lock goes
    with close(), the end of a `with` block, or the tracker itself (del, even in a cycle)."""
    import gc

    case = make_case("mlp", n=23, batch_size=23)
    out = tmp_path / "track2.jsonl"

    def tracker(**kwargs):
        return flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=2, out=out, options=TRACE,
                                 **kwargs)

    first = tracker()
    first.step(0)
    del first
    second = tracker()
    second.step(0)  # was: ConfigError "another scan holds this file"
    second.close()
    with tracker() as third:
        third.step(0)
    cyclic = tracker()
    cyclic.step(0)
    cyclic.me = cyclic  # only the collector frees it
    gc.disable()  # the tracker that finds the file held collects it; not the next automatic pass
    try:
        del cyclic
        tracker().step(0)
    finally:
        gc.enable()
    assert [json.loads(line)["step"] for line in out.read_text().splitlines()] == [0]


def test_a_held_file_names_its_holder(tmp_path):
    import os
    import subprocess
    import textwrap

    from flatcheck.errors import ConfigError

    case = make_case("mlp", n=23, batch_size=23)
    out = tmp_path / "track.jsonl"

    def tracker(name):
        return flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=1, out=out, options=TRACE,
                                 name=name)

    holding = tracker("first")
    holding.step(0)
    with pytest.raises(ConfigError, match=r"^out .*track.jsonl: tracker 'first' of this process holds this file; "
                                          r"close\(\) it \(or make it with `with flatcheck.Tracker"):
        tracker("second").step(1)
    holding.close()
    other = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys
        fd = os.open({str(out)!r}, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=rf"^out .*: process {other.pid} \(.*python.*\) holds this file: a "
                                              r"flatcheck scan or tracker still writing it"):
            tracker("third").step(2)
    finally:
        other.stdin.close()
        other.wait(timeout=HANG_GUARD)
    assert os.path.getsize(out) > 0


def test_a_restart_drops_only_its_own_runs_records(tmp_path):
    """Another run in the same file (another name, data or settings) kept its records: a
    tracker named "b" starting at step 0 wiped run "a"'s steps 0–4."""
    case = make_case("mlp", n=23, batch_size=23)
    out = tmp_path / "run.jsonl"

    def tracker(name, X=case.X):
        return flatcheck.Tracker(case.model, (X, case.Y), probes="trace", every=2, out=out, options=TRACE, name=name)

    with tracker("a") as t:
        for step in range(5):
            t.step(step)
    with tracker("b") as t:
        t.step(0)
    assert [(r["model"], r["step"]) for r in map(json.loads, out.read_text().splitlines())] == \
        [("a", 0), ("a", 2), ("a", 4), ("b", 0)]
    # the same name on other data is another run too, and said so
    with pytest.warns(UserWarning, match=r"another run also named 'a' \(other data or settings\) at steps 2–4; "
                                         r"they are kept"):
        with tracker("a", X=case.X * 2) as t:
            t.step(2)
    assert [(r["model"], r["step"]) for r in map(json.loads, out.read_text().splitlines())] == \
        [("a", 0), ("a", 2), ("a", 4), ("b", 0), ("a", 2)]
    # the same run restarted drops its own from the restart step on
    with tracker("b") as t:
        t.step(0)
    assert [(r["model"], r["step"]) for r in map(json.loads, out.read_text().splitlines())] == \
        [("a", 0), ("a", 2), ("a", 4), ("a", 2), ("b", 0)]


def test_a_second_tracker_is_refused_where_it_is_made_and_a_file_of_other_content_is_left_whole(tmp_path):
    from flatcheck.errors import ConfigError

    case = make_case("mlp", n=23, batch_size=23)
    out = tmp_path / "track.jsonl"

    def tracker(path=out):
        return flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=2, out=path, options=TRACE,
                                 name="first")

    first = tracker()
    with pytest.raises(ConfigError, match="tracker 'first' of this process holds this file"):
        tracker()  # was accepted, and the first tracker was refused at its next step instead
    first.step(0)
    first.close()
    source = tmp_path / "model.py"
    source.write_text("import torch\n")
    with pytest.raises(ConfigError, match=r"model.py: exists and is not a flatcheck scan or tracker file"):
        tracker(source)
    assert source.read_text() == "import torch\n"


@pytest.mark.parametrize("with_out", [True, False])
def test_a_step_after_close_is_refused(tmp_path, with_out):
    """It measured and wrote nothing, silently: a training loop that outlived its tracker."""
    from flatcheck.errors import ConfigError

    case = make_case("mlp", n=23, batch_size=23)
    out = tmp_path / "track.jsonl" if with_out else None
    with flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=2, out=out,
                           options=TRACE) as tracker:
        tracker.step(0)
    with pytest.raises(ConfigError, match=r"Tracker.step\(2\) after close\(\)"):
        tracker.step(2)
    if with_out:
        assert [json.loads(line)["step"] for line in out.read_text().splitlines()] == [0]


def test_the_training_example_says_what_its_guide_says_and_keeps_the_committed_figure(tmp_path, monkeypatch):
    """Its defaults were 300 steps, η = 0.05 and 0.2, all digits, written over the committed
    docs/track_training.png; its guide describes 500 digits, 200 steps, η = 0.5 and 1."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import track_training

    seen = {}
    monkeypatch.setattr(track_training, "train", lambda lr, steps, every, out, **kw: seen.setdefault(
        lr, dict(steps=steps, every=every, **kw)) and {"lr": lr, "records": []})
    monkeypatch.setattr(track_training, "plot", lambda runs, path, probes: seen.setdefault("plot", (path, probes)))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "track_training.png").write_bytes(b"earlier")
    track_training.main([])
    assert sorted(k for k in seen if k != "plot") == [0.5, 1.0]
    assert seen[0.5]["steps"] == 200 and seen[0.5]["every"] == 10 and seen[0.5]["samples"] == 500
    assert seen["plot"] == (Path("track_training.1.png"), ("lmax", "trace", "jacobian"))
    seen.clear()
    track_training.main(["--probes", "lmax"])
    assert seen[1.0]["probes"] == ("lmax",) and seen["plot"][1] == ("lmax",)


def test_the_training_example_draws_lmax_alone(tmp_path):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import track_training

    runs = track_training.main(["--steps", "2", "--every", "2", "--lrs", "1", "--samples", "32", "--probes", "lmax",
                                "--out", str(tmp_path / "eos.png")])
    assert (tmp_path / "eos.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(set(r["results"]) == {"lmax"} for r in runs[0]["records"])
    assert track_training.summary(runs[0])["lmax_first"] is not None


def test_each_tracked_step_says_what_it_measured_on_stderr_unless_quiet(capsys):
    case = make_case("mlp", n=23, batch_size=23)
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax", every=2, out=None)
    values = [tracker.step(step) for step in range(3)]
    err = capsys.readouterr().err.splitlines()
    assert values[1] is None and set(values[0]) == {"lmax"} and isinstance(values[2]["lmax"], float)
    assert len(err) == 2 and err[0].startswith("flatcheck track step 0: lmax ") and "(cold start)" in err[0]
    assert err[1].startswith(f"flatcheck track step 2: lmax {values[2]['lmax']:.5g} · ")
    assert re.search(r" · \d+\.\d s, \d+ products$", err[1])
    quiet = flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax", every=1, out=None, quiet=True)
    quiet.step(0)
    assert capsys.readouterr().err == ""


def _steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def _tracked(out, steps=range(3), **kwargs):
    """A quiet tracker on `out` through `steps` (every one tracked), closed; it and its stderr."""
    case = make_case("mlp", n=23, batch_size=23)
    with flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=1, out=out, options=TRACE,
                           quiet=True, **kwargs) as tracker:
        for step in steps:
            tracker.step(step, lr=0.1)
    return tracker


def test_records_whose_file_is_removed_while_tracking_go_to_a_spare_beside_it(tmp_path, monkeypatch, capsys):
    """The records went through the held descriptor into a file no path named, and with it when
    the tracker closed: all lost, silently. Now the file's records and the next ones go to a
    spare beside it, one stderr line names it (quiet or not), and memory keeps them too."""
    from flatcheck.workflows import results_io

    out = tmp_path / "track.jsonl"
    real = results_io.HeldOutput.append

    def append_then_remove_once(self, record):
        real(self, record)
        if record["step"] == 0:
            out.unlink()

    monkeypatch.setattr(results_io.HeldOutput, "append", append_then_remove_once)
    tracker = _tracked(out)
    [spare] = [p for p in tmp_path.iterdir() if p != out]
    assert spare.name.startswith("flatcheck-track-") and spare.suffix == ".jsonl"
    assert _steps(spare) == [0, 1, 2] and not out.exists()
    assert [r["step"] for r in tracker.records] == [0, 1, 2]
    assert capsys.readouterr().err == (f"flatcheck track: out {out}: removed while the tracker ran; its records so far "
                                       f"(1) are in {spare} instead, and the next ones go there\n")


def test_records_whose_folder_goes_after_the_last_step_are_rescued_on_close(tmp_path, monkeypatch, capsys):
    """The folder removed after the last step: close() finds the file without a path, and the
    records go to the temporary folder, named after out."""
    import shutil
    import tempfile

    folder, spare_dir = tmp_path / "out", tmp_path / "spare"
    folder.mkdir()
    spare_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spare_dir))
    case = make_case("mlp", n=23, batch_size=23)
    out = folder / "track.jsonl"
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes="trace", every=1, out=out, options=TRACE,
                                quiet=True)
    for step in range(2):
        tracker.step(step)
    shutil.rmtree(folder)
    tracker.close()
    [spare] = spare_dir.iterdir()
    assert spare.name.startswith("flatcheck-track-") and _steps(spare) == [0, 1]
    [line] = capsys.readouterr().err.splitlines()
    assert line == (f"flatcheck track: out {out}: its folder {folder} was removed while the tracker ran; its records "
                    f"so far (2) are in {spare} instead, and the next ones go there")


def test_a_write_that_fails_keeps_the_record_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    """A full disk raised out of tracker.step into the training loop. Now the records written
    before it and the one that failed are in a spare, and tracking goes on there."""
    import errno

    from flatcheck.workflows import results_io

    out = tmp_path / "track.jsonl"
    real = results_io.HeldOutput.append

    def full_at_step_1(self, record):
        if self.path == out and record["step"] == 1:
            os.write(self.fd, b'{"schema_version": 1, "cut')  # a short write's fragment
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, record)

    monkeypatch.setattr(results_io.HeldOutput, "append", full_at_step_1)
    tracker = _tracked(out)
    [spare] = [p for p in tmp_path.iterdir() if p != out]
    assert _steps(spare) == [0, 1, 2] and [r["step"] for r in tracker.records] == [0, 1, 2]
    assert capsys.readouterr().err == (f"flatcheck track: out {out}: cannot write (No space left on device); its "
                                       f"records so far (2) are in {spare} instead, and the next ones go there\n")


def test_records_no_file_takes_stay_in_memory_and_it_is_said(tmp_path, monkeypatch, capsys):
    from flatcheck.report import io
    from flatcheck.workflows import results_io

    out = tmp_path / "track.jsonl"
    real = results_io.HeldOutput.append

    def append_then_remove(self, record):
        real(self, record)
        out.unlink()

    monkeypatch.setattr(results_io.HeldOutput, "append", append_then_remove)
    monkeypatch.setattr(io, "write_spare", lambda target, blob: None)
    tracker = _tracked(out)
    assert [r["step"] for r in tracker.records] == [0, 1, 2] and list(tmp_path.iterdir()) == []
    [line] = capsys.readouterr().err.splitlines()
    assert line == (f"flatcheck track: out {out}: removed while the tracker ran; no file takes its records (beside "
                    "it, the temporary folder, the working directory); this run's records (1) are kept in memory "
                    "alone, as tracker.records")


def test_a_warm_start_without_the_vector_below_goes_on_from_the_top_ones():
    """A call that carried only the top k vectors (--max-iter k leaves no vector below) starts
    the next from them by one-vector Lanczos, not the block (which takes no start)."""
    case = make_case("mlp", n=23, batch_size=23)
    tracker = flatcheck.Tracker(case.model, (case.X, case.Y), probes="lmax", every=1, out=None, strict=True,
                                options={"lmax": {"max_iter": 1}}, quiet=True)
    train(case, tracker, 3, lr=0.05)
    assert [r["status"] for r in tracker.records] == ["ok"] * 3


def test_a_records_file_whose_folder_became_a_file_is_no_longer_named(tmp_path):
    from flatcheck.workflows.results_io import HeldOutput

    folder = tmp_path / "runs"
    folder.mkdir()
    held = HeldOutput(folder / "track.jsonl", "out")
    assert held.still_named()
    (folder / "track.jsonl").unlink()
    folder.rmdir()
    folder.write_text("not a folder")  # stat of runs/track.jsonl now raises NotADirectoryError
    assert not held.still_named()


def test_an_unknown_keyword_is_refused_in_the_tracker_s_name():
    """Tracker(..., samplez=3) was refused as open_live_session()'s (stranger18)."""
    case = make_case("mlp")
    model, data = case.model, (case.X, case.Y)
    with pytest.raises(TypeError, match=r"^Tracker\(\) got an unexpected keyword argument 'samplez'; "
                                        r"did you mean 'samples'\?$"):
        flatcheck.Tracker(model, data, out=None, samplez=3)
    with pytest.raises(TypeError) as caught:
        flatcheck.Tracker(model, data, out=None, progress=print)
    said = str(caught.value)
    assert said.startswith("Tracker() got an unexpected keyword argument 'progress'; it takes ")
    for name in ("every", "out", "quiet", "samples", "seed", "loss", "test_data"):
        assert name in said.split("it takes ")[1].split(", ")
