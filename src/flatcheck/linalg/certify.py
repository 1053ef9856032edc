"""Error bounds of Ritz values: Kato–Temple's r²/δ where a gap to the rest of the spectrum is
known, the residual |r| where it is not.

For a unit vector y with Rayleigh quotient θ and residual r = ‖Hy − θy‖, some eigenvalue lies
within r of θ. When an interval (a, b) around θ holds exactly one eigenvalue λ, Kato (1949)
and Temple (1952) sharpen this to θ − r²/(b − θ) ≤ λ ≤ θ + r²/(θ − a): the error is at most
r²/δ with δ = min(θ − a, b − θ), quadratic in the residual. Lanczos' residuals fall about as
fast as its Ritz values converge, so a stop on r²/δ ≤ tol·|θ| needs about half the digits of
residual that a stop on r ≤ tol·|θ| does.

The gap is estimated from the Krylov space's other Ritz values: a neighbour θ_j with residual
estimate r_j stands for an eigenvalue in [θ_j − r_j, θ_j + r_j], so δ_i = min_j (|θ_i − θ_j| − r_j)
over the neighbours just above and below, halved (GAP_SAFETY). It is an estimate, not a bound: the next Ritz value
lies at or below the next eigenvalue (Cauchy interlacing), so an eigenvalue the Krylov space has
not yet seen makes δ too large. That risk is measured against dense spectra in the tests
(tests/linalg/test_certify.py): on small MLPs, CNNs and transformers the truth lies within the bound
for ≥ 99 % of values, but a near-degenerate pair that a one-vector Krylov space has not yet
resolved (two eigenvalues a fraction of a percent apart) hides the second and the bound fails.
lmax therefore starts from a block of two random vectors (linalg/block_lanczos.py), whose
second Ritz value follows λ2 (GAP_FROM_BLOCK_KRYLOV); the one-vector recurrence (--starts 1,
and the thick-restarted basis) keeps the risk. Where no gap is resolved (δ ≤ r, or no
neighbour below the top k) the bound falls back to r. A Tracker's warm block (linalg/warm_block.py) takes its gap
from a carried vector that approximates the next eigenvector (GAP_FROM_BLOCK), measured along
gradient-descent trajectories in tests/linalg/test_warm_block.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the estimated gap is divided by this before use: against an eigenvalue between the Ritz
# values that the Krylov space has not yet seen (measured in the tests: undivided, the truth
# fell outside the bound in 1.5 % of a small CNN's values, each time a gap overstated 2-4×)
GAP_SAFETY = 2.0
# a Krylov space of fewer than k + MIN_EXTRA vectors tells no gap: its other Ritz values are
# averages over the rest of the spectrum, far below λ_{k+1} (a warm start that stopped after
# two products on the demo CNN's training run claimed half its true error with them)
MIN_EXTRA = 3
TOO_FEW = "too few Ritz values"  # `below` of such a space: every value falls back to r
# what `kind` says, as the probes' details carry it
KATO_TEMPLE = "r²/δ (Kato–Temple)"
RESIDUAL = "|r| (residual: no gap resolved)"
GAP_FROM_RITZ = ("the neighbouring Ritz values of the Krylov space less their residual estimates, "
                 "min_j |θ_i − θ_j| − r_j, halved (an estimate: a Ritz value lies at or below its eigenvalue, "
                 "so an eigenvalue not yet seen makes it too large)")
GAP_FROM_BLOCK_KRYLOV = ("the next Ritz value of a block Krylov space from random starts, less its residual, "
                         "min_j |θ_i − θ_j| − r_j, halved (an estimate: the block resolves a near-degenerate pair, "
                         "but an eigenvalue it has not yet seen, such as a third of a cluster, makes it too large)")
GAP_FROM_BLOCK = ("the next Ritz value of a warm block that carries the previous call's next eigenvector, "
                  "less its residual, min_j |θ_i − θ_j| − r_j, halved (an estimate: an eigenvalue neither the block "
                  "nor its growth has seen makes it too large)")


@dataclass(frozen=True)
class Bound:
    """|λ − θ| ≤ value for the eigenvalue λ that θ approximates."""

    value: float
    kind: str  # KATO_TEMPLE or RESIDUAL
    gap: float | None  # δ used (KATO_TEMPLE) or the unresolved estimate (RESIDUAL; None: none)


def ritz_bounds(values: list[float], residuals: list[float],
                below: tuple[float, float] | None | str, floor: float = 0.0,
                safety: float = GAP_SAFETY) -> list[Bound]:
    """Bounds of the top Ritz values `values` (largest first) with residual norms `residuals`.
    `below`: the next Ritz value under them and its residual estimate (None: none known, so the
    last of `values` has no gap below and falls back to its residual; TOO_FEW: no gap is
    trusted, every value falls back). `floor`: the least error the products' round-off
    allows (an operator known to eps·‖H‖ has eigenvalues known no better), below which no
    bound goes. `safety`: what the estimated gap is divided by (GAP_SAFETY for a Krylov
    space's Ritz values)."""
    if below == TOO_FEW:
        return residual_bounds(residuals, floor)
    n = len(values)
    out = []
    for i in range(n):
        theta, r = values[i], residuals[i]
        neighbours = []
        if i > 0:
            neighbours.append((values[i - 1], residuals[i - 1]))
        if i + 1 < n:
            neighbours.append((values[i + 1], residuals[i + 1]))
        elif below is not None:
            neighbours.append(below)
        else:
            out.append(Bound(max(r, floor), RESIDUAL, None))
            continue
        gap = min(abs(theta - t) - rt for t, rt in neighbours) / safety
        if math.isfinite(gap) and gap > r:
            out.append(Bound(max(r * r / gap, floor), KATO_TEMPLE, gap))
        else:
            out.append(Bound(max(r, floor), RESIDUAL, gap if math.isfinite(gap) else None))
    return out


def residual_bounds(residuals: list[float], floor: float = 0.0) -> list[Bound]:
    """The fallback for every value: no gap estimate (power iteration has none)."""
    return [Bound(max(r, floor), RESIDUAL, None) for r in residuals]


# units of round-off a Ritz value carries: a product's entries are sums of many rounded terms,
# so its error is several eps·‖H‖, not one. Users' reports: a 75-parameter float32 MLP's λ1 was
# 1.0·eps·|λ| off the float64 truth, a 610-parameter one's 9·eps·|λ| (k = 5, a bound at 4 units
# 2.3× short). Over 96 float32 runs of four small models (k = 1, 3, 5, against dense float64
# Hessians of the same rounded weights) the error reached 9·eps·|λ|: 16 units leave a margin.
# The measured asymmetry of QᵀHQ is no better guide: on a float32 ResNet-18 it was 2e-4·|λ|
# (dot products over 11M entries) where λ1 agreed with a float64 run's Ritz value to 3e-6.
ROUNDOFF_UNITS = 16
# units per unit of the largest |logit| M, for a softmax loss. The curvature's shares
# exp(z_j − z_m) move by δ(z_j − z_m) relative, and each float32 logit is off by its storage's
# eps/2·|z| plus the last layer's rounded sum, about as much again: to first order ≤ 2·eps·M,
# and the operator's eigenvalues with the shares. A stranger's float32 CNN at loss 5e-8 (M = 137)
# had λ1 off the float64 truth by 88·eps·|λ| = 0.64·eps·M·|λ|, 5.5× the 16-unit floor; over 250
# runs of small MLPs and CNNs with M from 40 to 230 (losses 1e-5 to 1e-20) the error reached
# 0.65·eps·M·|λ|, so 2 leaves a 3× margin (tests/linalg/test_logit_roundoff.py).
LOGIT_UNITS = 2.0


# A float32 run's products checked against float64 ones (api._check_products: one random vector,
# 8 samples): their relative error ρ, in units of eps. Some models' derivatives cancel inside
# the products themselves: torch takes tanh's derivative as 1 − y² from the rounded output y, so
# a unit saturated at |a| ~ 10 (true derivative ~1e-8) gets one of about ±eps. A stranger's
# diverged tanh MLP (lr 2.0, loss 21, every second-layer unit past |a| = 5, samples confidently
# wrong) had ρ = 4.3e4 and λ1 off its float64 truth by 7.7e3·eps·|λ1|, 13× its bound; neither its
# logits (max |z| 23) nor the loss (the pivoted loss does not cancel) showed it. Past
# PRODUCT_TRUSTED the floor is PRODUCT_UNITS·ρ·eps·‖H‖: over 40 steps of that training run no
# bound missed (worst error/bound 0.50; 1 miss before), and the test's model went from 5-33×
# outside on 8/8 seeds to 0.07 (tests/linalg/test_float32_cancellation.py). Healthy float32
# models measure ρ of 2.5-16 (trained tanh, sigmoid, GELU, ELU MLPs; ResNet-18, VGG at init):
# at or below PRODUCT_TRUSTED the check changes nothing.
PRODUCT_TRUSTED = 256
PRODUCT_UNITS = 2.0


def product_units(product_error: float = 0.0) -> float:
    """The floor's units that a measured product error ρ (units of eps; 0: none measured or
    within PRODUCT_TRUSTED) asks for."""
    return PRODUCT_UNITS * product_error if product_error > PRODUCT_TRUSTED else 0.0


def roundoff_units(max_abs_logit: float = 0.0, product_error: float = 0.0) -> float:
    """The floor's units of eps·‖H‖: ROUNDOFF_UNITS, or LOGIT_UNITS·M where the largest |logit|
    M of a softmax loss makes the logits' own rounding the larger (0: none measured), or
    product_units(ρ) where the float32 products' measured error ρ is larger still."""
    return max(float(ROUNDOFF_UNITS), LOGIT_UNITS * max_abs_logit, product_units(product_error))


def round_off_floor(op, scale: float) -> float:
    """units·eps·‖H‖ (‖H‖ ≥ `scale`: the largest |α|, |β|, Ritz value or projection entry
    seen): the products' own round-off and the logits', below which no bound goes. The units
    are the operator's `roundoff_units` (flatcheck.operators.CurvatureOperator), ROUNDOFF_UNITS
    for one without (a dense test matrix); eps is its dtype's."""
    import torch

    return getattr(op, "roundoff_units", ROUNDOFF_UNITS) * torch.finfo(op.dtype).eps * scale

