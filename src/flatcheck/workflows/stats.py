"""Rank and linear correlations with confidence intervals and p-values.

Pearson: p-value from scipy.stats.pearsonr; interval from Fisher's z, tanh(atanh r ± q/√(n−3)),
the same interval scipy's pearsonr(...).confidence_interval() gives.
Spearman: p-value from the exact permutation distribution for n ≤ EXACT_SPEARMAN_MAX_N (every
ordering of y against x), else scipy.stats.spearmanr's t approximation, which at n = 7 put a
perfect ranking at p = 0 where no ordering can be rarer than 2/7! ≈ 4e-4. Kendall: p-value from
scipy.stats.kendalltau (exact for small n without ties). Spearman and Kendall intervals from a
seeded paired percentile bootstrap (resample the (x, y) pairs with replacement), because
their sampling distributions have no exact closed form and Fisher-z variants assume
bivariate normal data, which sharpness values across model families are not.
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass

import numpy as np
from scipy import stats

METHODS = ("pearson", "spearman", "kendall")
# 9! = 362,880 orderings, about 0.3 s; scipy 1.17's spearmanr has no exact method, and
# permutation_test(permutation_type="pairings") took 57 s for the 5,040 orderings of n = 7 here
EXACT_SPEARMAN_MAX_N = 9
# below this many models a percentile bootstrap of a rank correlation covers far less than its
# stated level (a resample of n = 4 points draws only a few distinct rankings), so no interval
MIN_BOOTSTRAP_N = 10


@dataclass(frozen=True)
class Correlation:
    method: str
    r: float
    low: float | None
    high: float | None
    p_value: float
    n: int
    interval: str  # how the interval was obtained

    def to_dict(self) -> dict:
        return {"method": self.method, "r": _num(self.r), "ci_low": _num(self.low), "ci_high": _num(self.high),
                "p_value": _num(self.p_value), "n": self.n, "interval": self.interval}


def _num(x: float | None):
    return None if x is None or not math.isfinite(x) else float(x)


def _p(p: float) -> float:
    # a p-value is never 0: 0 from a tail function means it underflowed, so say the least we know
    return max(float(p), sys.float_info.min) if math.isfinite(p) else p


def spearman_exact_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p-value of Spearman's ρ from its exact permutation distribution: the share of
    the n! orderings of y whose |ρ| is at least the observed (ties keep their average ranks)."""
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    orders = np.array(list(itertools.permutations(range(len(x)))), dtype=np.intp)
    # reordering y leaves both sums of squares as they are: only the cross product moves
    null = ry[orders] @ rx
    observed = abs(float(ry @ rx))
    # the slack keeps an ordering whose sum equals the observed one up to rounding in the tail
    return float(np.mean(np.abs(null) >= observed * (1 - 1e-12)))


def correlate(x, y, *, confidence: float = 0.95, n_boot: int = 2000, seed: int = 0) -> list[Correlation]:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("x and y must be 1-d and of equal length")
    n = len(x)
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        nan = float("nan")
        return [Correlation(m, nan, None, None, nan, n, "too few distinct points") for m in METHODS]
    pr = stats.pearsonr(x, y)
    rs = stats.spearmanr(x, y)
    rs_p = spearman_exact_p(x, y) if n <= EXACT_SPEARMAN_MAX_N else float(rs.pvalue)
    kt = stats.kendalltau(x, y)
    low, high = fisher_interval(float(pr.statistic), n, confidence)
    boot = _bootstrap(x, y, n_boot, seed, confidence)
    ranks = {"spearman": float(rs.statistic), "kendall": float(kt.statistic)}
    how = {m: f"bootstrap {n_boot}, seed {seed}" for m in ranks}
    for m, r in ranks.items():
        # every resample of a perfect ranking is perfect: [±1, ±1] would claim certainty
        # that n points cannot give; the p-value beside it says how much they do
        why = (f"none: n < {MIN_BOOTSTRAP_N}" if n < MIN_BOOTSTRAP_N
               else "none: a bootstrap of |r| = 1 resamples only |r| = 1" if abs(r) == 1 else None)
        if why is not None:
            boot[m], how[m] = (None, None), why
    # Fisher's z has n − 3 degrees of freedom: at n = 3 there is no interval, and the column says so
    fisher = "Fisher z" if low is not None else "none: n ≤ 3 (Fisher z needs n > 3)"
    return [
        Correlation("pearson", float(pr.statistic), low, high, _p(pr.pvalue), n, fisher),
        Correlation("spearman", ranks["spearman"], *boot["spearman"], _p(rs_p), n, how["spearman"]),
        Correlation("kendall", ranks["kendall"], *boot["kendall"], _p(kt.pvalue), n, how["kendall"]),
    ]


def fisher_interval(r: float, n: int, confidence: float) -> tuple[float | None, float | None]:
    if n <= 3:
        return None, None
    q = stats.norm.ppf(0.5 + confidence / 2)
    z = math.atanh(max(min(r, 1 - 1e-15), -1 + 1e-15))
    half = q / math.sqrt(n - 3)
    return math.tanh(z - half), math.tanh(z + half)


def _bootstrap(x, y, n_boot: int, seed: int, confidence: float) -> dict[str, tuple[float | None, float | None]]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    # Spearman is Pearson on ranks; ranking each resample keeps ties handled as scipy does
    xs, ys = x[idx], y[idx]
    rx, ry = stats.rankdata(xs, axis=1), stats.rankdata(ys, axis=1)
    spear = _rowwise_pearson(rx, ry)
    kend = np.array([stats.kendalltau(a, b).statistic for a, b in zip(xs, ys)])
    alpha = (1 - confidence) / 2
    out = {}
    for name, vals in (("spearman", spear), ("kendall", kend)):
        vals = vals[np.isfinite(vals)]  # a resample of all-equal values has no correlation
        if len(vals) < max(10, n_boot // 10):
            out[name] = (None, None)
        else:
            out[name] = (float(np.quantile(vals, alpha)), float(np.quantile(vals, 1 - alpha)))
    return out


def _rowwise_pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(1, keepdims=True)
    b = b - b.mean(1, keepdims=True)
    den = np.sqrt((a * a).sum(1) * (b * b).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(1) / den
