"""How many units of work an iterative estimator still needs, from its stopping rule's progress:
what a progress line's total and ETA are made of (report/progress.py), instead of the cap on
iterations, which a converging run never reaches.

Two rules: an error bound that falls geometrically towards its target (Lanczos, power
iteration), forecast from its latest rate of decay; and a standard error that falls as 1/√m
towards rtol·|mean| (Hutchinson), forecast from the √m law.
"""

from __future__ import annotations

import math

# the decay rate is taken over this many of the latest steps: Lanczos speeds up as it goes
# (superlinear convergence), so an old rate would overstate the steps left
WINDOW = 1


class DecayForecast:
    """Units still needed for a ratio (bound ÷ target) to fall to 1, at its latest log-rate.
    `limit`: the cap on units; `extra`: units the stop takes besides the steps (a cold Lanczos
    check's true residuals: one product per Ritz vector)."""

    def __init__(self, limit: int, extra: int = 0):
        self.limit, self.extra = limit, extra
        self.seen: list[tuple[int, float]] = []
        self.last = 0
        # the stop's own schedule: after a check that fell short, nothing ends before this unit
        self.not_before = 0

    def total(self, done: int, ratio: float) -> int:
        """The forecast total after `done` units with the ratio now at `ratio`; while the rate
        cannot be told (fewer than two finite ratios, or one that is not falling) the last
        forecast still ahead, else 0 (not known)."""
        if ratio <= 1:
            self.last = min(self.limit, max(done, self.not_before) + self.extra)
            return self.last
        if ratio > 0 and math.isfinite(ratio):
            self.seen = (self.seen + [(done, math.log(ratio))])[-(WINDOW + 1):]
        (d0, l0), (d1, l1) = (self.seen[0], self.seen[-1]) if self.seen else ((0, 0.0), (0, 0.0))
        slope = (l1 - l0) / (d1 - d0) if d1 > d0 else 0.0
        if slope < 0:
            self.last = min(self.limit, max(done + math.ceil(l1 / -slope), self.not_before) + self.extra)
        elif self.last <= done:
            self.last = 0
        return self.last


def stderr_forecast(done: int, mean: float, stderr: float | None, rtol: float | None, least: int,
                    most: int) -> int:
    """Probes a mean needs for stderr/|mean| < rtol, its stderr falling as 1/√m: the m with
    done·(stderr/(rtol·|mean|))² probes, between `least` and `most`; `most` without rtol, 0
    (not yet known) before a stderr, and at least one more while the rule is not met."""
    if rtol is None:
        return most
    if stderr is None or mean == 0 or not math.isfinite(stderr):
        return 0
    need = math.ceil(done * (stderr / (rtol * abs(mean))) ** 2)
    if stderr / abs(mean) >= rtol:
        need = max(need, done + 1)
    return min(most, max(least, need))
