"""Trace estimators and the trace probe against dense float64 ground truth.

Tolerances come from the estimators' own standard errors (a z-bound of 4, i.e. a
false-alarm rate below 1e-4 for a normal estimate) and from binomial / chi-square
reasoning for the calibration checks, never from a loose constant.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from scipy import stats

from tests.support.dense import DenseOperator, block_traces, dense, make_case, mixer_case
from flatcheck.config import probe_requests
from flatcheck.linalg import hutchinson, hutchpp
from flatcheck.linalg.trace import INTERVAL_FLOOR, INTERVAL_SKEW, skew_widening
from flatcheck.probes.registry import ProbeContext, create_probe

Z = 4.0


def _sym(n: int, seed: int, rank: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    B = torch.randn(n, rank or n, generator=g, dtype=torch.float64)
    return B @ B.T / n if rank else (B + B.T) / 2


# -- estimators on dense matrices -----------------------------------------------------------

@pytest.mark.statistical
def test_hutchinson_standard_error_is_calibrated():
    """Over many seeds, |error|/stderr exceeds the interval's quantile as often as it should,
    and the variance estimated from the products is unbiased for Rademacher theory
    2(‖A‖²_F − Σ A_ii²)."""
    from flatcheck.workflows.gate import quantile

    A = _sym(40, 0)
    true = A.trace().item()
    m, seeds = 30, 400
    z, var = [], []
    for seed in range(seeds):
        est = hutchinson(DenseOperator(A), generator=torch.Generator().manual_seed(seed), max_probes=m)
        assert est.dof is None and est.stderr >= est.known_stderr  # a floor under the spread
        z.append((est.value - true) / est.stderr)
        var.append(est.known_stderr ** 2 * m)
    exceed = sum(abs(x) > quantile(0.95, None) for x in z)
    # allow the binomial 1e-4 band around 5 %
    lo, hi = stats.binom.ppf(1e-4, seeds, 0.05), stats.binom.isf(1e-4, seeds, 0.05)
    assert lo <= exceed <= hi, exceed
    theory = 2 * (A.pow(2).sum() - A.diagonal().pow(2).sum()).item()
    var_t = torch.tensor(var)
    assert abs(var_t.mean().item() - theory) <= Z * var_t.std().item() / math.sqrt(seeds)


@functools.lru_cache(maxsize=None)
def _dense_matrices(kind: str) -> dict[str, torch.Tensor]:
    H, G = dense(mixer_case() if kind == "mixer" else make_case(kind))
    return {"hessian": (H + H.T) / 2, "ggn": (G + G.T) / 2}


def _coverage(A: torch.Tensor, m: int, seeds: int, **kw) -> int:
    """How many of `seeds` 95 % intervals (value ± q·stderr as a gate draws them,
    flatcheck.workflows.gate.quantile) cover Tr(A)."""
    from flatcheck.workflows.gate import quantile

    true, covered = A.trace().item(), 0
    for seed in range(seeds):
        est = hutchinson(DenseOperator(A), generator=torch.Generator().manual_seed(seed), max_probes=m, **kw)
        covered += abs(est.value - true) <= quantile(0.95, est.dof) * est.stderr
    return covered


@pytest.mark.statistical
@pytest.mark.parametrize("m", [10, 20])
@pytest.mark.parametrize("matrix", ["hessian", "ggn"])
@pytest.mark.parametrize("kind", ["mlp", "cnn", "mixer"])
def test_hutchinson_interval_covers_the_dense_trace_at_few_probes(kind, matrix, m):
    """The 95 % interval covers the dense float64 trace of three small networks' H and G within
    the binomial band over 1,000 seeds at m = 10 and 20. Their curvature has a few outlying
    eigenvalues (the CNN's GGN: 0.77 of ‖G‖_F² in one), so the probe values are right-skewed and
    their spread is small when their mean is low: a t interval from the spread alone covered
    897–914 of 1,000 on the CNN's GGN (and 926–936 on the Hessians), below the band. The
    products' own variance, a floor under the spread, brings every case inside it."""
    A, seeds = _dense_matrices(kind)[matrix], 1000
    covered = _coverage(A, m, seeds, rtol=None)
    # fixed seeds, so the band is a fixed bar: 3 binomial standard deviations around 95 %
    sd = math.sqrt(seeds * 0.95 * 0.05)
    assert 0.95 * seeds - 3 * sd <= covered <= 0.95 * seeds + 3 * sd, covered


def test_hutchinson_rtol_stops_on_standard_error():
    A = _sym(60, 1, rank=60) + 5 * torch.eye(60, dtype=torch.float64)
    op = DenseOperator(A)
    est = hutchinson(op, generator=torch.Generator().manual_seed(0), max_probes=10_000, rtol=0.01, block_size=4)
    assert est.stop_reason == "rtol"
    assert est.stderr / abs(est.value) < 0.01
    assert est.probes < 10_000 and est.matvecs == est.probes == op.matvecs
    assert abs(est.value - A.trace().item()) <= Z * est.stderr


def test_hutchinson_stops_at_max_probes_without_rtol():
    op = DenseOperator(_sym(20, 2))
    est = hutchinson(op, generator=torch.Generator().manual_seed(0), max_probes=13, block_size=5)
    assert (est.probes, est.matvecs, op.matvecs, est.stop_reason) == (13, 13, 13, "max_probes")


def test_hutchpp_is_exact_for_low_rank():
    """With more sketch vectors than the rank, Q spans the range and the estimate is exact."""
    A = _sym(80, 3, rank=5)
    est = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=30)
    assert est.matvecs == 30
    assert abs(est.value - A.trace().item()) <= 1e-10 * A.trace().item()
    assert est.stderr <= 1e-10 * A.trace().item()


def test_hutchpps_last_progress_report_carries_its_estimate():
    # the progress line at the end said only 30/30, where Hutchinson's says value ± stderr
    A = _sym(80, 3, rank=40)
    reports = []
    est = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=30,
                  progress=lambda done, total, **kw: reports.append((done, total, kw)))
    assert reports[-1] == (30, 30, {"value": est.value, "stderr": est.stderr})


def test_hutchpp_beats_hutchinson_on_decaying_spectrum():
    """Same matvec budget, spectrum decaying like 1/i²: Hutch++'s reported error is smaller."""
    n = 200
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    A = Q @ torch.diag(1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** 2) @ Q.T
    hp = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=60)
    hu = hutchinson(DenseOperator(A), generator=torch.Generator().manual_seed(0), max_probes=60)
    true = A.trace().item()
    assert abs(hp.value - true) <= Z * hp.stderr
    assert hp.stderr < hu.stderr / 3


# -- the trace probe on tiny networks ---------------------------------------------------------

def _run(case, seed=0, **opts):
    (req,) = probe_requests(["trace"], {"trace": opts})
    return create_probe("trace").run(ProbeContext(case.backend(), seed=seed), req.options)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("estimator,matrix", [("hutchinson", "hessian"), ("hutchinson", "ggn"),
                                              ("hutchpp", "hessian"), ("hutchpp", "ggn")])
def test_stochastic_trace_within_reported_error(kind, estimator, matrix):
    case = make_case(kind)
    H, G = dense(case)
    M = H if matrix == "hessian" else G
    r = _run(case, estimator=estimator, matrix=matrix, probes_max=150, rtol=None)  # a fixed count
    assert r.stderr is not None and r.stderr > 0
    assert abs(r.value - M.trace().item()) <= Z * r.stderr
    assert r.matvecs == 150 and r.seed == 0
    layers = r.details["layers"]
    assert math.isclose(sum(p["value"] for p in layers.values()), r.value, rel_tol=1e-12, abs_tol=1e-14)
    truth = block_traces(M, case.problem.layout)
    for name, part in layers.items():
        assert abs(part["value"] - truth[name]) <= Z * part["stderr"] + 1e-12, name
    assert math.isclose(r.details["mean_eigenvalue"], r.value / case.problem.layout.dim)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("loss", ["cross_entropy", "mse", "sigmoid_mse"])
def test_exact_ggn_trace(kind, loss):
    case = make_case(kind, loss=loss)
    _, G = dense(case)
    r = _run(case, estimator="exact")
    assert r.label == "Tr(G)" and r.stderr is None and r.matvecs == 0 and r.seed is None
    assert abs(r.value - G.trace().item()) <= 1e-8 * abs(G.trace().item())
    truth = block_traces(G, case.problem.layout)
    for name, part in r.details["layers"].items():
        assert abs(part["value"] - truth[name]) <= 1e-8 * abs(G.trace().item()), name


def test_hutchinson_budget_stops_after_two_probes_with_an_honest_error():
    """A spent budget ends the run after the block in progress (never before two probes, for
    a standard error); what it reached is an ordinary Hutchinson estimate of fewer probes."""
    A = _sym(60, 1, rank=60) + 5 * torch.eye(60, dtype=torch.float64)
    op = DenseOperator(A)
    calls = []

    def spent() -> bool:
        calls.append(op.matvecs)
        return op.matvecs >= 8

    est = hutchinson(op, generator=torch.Generator().manual_seed(0), max_probes=100, block_size=4,
                     should_stop=spent)
    assert est.stop_reason == "budget" and est.probes == est.matvecs == 8 and len(est.samples) == 8
    assert calls == [4, 8]
    assert abs(est.value - A.trace().item()) <= Z * est.stderr
    same = hutchinson(DenseOperator(A), generator=torch.Generator().manual_seed(0), max_probes=8, block_size=4)
    assert (same.value, same.stderr) == (est.value, est.stderr)  # the same draws, the same estimate
    first = hutchinson(DenseOperator(A), generator=torch.Generator().manual_seed(0), max_probes=100, block_size=1,
                       should_stop=lambda: True)
    assert first.probes == 2 and first.stderr is not None  # at once: still two probes


def test_hutchinson_budget_sizes_its_blocks_from_a_timed_probe(monkeypatch):
    """Under a budget the first block is two probes (a block of 8 or 16 was the overrun: trace
    --budget 1 took 5 s on a small ViT), each later one what the time left takes at the rate
    measured (a stepped clock: 1 s a block), and the values are the unbudgeted run's."""
    import flatcheck.linalg.trace as trace_module

    A = _sym(60, 1, rank=60) + 5 * torch.eye(60, dtype=torch.float64)
    clock = iter(range(1000))
    monkeypatch.setattr(trace_module.time, "monotonic", lambda: float(next(clock)))
    op = DenseOperator(A)
    sizes, left = [], iter([3.0, 1.0])

    def spent() -> bool:
        sizes.append(op.matvecs)
        return len(sizes) == 3

    est = hutchinson(op, generator=torch.Generator().manual_seed(0), max_probes=100, block_size=8,
                     should_stop=spent, time_left=lambda: next(left))
    # 2 probes in 1 s: 0.5 s a probe, 3 s left → 6; 6 in 1 s, 1 s left → 6; then spent
    assert sizes == [2, 8, 14] and est.stop_reason == "budget"
    same = hutchinson(DenseOperator(A), generator=torch.Generator().manual_seed(0), max_probes=14, block_size=8)
    assert (same.value, same.stderr) == (est.value, est.stderr)


def test_hutchpp_budget_sizes_its_thirds_from_a_timed_product(monkeypatch):
    """Hutch++ cannot stop midway (its residual probes are projected off the finished sketch),
    so a budget sizes k up front: the sketch's first product is timed (a stepped clock: 1 s)
    and 3k products fit the time left. It ignored --budget: 11 s under --budget 2."""
    import flatcheck.linalg.trace as trace_module

    A = _sym(60, 1, rank=60) + 5 * torch.eye(60, dtype=torch.float64)
    clock = iter(range(1000))
    monkeypatch.setattr(trace_module.time, "monotonic", lambda: float(next(clock)))
    est = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=30, time_left=lambda: 11.0)
    assert est.stop_reason == "budget" and est.matvecs == 12 and est.probes == 8 and len(est.samples) == 4
    assert abs(est.value - A.trace().item()) <= Z * est.stderr
    least = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=30, time_left=lambda: 0.0)
    assert least.matvecs == 6 and least.stderr is not None  # at least two residual probes
    ample = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=30,
                    time_left=lambda: 1e6)
    free = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=30)
    assert ample.stop_reason == free.stop_reason == "matvecs"
    assert (ample.value, ample.stderr) == (free.value, free.stderr)  # the time only sizes, never draws


def test_trace_probe_default_stops_at_5_percent_and_reports_it():
    case = make_case("mlp")
    _, G = dense(case)
    r = _run(case, matrix="ggn")  # reaches 5 % after 88 probes at seed 0
    assert r.details["rtol"] == 0.05 and r.details["stop_reason"] == "rtol"
    assert r.stderr / abs(r.value) < 0.05 and r.details["probes"] < 100
    assert abs(r.value - G.trace().item()) <= Z * r.stderr


def test_trace_probe_reports_a_spent_budget():
    import time

    case = make_case("mlp")
    H, _ = dense(case)
    (req,) = probe_requests(["trace"], {"trace": {"rtol": None, "probes_max": 500}})
    ctx = ProbeContext(case.backend(), seed=0, deadline=time.monotonic())  # already spent
    r = create_probe("trace").run(ctx, req.options)
    assert r.details["stop_reason"] == "budget" and 2 <= r.details["probes"] < 500
    assert r.matvecs == r.details["probes"] and r.stderr is not None
    # a spent budget stops after the first block, of two probes: a standard error of one
    # degree of freedom, judged by Student's t at the confidence Z gives a normal interval
    from flatcheck.workflows.gate import quantile

    assert r.details["probes"] == 2 and r.dof == 1
    assert abs(r.value - H.trace().item()) <= quantile(math.erf(Z / math.sqrt(2)), r.dof) * r.stderr


def test_progress_reports_the_running_estimate():
    case = make_case("mlp")
    seen = []
    (req,) = probe_requests(["trace"], {"trace": {"rtol": None, "probes_max": 12, "block_size": 4}})
    ctx = ProbeContext(case.backend(), seed=0, progress=lambda *a, **k: seen.append((a, k)))
    r = create_probe("trace").run(ctx, req.options)
    assert [a for a, _ in seen] == [("trace (hutchinson)", 0, 0),  # the start, before the first block
                                    ("trace (hutchinson)", 4, 12), ("trace (hutchinson)", 8, 12),
                                    ("trace (hutchinson)", 12, 12)]
    assert seen[-1][1]["value"] == pytest.approx(r.value, rel=1e-12)
    assert seen[-1][1]["stderr"] == pytest.approx(r.stderr, rel=1e-12)


def test_exact_ggn_trace_in_train_mode():
    case = make_case("cnn", bn_mode="train")
    _, G = dense(case)
    r = _run(case, estimator="exact")
    assert abs(r.value - G.trace().item()) <= 1e-8 * abs(G.trace().item())


def test_same_seed_same_number_other_seed_other_number():
    case = make_case("mlp")
    a, b, c = _run(case, probes_max=20), _run(case, probes_max=20), _run(case, seed=1, probes_max=20)
    assert a.value == b.value and a.stderr == b.stderr
    assert a.value != c.value


def test_exact_on_hessian_is_refused():
    from flatcheck.errors import ConfigError

    with pytest.raises(ConfigError, match="estimator exact needs matrix ggn"):
        probe_requests(["trace"], {"trace": {"estimator": "exact", "matrix": "hessian"}})


@pytest.mark.parametrize("loss", ["cross_entropy", "sigmoid_mse"])
@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_class_sampled_ggn_trace_is_unbiased_within_its_error(loss, bn_mode):
    """Sampling K classes ∝ |λ|·‖u‖² per sample: within Z reported standard errors of the dense Tr(G),
    and the reported error matches the spread over independent seeds."""
    case = make_case("cnn", loss=loss, bn_mode=bn_mode)
    _, G = dense(case)
    true = G.trace().item()
    runs = [_run(case, seed=s, estimator="exact", class_samples=2) for s in range(12)]
    for r in runs:
        assert r.stderr > 0 and r.seed is not None and not r.exact
        assert r.details["stop_reason"] == "class_samples"  # it said "exact" (stranger test)
        assert abs(r.value - true) <= Z * r.stderr
    values = torch.tensor([r.value for r in runs], dtype=torch.float64)
    mean_se = sum(r.stderr for r in runs) / len(runs)
    # the mean of 12 unbiased draws is within Z of its own standard error
    assert abs(values.mean().item() - true) <= Z * mean_se / math.sqrt(len(runs))


def test_class_samples_needs_exact():
    from flatcheck.errors import ConfigError

    with pytest.raises(ConfigError, match="class_samples needs estimator exact"):
        probe_requests(["trace"], {"trace": {"class_samples": 4}})


def test_streamed_hutchinson_equals_the_block_product_route():
    """The autograd backend streams vᵀHv from int8 signs; forcing the (k, P) product route
    gives the same probes, hence the same values and parts, to float64 round-off."""
    from flatcheck.linalg.random import rademacher, rademacher_signs
    from flatcheck.operators import CurvatureOperator, LayoutParts

    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(rademacher_signs(3, 50, g1, device="cpu").double(),
                       rademacher(3, 50, g2, dtype=torch.float64, device="cpu"))

    case = make_case("cnn")
    op = CurvatureOperator(case.backend("autograd"))
    assert op.streams_quadratic

    class Unstreamed(CurvatureOperator):
        streams_quadratic = False

    ref = Unstreamed(case.backend("autograd"))
    split = LayoutParts(case.problem.layout)
    runs = [hutchinson(o, generator=torch.Generator().manual_seed(9), max_probes=12, block_size=5, split=split)
            for o in (op, ref)]
    a, b = runs
    assert a.matvecs == b.matvecs == 12 and op.matvecs == ref.matvecs == 12
    tol = 1e3 * torch.finfo(torch.float64).eps
    # the streamed route has vᵀHv alone: its stderr is the values' spread widened by their
    # skewness (t on 11 dof); the product route's is the spread floored by the products' variance
    assert math.isclose(a.value, b.value, rel_tol=tol) and a.known_stderr is None and a.dof == 11
    values = torch.tensor(b.samples, dtype=torch.float64)
    spread = values.std().item() / math.sqrt(12)
    assert math.isclose(a.spread_stderr, spread, rel_tol=1e-9) and a.interval == INTERVAL_SKEW
    assert math.isclose(a.stderr, spread * skew_widening(values), rel_tol=1e-9)
    assert b.stderr == max(spread, b.known_stderr) and b.interval == INTERVAL_FLOOR
    assert a.groups.keys() == b.groups.keys()
    for key in a.groups:
        assert math.isclose(a.groups[key][0], b.groups[key][0], rel_tol=tol, abs_tol=tol * abs(a.value))


@pytest.mark.parametrize("layers", [True, False])
def test_trace_result_says_which_interval_it_is(layers):
    """The autograd backend's Hessian gives vᵀHv alone (per-parameter sums, or forward tangents
    without parts): the result's stderr on dof m − 1 is the spread widened by the values'
    skewness, and details say so with the spread and the skewness; the GGN's products floor it."""
    from flatcheck.linalg.trace import skewness

    case = make_case("cnn")
    r = _run(case, probes_max=10, rtol="none", parts=layers, route="hvp" if layers else "tangent")
    d = r.details
    values = torch.tensor(d["probe_values"], dtype=torch.float64)
    assert d["route"] == ("hvp_sums" if layers else "vhv_tangent") and d["interval"] == INTERVAL_SKEW
    assert r.dof == 9 and d["known_stderr"] is None
    assert math.isclose(d["spread_stderr"], values.std().item() / math.sqrt(10), rel_tol=1e-9)
    assert math.isclose(d["skewness"], skewness(values), rel_tol=1e-9)
    assert math.isclose(r.stderr, d["spread_stderr"] * skew_widening(values), rel_tol=1e-9)
    g = _run(case, probes_max=10, rtol="none", matrix="ggn", parts=layers)
    assert g.details["interval"] == INTERVAL_FLOOR and g.dof is None


@pytest.mark.parametrize("options, said, flags", [
    ({"probes_max": -3}, "probes_max must be at least 2", "--probes-max must be at least 2"),
    ({"estimator": "hutchpp", "rtol": 0.1}, "rtol needs estimator hutchinson", "--rtol needs --estimator hutchinson"),
    # the default's own value, given, is as ignored by Hutch++ as any other (stranger19: exit 0)
    ({"estimator": "hutchpp", "rtol": 0.05}, "rtol needs estimator hutchinson", "--rtol needs --estimator hutchinson"),
    # a switch with a value: the keyword and its value in code, the CLI's own switch
    ({"route": "tangent"}, "route=tangent needs parts=False", "--route tangent needs --no-layers"),
])
def test_an_option_refusal_is_worded_in_keywords_from_python_and_in_flags_on_the_cli(options, said, flags):
    """measure(probes={"trace": {...}}) said --probes-max, a flag the caller never wrote
    (stranger18); the CLI says the flag."""
    import flatcheck
    from flatcheck.errors import ConfigError
    from flatcheck.settings import flag_of

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    with pytest.raises(ConfigError) as caught:
        flatcheck.measure(model, (torch.randn(8, 3), torch.randint(0, 2, (8,))), probes={"trace": options})
    assert str(caught.value).startswith(said) and "--" not in str(caught.value)
    assert caught.value.worded(flag_of).startswith(flags)


def _tiny_tanh_mlp():
    """A 3-4-2 tanh MLP and 16 samples for it."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    return model, (torch.randn(16, 3), torch.randint(0, 2, (16,)))


def _hutchpp_pace_heard(options: dict, **settings):
    """measure()'s Hutch++ trace with `options`, and what it told a progress display of its
    pace (report/pulse): "anew" for a change of pace, (unit, cost) for a cost announced ahead."""
    import flatcheck
    from flatcheck.report.pulse import listening

    heard = []

    def listener(done, total, vectors, built=0.0, anew=False, ahead=None):
        if anew or ahead is not None:
            heard.append("anew" if anew else ahead)

    with listening(listener):
        report = flatcheck.measure(*_tiny_tanh_mlp(), probes={"trace": {"estimator": "hutchpp", **options}},
                                   **settings)
    return report, heard


@pytest.mark.parametrize("parts, route", [(False, "tangent"), (False, "hvp"), (True, "auto")])
def test_hutchpp_says_when_its_units_change_cost(parts, route):
    """Without parts, Hutch++'s last two thirds are quadratic forms: by forward tangents about
    half a sketch product each, so before the sketch it tells a progress display what they are
    expected to cost (report/pulse, `ahead`); by HVPs a product each, so it does not; and after
    the sketch, on either route, to time them afresh. With parts every unit is a product and
    nothing changes."""
    from flatcheck.operators import TANGENT_FORM_COST

    report, heard = _hutchpp_pace_heard({"probes_max": 6, "parts": parts, "route": route})
    said = {"tangent": [(2, TANGENT_FORM_COST), "anew"], "hvp": ["anew"], "auto": []}[route]
    assert heard == said, report.results["trace"].details.get("route")


def test_hutchpp_cut_by_a_budget_announces_the_forms_where_they_now_begin():
    """Under a budget that leaves room for k = 2 (6 units), the forms begin at unit 2, not at
    the third of --probes-max that was planned: the display prices from there."""
    from flatcheck.operators import TANGENT_FORM_COST

    report, heard = _hutchpp_pace_heard({"probes_max": 30, "parts": False}, budget=1e-6)
    assert report.results["trace"].matvecs == 6
    assert heard == [(2, TANGENT_FORM_COST), "anew"]


def test_hutchpp_cut_by_a_budget_ends_its_line_stopped_with_its_planned_count(capsys):
    """stranger20: a Hutch++ that the budget sized down ended `done · 6/6`, as though it had
    run its course; it says `stopped by the budget · 6/30`, as the other probes do."""
    import flatcheck

    torch.manual_seed(0)
    flatcheck.measure(*_tiny_tanh_mlp(), budget=1e-6, progress=True,
                      probes={"trace": {"estimator": "hutchpp", "probes_max": 30, "parts": False}})
    last = [line for line in capsys.readouterr().err.splitlines() if line.startswith("flatcheck trace")][-1]
    assert last.startswith("flatcheck trace (hutchpp): stopped by the budget · 6/30 · "), last
