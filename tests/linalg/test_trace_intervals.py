"""Hutchinson's 95 % interval where only the values vᵀHv exist (the streamed routes: vᵀHv by
forward tangents, or per-parameter sums of v ⊙ Hv): the t interval widened to the symmetric
enclosure of the skewness-corrected one, checked against dense float64 Hessians.

The coverage bar is the exact binomial band of 1,000 intervals at 95 %: [931, 967] holds a
correct interval's count with probability ≥ 99 % (at most 0.5 % in each tail); the seeds are
fixed, so the bar is a fixed one.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from scipy import stats

from tests.support.dense import DenseOperator, dense, make_case, mixer_case
from flatcheck.linalg import hutchinson
from flatcheck.linalg.trace import INTERVAL_FLOOR, INTERVAL_SKEW, SKEW_TERM, skew_widening, skewness

SEEDS = 1000
LOW, HIGH = int(stats.binom.ppf(0.005, SEEDS, 0.95)), int(stats.binom.isf(0.005, SEEDS, 0.95))


class StreamedDense(DenseOperator):
    """A dense matrix that gives vᵀAv alone, as the autograd backend's streamed routes do."""

    streams_total = True
    streams_quadratic = False

    def quadratic(self, S, split=None):
        V = S.to(self.dtype)
        self.matvecs += V.shape[0]
        return ((V @ self.A) * V).sum(1), {}


@functools.lru_cache(maxsize=None)
def _hessian(kind: str) -> torch.Tensor:
    H, _ = dense(mixer_case() if kind == "mixer" else make_case(kind))
    return (H + H.T) / 2


def _gate_half_width(est) -> float:
    from flatcheck.workflows.gate import quantile

    return quantile(0.95, est.dof) * est.stderr


# -- the mechanism ----------------------------------------------------------------------------

def test_skewness_is_the_adjusted_sample_skewness():
    x = torch.tensor([0.1, 0.3, 0.2, 2.5, 0.4, 0.2, 0.9], dtype=torch.float64)
    assert skewness(x) == pytest.approx(stats.skew(x.numpy(), bias=False), rel=1e-12)
    assert skewness(x[:2]) is None and skewness(torch.ones(5, dtype=torch.float64)) is None


def test_widening_is_the_skewness_corrected_enclosure():
    """value ± q·stderr is x̄ ± s·(t + |G1|·(2z² + 1)/(6√m)) whichever quantile q the dof
    names, and symmetric values keep the t interval."""
    x = torch.tensor([0.1, 0.3, 0.2, 2.5, 0.4, 0.2, 0.9, 0.3, 0.1, 0.5], dtype=torch.float64)
    m, t = len(x), stats.t.ppf(0.975, 9)
    half = t + abs(stats.skew(x.numpy(), bias=False)) * SKEW_TERM / math.sqrt(m)
    assert SKEW_TERM == pytest.approx((2 * stats.norm.ppf(0.975) ** 2 + 1) / 6, rel=1e-12)
    assert skew_widening(x) * t == pytest.approx(half, rel=1e-12)
    assert skew_widening(x, normal=True) * stats.norm.ppf(0.975) == pytest.approx(half, rel=1e-12)
    assert skew_widening(x) > 1.2
    symmetric = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    assert skew_widening(symmetric) == pytest.approx(1.0, abs=1e-12)


def test_streamed_estimate_states_its_interval():
    """A streamed run's stderr is its spread times the widening, on m − 1 dof, and it says so;
    a run with products keeps the floored normal interval."""
    A = _hessian("cnn")
    est = hutchinson(StreamedDense(A), generator=torch.Generator().manual_seed(0), max_probes=10)
    samples = torch.tensor(est.samples, dtype=torch.float64)
    spread = samples.std().item() / math.sqrt(10)
    assert est.interval == INTERVAL_SKEW and est.dof == 9 and est.known_stderr is None
    assert est.spread_stderr == pytest.approx(spread, rel=1e-12)
    assert est.skewness == pytest.approx(skewness(samples), rel=1e-12)
    assert est.stderr == pytest.approx(spread * skew_widening(samples), rel=1e-12)
    # the same draws through products: the same values, the product-variance floor instead
    product = hutchinson(DenseOperator(A), generator=torch.Generator().manual_seed(0), max_probes=10)
    assert product.samples == pytest.approx(est.samples, rel=1e-12)
    assert product.interval == INTERVAL_FLOOR and product.dof is None and product.stderr >= product.known_stderr


# -- coverage against the dense trace ----------------------------------------------------------

def _coverage(A: torch.Tensor, m: int, widened: bool = True) -> int:
    true, covered = A.trace().item(), 0
    for seed in range(SEEDS):
        est = hutchinson(StreamedDense(A), generator=torch.Generator().manual_seed(seed), max_probes=m, rtol=None)
        half = _gate_half_width(est) if widened else stats.t.ppf(0.975, m - 1) * est.spread_stderr
        covered += abs(est.value - true) <= half
    return covered


@pytest.mark.statistical
@pytest.mark.parametrize("m", [10, 20])
@pytest.mark.parametrize("kind", ["mlp", "cnn", "mixer"])
def test_streamed_interval_covers_the_dense_trace_at_few_probes(kind, m):
    """The interval a gate reads (value ± q·stderr on the result's dof) covers the dense
    float64 Tr(H) of three small networks within the binomial band at m = 10 and 20. The CNN's
    H has one outlying eigenvalue (skewness of vᵀHv about +1.5) and the mixer's one negative
    (about −1.7): the plain t interval covered 93–94 % of them at m = 10–50."""
    A = _hessian(kind)
    covered = _coverage(A, m)
    plain = _coverage(A, m, widened=False)
    assert LOW <= covered <= HIGH, (f"{kind} m={m}: {covered} of {SEEDS} widened intervals cover Tr(H) "
                                    f"(band [{LOW}, {HIGH}]); the plain t interval covers {plain}")


def test_hutchpp_takes_the_products_explain_says():
    """explain trace: Hutch++ takes 3·⌊--probes-max/3⌋ products (9 at --probes-max 10), not
    exactly --probes-max."""
    from flatcheck.linalg import hutchpp
    from flatcheck.probes.explanations import EXPLANATIONS

    A = _hessian("mlp")
    for asked in (10, 11, 12):
        op = DenseOperator(A)
        est = hutchpp(op, generator=torch.Generator().manual_seed(0), matvecs=asked)
        assert est.matvecs == op.matvecs == 3 * (asked // 3)
    cost = EXPLANATIONS["trace"].cost
    assert "3·⌊--probes-max/3⌋ products (9 at --probes-max 10)" in cost and "exactly --probes-max" not in cost
