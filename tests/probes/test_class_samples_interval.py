"""The class-sampled Tr(G)'s interval (trace --estimator exact --class-samples K) against the
dense float64 GGN: Welch's dof, the skewness enclosure from K ≥ 3 draws, and its parts' stderrs.

The draws λ‖Jᵀu‖²/q are heavy-tailed, so a few samples carry most of the stderr²: a normal
interval on it covered the truth in 87 % of seeds on the small MLP below (K = 2), 88 % on a
600-sample MLP."""

from __future__ import annotations

import math

import pytest
from scipy import stats
from scipy.special import stdtrit

from tests.probes.test_trace import Z, _run
from tests.support.dense import block_traces, dense, make_case
from flatcheck.linalg.trace import SKEW_TERM


@pytest.mark.statistical
def test_class_sampled_interval_covers_the_dense_trace():
    """Over 400 seeds, value ± t(dof)·stderr misses the dense Tr(G) no more often than a 95 %
    interval may (binomial, 1e-4). 8 samples, K = 2: Welch's dof is about 2 here; the normal
    interval missed 51 of 400."""
    case = make_case("mlp", n=8)
    _, G = dense(case)
    true = G.trace().item()
    seeds = 400
    misses = 0
    for seed in range(seeds):
        r = _run(case, seed=seed, estimator="exact", class_samples=2)
        q = stats.norm.ppf(0.975) if r.dof is None else stdtrit(r.dof, 0.975)
        misses += abs(r.value - true) > q * r.stderr
    assert misses <= stats.binom.isf(1e-4, seeds, 0.05), misses


@pytest.mark.parametrize("k", [2, 3])
def test_class_sampled_interval_is_reported(k):
    """dof, the interval's name and the unwidened spread are in the record; from three draws
    the stderr is the spread widened by the total's skewness; the layers' parts carry a
    stderr and each is within Z of its dense diagonal block's trace."""
    case = make_case("mlp")
    _, G = dense(case)
    r = _run(case, seed=1, estimator="exact", class_samples=k)
    d = r.details
    assert isinstance(r.dof, int) and r.dof >= 1
    assert abs(r.value - G.trace().item()) <= Z * r.stderr
    if k == 2:
        assert d["interval"] == "welch_t" and d["skewness"] is None and r.stderr == d["spread_stderr"]
    else:
        assert d["interval"] == "welch_t_skewness_enclosure" and d["skewness"] is not None
        q = stdtrit(r.dof, 0.975)
        assert math.isclose(r.stderr, d["spread_stderr"] * (q + abs(d["skewness"]) * SKEW_TERM) / q, rel_tol=1e-12)
    truth = block_traces(G, case.problem.layout)
    for name, part in d["layers"].items():
        assert part["stderr"] is not None and part["stderr"] >= 0, name
        assert abs(part["value"] - truth[name]) <= Z * part["stderr"] + 1e-12, name
    assert all(p["stderr"] is not None for p in d["per_parameter"].values())
