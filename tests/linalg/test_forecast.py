"""Progress totals from the stopping rules (linalg/forecast.py): what a progress line's ETA is
made of, tested on units, with no clock."""

from __future__ import annotations

import math

import pytest
import torch

from flatcheck.linalg.forecast import COLD_STEPS, DecayForecast, Prior, stderr_forecast
from flatcheck.linalg.lanczos import lanczos_top
from flatcheck.linalg.trace import hutchpp
from tests.support.dense import DenseOperator as Dense


def test_a_geometric_decay_is_forecast_from_its_second_point_on():
    f = DecayForecast(limit=300, extra=1, prior_steps=0)
    assert f.total(1, math.e ** 12) == 0  # one point, left out of the rate: no forecast yet
    # the second point alone: the prior's one e-fold a step, 10 more steps, then the check
    assert f.total(2, math.e ** 10) == 2 + 10 + 1
    # then the measured rate (two e-folds a step) takes over from the prior: 8 / ((2·1 + 2) / 3)
    assert f.total(3, math.e ** 8) == 3 + 6 + 1
    f2 = DecayForecast(limit=300, extra=1)
    totals = [f2.total(d, math.e ** (40 - 2 * d)) for d in range(1, 19)]
    assert totals[-1] - (18 + 2 + 1) in (0, 1)  # after many steps, the measured rate: within a step
    assert f2.total(19, 0.5) == 20  # met: only the check is left


def test_the_first_steep_fall_and_a_plateau_do_not_swing_the_forecast():
    # log-ratios of lmax's bound on a ResNet-18 (benchmarks/results/eta_resnet18.md): a fall of 7
    # in the first step, ~1 a step after it with a plateau at steps 4-6; converged at step 9,
    # done after 10 products (the check's one)
    for logs in ([14.18, 7.17, 5.26, 4.09, 4.51, 4.09, 2.79, 1.47, -0.37],
                 [14.03, 6.92, 5.21, 4.23, 3.21, 3.23, 2.72, 1.31, -1.85]):
        f = DecayForecast(limit=300, extra=1)
        totals = [f.total(d, math.exp(x)) for d, x in enumerate(logs, start=1)]
        assert isinstance(totals[0], Prior) and totals[0] == COLD_STEPS + 1 and totals[-1] == 10
        assert not any(isinstance(t, Prior) for t in totals[1:])  # the decay's forecast from the second on
        for done, total in zip(range(2, 9), totals[1:8]):
            assert 0.5 * (10 - done) <= total - done <= 2 * (10 - done), (done, totals)
        assert max(totals) <= 12  # the latest step's rate alone forecast 4 after step 2, 17 after step 6
        assert sum(abs(t - 10) for t in totals[1:8]) / 7 <= 1.5  # in units, within 1.5 on average


def test_a_prior_before_the_bound_has_fallen_once_only_where_it_was_measured():
    # a one-vector cold stop of one eigenvalue (its check: one product) shows the prior, marked
    f = DecayForecast(limit=300, extra=1)
    first = f.total(1, math.e ** 12)
    assert isinstance(first, Prior) and first.prior and first == COLD_STEPS + 1
    assert f.total(1, math.inf) == COLD_STEPS + 1  # no finite bound yet: still the prior
    assert not isinstance(f.total(2, math.e ** 10), Prior)  # the decay's own forecast takes over
    # never less than a step and the check past what is done, never past the cap
    assert DecayForecast(limit=300, extra=1).total(12, math.e ** 12) == 12 + 1 + 1
    assert DecayForecast(limit=6, extra=1).total(1, math.e ** 12) == 6
    # none where it was not measured: a warm start, several eigenvalues, power iteration; or off
    for f in (DecayForecast(300), DecayForecast(300, extra=3), DecayForecast(300, extra=1, prior_steps=0)):
        assert f.total(1, math.e ** 12) == 0
    # a caller's own, in its steps: a block of two vectors a step, no check
    assert DecayForecast(300, per_step=2, prior_steps=COLD_STEPS).total(2, math.e ** 12) == 2 * COLD_STEPS


def test_a_block_step_counts_its_products_and_its_rate_is_a_steps():
    # log-ratios of a block of two on a ResNet-18 (benchmarks/results/eta_resnet18.md), a report
    # every two products; converged at 16 products, no check
    logs = [13.86, 7.11, 5.21, 4.65, 4.50, 3.86, 1.65]
    f = DecayForecast(limit=300, per_step=2, prior_steps=COLD_STEPS)
    totals = [f.total(d, math.exp(x)) for d, x in zip(range(2, 16, 2), logs)]
    assert all(t % 2 == 0 for t in totals)  # whole steps
    assert totals[0] == 18 and isinstance(totals[0], Prior)
    for done, total in zip(range(4, 16, 2), totals[1:]):
        assert 0.5 * (16 - done) <= total - done <= 2 * (16 - done), (done, totals)
    # a product's rate of one e-fold (the one-vector prior) would forecast 11 at the second
    assert DecayForecast(limit=300).total(2, math.exp(logs[0])) == 0
    one = DecayForecast(limit=300)
    one.total(2, math.exp(logs[0]))
    assert one.total(4, math.exp(logs[1])) == 11


def test_a_check_that_fell_short_holds_the_forecast_to_the_next_check():
    f = DecayForecast(limit=100, extra=1)
    f.not_before = 12  # the estimate said converged at step 8, the true residuals did not
    assert f.total(8, 0.5) == 12 + 1
    f.total(9, 8.0)
    f.total(10, 2.0)
    assert f.total(11, 1.5) == 12 + 1  # one step to go at this rate, but the check is at 12


def test_a_ratio_that_does_not_fall_keeps_the_last_forecast_and_the_cap_holds():
    f = DecayForecast(limit=20)
    f.total(1, 1e4)
    assert f.total(2, math.e ** 2) == 4  # the prior: two e-folds, two steps
    assert f.total(3, math.e ** 8) == 4  # it rose past the prior: the last forecast, while ahead
    assert f.total(4, math.e ** 8) == 0  # and unknown once reached
    assert f.total(5, math.inf) == 0
    g = DecayForecast(limit=20)
    g.total(1, 1e7)
    assert g.total(2, 1e9) == 20  # 21 e-folds at one a step: past the cap


def test_the_stderr_forecast_follows_the_square_root_law():
    # stderr/|mean| twice rtol after 10 probes: four times the probes
    assert stderr_forecast(10, 1.0, 0.2, 0.1, least=10, most=1000) == 40
    assert stderr_forecast(10, 1.0, 0.2, 0.1, least=10, most=25) == 25
    assert stderr_forecast(10, 1.0, 0.2, None, least=10, most=25) == 25  # no rtol: every probe
    assert stderr_forecast(1, 1.0, None, 0.1, least=10, most=25) == 0  # no stderr yet: unknown
    assert stderr_forecast(10, 1.0, 0.099, 0.1, least=10, most=1000) == 10  # met
    assert stderr_forecast(10, 1.0, 0.1, 0.1, least=2, most=1000) == 11  # not met: one more at least


def test_lanczos_forecasts_its_steps_not_its_cap():
    """The totals lmax's progress line shows come from the bound's decay: none at the cap
    (300), and at half and three quarters of the run within ±50 % of the steps actually left,
    the last one what it took. Not at a quarter: on this matrix the bound holds level for the
    first four steps and then falls by 2–3 e-folds a step, which no rate from the level steps
    can foresee (the forecast is then too long: 2.7× the steps left at step 3)."""
    n = 400
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    eigs = torch.cat([torch.tensor([10.0, 8.0]), torch.linspace(-2.0, 6.0, n - 2)]).double()
    A = Q @ torch.diag(eigs) @ Q.T
    seen = []
    r = lanczos_top(Dense(A), 1, generator=torch.Generator().manual_seed(1), tol=1e-6,
                    progress=lambda done, total, **_: seen.append((done, total)))
    final = r.matvecs  # steps and the check's product
    assert all(total != 300 for _, total in seen)
    assert isinstance(seen[0][1], Prior)  # the first step forecasts nothing: a prior, marked as one
    for done, total in seen:
        if done in (round(final / 2), round(3 * final / 4)):
            left, forecast = final - done, total - done
            assert 0.5 * left <= forecast <= 1.5 * left, (done, total, final)
    assert seen[-1][1] == final


def test_hutchpp_reports_within_each_third():
    A = torch.diag(torch.linspace(0.0, 1.0, 50, dtype=torch.float64))
    seen = []
    hutchpp(Dense(A), generator=torch.Generator().manual_seed(0), matvecs=24,
            progress=lambda done, total, **_: seen.append((done, total)))
    dones = [d for d, _ in seen]
    assert dones == sorted(dones) and dones[-1] == 24 and all(t == 24 for _, t in seen)
    assert len([d for d in dones if d <= 16]) >= 2 * 4  # the sketch's two thirds, in pieces
    assert dones[0] <= 2  # the first count after a piece of the sketch, not after 2k products


@pytest.mark.parametrize("k", [1, 3])
def test_lanczos_last_total_is_what_it_did(k):
    A = torch.diag(torch.linspace(0.0, 1.0, 60, dtype=torch.float64)) + torch.diag(torch.tensor([0.0] * 59 + [1.0]))
    seen = []
    r = lanczos_top(Dense(A), k, generator=torch.Generator().manual_seed(0), tol=1e-8,
                    progress=lambda done, total, **_: seen.append((done, total)))
    assert seen[-1] == (r.matvecs, r.matvecs)  # the end line: every product, the checks' too
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_the_chebyshev_rate_of_a_known_spectrum():
    """2·acosh(1 + 2γ), γ = (λ1 − λ_{b+1})/(λ_{b+1} − λ_min), from the values in any order."""
    from flatcheck.linalg.forecast import chebyshev_rate

    spectrum = [4.0, 10.0, -1.0, 5.0, 0.5]
    assert chebyshev_rate(spectrum, 2) == pytest.approx(2 * math.acosh(1 + 2 * (10 - 4) / (4 + 1)))
    assert chebyshev_rate(spectrum, 1) == pytest.approx(2 * math.acosh(1 + 2 * (10 - 5) / (5 + 1)))
    assert chebyshev_rate([3.0, 2.0, 1.0], 2) is None  # too few values to tell λ_{b+1} from λ_min
    assert chebyshev_rate([2.0, 2.0, 2.0, 1.0], 2) is None  # no gap above λ_{b+1}


def test_a_settled_chebyshev_rate_forecasts_instead_of_the_mean_rate():
    f = DecayForecast(limit=300, per_step=2, prior_steps=0)
    f.total(2, math.e ** 14, None)
    # the mean rate's forecast while the given rate is still falling fast (20 → 8: not settled)
    first = f.total(4, math.e ** 7, 20.0)
    # the mean rate's: (7 − 6 + 1·2 prior) e-folds over 2 + 2·2 units, 0.5 a unit: 6 steps of 2 left
    assert f.total(6, math.e ** 6, 8.0) == 6 + 12
    # 6 after 8 has settled (> SETTLED × 8): ln ratio 5 at 6 e-folds a step of 2 units, 2 units
    assert f.total(8, math.e ** 5, 6.0) == 8 + 2
    assert first == 18  # no earlier rate to be settled against: the mean rate's
    # a rate that falls by more than half again is not taken; a met ratio ends the run as before
    g = DecayForecast(limit=300, per_step=2, prior_steps=0)
    g.total(2, math.e ** 14, None), g.total(4, math.e ** 7, 6.0)
    assert g.total(6, math.e ** 5, 2.0) == 6 + 8  # the mean rate's, (2 + 2)/6 a unit; not 6 + 5
    assert g.total(7, 0.5, 2.0) == 7


@pytest.mark.statistical
def test_the_chebyshev_rate_makes_the_late_eta_believable_on_dense_spectra(monkeypatch):
    """Block Lanczos (lmax's default) on the small models of tests/support/spectra.py, 30 seeds
    each at tol 1e-3 and 1e-6: the total forecast at 75 % of the run, against the products
    that were really left, within ±50 % in ≥ 2/3 of runs with the Chebyshev rate, far more often
    than by the mean rate alone (measured: 174 and 16 of 240)."""
    import flatcheck.linalg.block_lanczos as bl
    from tests.support.spectra import hessian, small_problem

    def late_within(rate) -> int:
        monkeypatch.setattr(bl, "chebyshev_rate", rate)
        met = 0
        for tol in (1e-3, 1e-6):
            for arch in ("mlp", "cnn", "transformer", "twin"):
                for seed in range(30):
                    H = hessian(*small_problem(arch, seed))
                    seen = []
                    r = bl.block_lanczos_top(Dense(H), 1, generator=torch.Generator().manual_seed(seed), tol=tol,
                                             progress=lambda d, t, **kw: seen.append((d, t)))
                    at = 0.75 * r.matvecs
                    totals = [t for d, t in seen if d <= at and t]
                    met += bool(totals) and 0.5 <= (totals[-1] - at) / (r.matvecs - at) <= 1.5
        return met

    plain = bl.chebyshev_rate
    with_rate, without = late_within(plain), late_within(lambda ritz, block: None)
    print(f"\nETA at 75 % within ±50 %: {with_rate}/240 with the Chebyshev rate, {without}/240 without")
    assert with_rate >= 2 * 240 // 3 and with_rate > 2 * without
