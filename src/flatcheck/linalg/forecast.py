"""How many units of work an iterative estimator still needs, from its stopping rule's progress:
what a progress line's total and ETA are made of (report/progress.py), instead of the cap on
iterations, which a converging run never reaches.

Two rules: an error bound that falls geometrically towards its target (Lanczos, power
iteration), forecast from its mean rate of decay; and a standard error that falls as 1/√m
towards rtol·|mean| (Hutchinson), forecast from the √m law. Before a bound has fallen once,
a cold Lanczos stop of one eigenvalue shows a prior (`Prior`: what such a stop usually takes),
marked as one, so that a run whose first product takes a while has an ETA after it.
"""

from __future__ import annotations

import math

# the first finite bound is left out of the rate: it comes from a one-step Krylov space, and
# its fall to the second is many times any later step's (6–7 of log e against 1–2 on a
# ResNet-18), so a rate that includes it forecasts a run a fraction of its length
SKIP = 1
# before the steps tell their own rate, a fall of one e-fold a step (what lmax's bound falls by
# a step on a ResNet-18 at random init, after the first, one vector or a block of two),
# worth PRIOR_STEPS steps of evidence: a forecast from the second step on, which the
# measured steps take over as they come
PRIOR_RATE = 1.0
PRIOR_STEPS = 2
# the steps a cold certified stop of one eigenvalue takes at the default tol, as a prior before
# its bound has fallen once: on a torchvision ResNet-18 at random init over 64 samples, 9 for
# seeds 0–3 with one vector a step (10 products with the check), 8, 9, 8, 9 with a block of two
# (16 and 18 products); 6 on the demo digits CNN. Not a forecast of this run: the line marks
# it as a guess (`1/~10`), and the decay's forecast replaces it at the second bound.
COLD_STEPS = 9
# the same for lmax's default, block Lanczos from two starts, in block steps: since its likely
# last step is taken a row at a time led by the top pair's residual, 13–17 products (median 15)
# over seeds 0–11 of that ResNet-18; 8 steps (16 products) errs long, as a prior should
COLD_BLOCK_STEPS = 8
# a Chebyshev rate is taken once it has fallen by less than this between two checks: the Ritz
# values it is made of (θ_{b+1} rising to its eigenvalue, the lowest falling to λ_min) overstate
# it many times in a run's first steps, and less than twofold once they have settled
SETTLED = 0.5


class Prior(int):
    """A total that is a prior, not forecast from the run's own progress: the progress line
    shows it as a guess (report/progress.py)."""

    prior = True


def chebyshev_rate(ritz, block: int) -> float | None:
    """Log-decay a block step of the top eigenvalue's error in a block Krylov space of `block`
    starts, as Chebyshev polynomials bound it (Saad 1980; Golub & Underwood 1977): the error
    falls as T_j(1 + 2γ)⁻² with γ = (λ1 − λ_{b+1})/(λ_{b+1} − λ_min), so by 2·acosh(1 + 2γ) a
    step; a bound r²/δ falls at the same rate once δ has settled. The eigenvalues are the Ritz
    values `ritz` (any order) stand for; None where they cannot tell (fewer than block + 2, or
    no spread). Ritz values lie inside the spectrum, so early in a run this overstates the
    rate: DecayForecast takes it only once it has settled (SETTLED)."""
    values = sorted((float(v) for v in ritz), reverse=True)
    if len(values) < block + 2:
        return None
    top, nxt, low = values[0], values[block], values[-1]
    if not (top > nxt > low) or not all(map(math.isfinite, (top, nxt, low))):
        return None
    return 2 * math.acosh(1 + 2 * (top - nxt) / (nxt - low))


class DecayForecast:
    """Units still needed for a ratio (bound ÷ target) to fall to 1, at its mean log-rate since
    its second finite value (SKIP), shrunk towards PRIOR_RATE. One step's rate swings by
    several times between steps (a plateau, then a fast fall), so a latest-step rate makes the
    total jump up and down; the mean over the run holds steady, and Lanczos' speed-up as it
    goes errs it on the long side.

    `limit`: the cap on units (products); `extra`: units the stop takes besides the steps (a
    cold Lanczos check's true residuals: one product per Ritz vector); `per_step`: the units a
    step takes (a block's rows), the unit the prior rate and the steps left are counted in;
    `prior_steps`: the steps to show (as a Prior total) before the bound has fallen once, 0
    for none; by default COLD_STEPS for a one-vector cold stop of one eigenvalue (extra 1),
    the case it was measured on, and none for any other (a warm start, several eigenvalues,
    power iteration) unless the caller passes it."""

    def __init__(self, limit: int, extra: int = 0, *, per_step: int = 1, prior_steps: int | None = None):
        self.limit, self.extra, self.per_step = limit, extra, max(1, per_step)
        self.prior_steps = (COLD_STEPS if extra == 1 else 0) if prior_steps is None else prior_steps
        self.seen: list[tuple[int, float]] = []
        self.rates: list[float | None] = []  # the Chebyshev rates given, per call
        self.last = 0
        # the stop's own schedule: after a check that fell short, nothing ends before this unit
        self.not_before = 0

    def total(self, done: int, ratio: float, rate: float | None = None) -> int:
        """The forecast total after `done` units with the ratio now at `ratio`; before SKIP + 1
        finite ratios the prior (a Prior), if there is one; while they do not fall, the last
        forecast still ahead; else 0 (not known).

        `rate`: the log-decay a step that theory gives from the solver's state (chebyshev_rate),
        if it has one. The measured mean rate is learnt on the run's plateau (the gap estimate
        shrinking while θ2 rises) and cannot see the faster fall at its end; once the
        theoretical rate has settled (fallen by less than SETTLED since the last call), it
        forecasts instead."""
        previous = self.rates[-1] if self.rates else None
        self.rates.append(rate)
        if ratio <= 1:
            self.last = min(self.limit, max(done, self.not_before) + self.extra)
            return self.last
        if ratio > 0 and math.isfinite(ratio):
            self.seen.append((done, math.log(ratio)))
        used = self.seen[SKIP:]
        step = self.per_step
        if (used and rate and previous and rate > 0 and math.isfinite(rate) and rate > SETTLED * previous
                and math.isfinite(ratio)):
            # in units, not whole steps: a run that ends a row at a time stops at any count
            left = max(1, round(step * math.log(ratio) / rate))
            self.last = min(self.limit, max(done + left, self.not_before) + self.extra)
            return self.last
        slope = 0.0  # log-ratio a unit
        if used:
            (d0, l0), (d1, l1) = used[0], used[-1]
            slope = (l0 - l1 + PRIOR_RATE * PRIOR_STEPS) / (d1 - d0 + PRIOR_STEPS * step)
        if slope > 0:
            left = step * max(1, round(used[-1][1] / slope / step))  # whole steps
            self.last = min(self.limit, max(done + left, self.not_before) + self.extra)
        elif not used and self.prior_steps:
            self.last = Prior(min(self.limit, max(self.prior_steps * step, done + step) + self.extra))
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
