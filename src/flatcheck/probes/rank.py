"""Rank: rank degeneracy at the origin from SLQ nodes, beside two rank bounds.

"SLQ resolution". With m nodes t_1 < … < t_m and weights w_j, the Chebyshev–Markov–Stieltjes
inequalities bound the spectral measure μ_v seen from a start vector v:
Σ_{j<k} w_j ≤ μ_v((−∞, t_k)) and μ_v((−∞, t_k]) ≤ Σ_{j≤k} w_j. For the origin node(s)
t_a … t_b (a = b for the GGN; the two nodes nearest 0 for the Hessian) this gives

    μ_v({0}) ≤ w_a + … + w_b ≤ μ_v((t_{a−1}, t_{b+1}))

(the left inequality when 0 lies in [t_a, t_b], or below t_1 = t_a, or above t_m = t_b). So
the reported mass is at least the null space's share and at most the share of every
eigenvalue strictly inside the window (t_{a−1}, t_{b+1}), t_0 = −∞, t_{m+1} = +∞: SLQ cannot
tell eigenvalue 0 from eigenvalues inside that window. The window over all start vectors,
and its half-width (the largest |end|; for the positive semi-definite GGN the upper end
alone), is reported as the resolution. Averaged over Rademacher start vectors, μ_v is the
eigenvalue counting measure / P, so

    (P − rank)/P ≤ E[degeneracy] ≤ #{λ_i inside the window}/P.

When a start vector's Krylov space is invariant (Lanczos breakdown, e.g. m > rank(G) + 1)
the rule is exact: the origin node is 0 up to round-off, its neighbour the smallest non-zero
eigenvalue v sees, and both ends of the bracket coincide.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch
from torch import nn

from ..linalg.slq import Quadrature, mean_stderr
from ..operators import CurvatureOperator
from ..report.result import ProbeResult
from ..backends.base import GGNVp, Hvp, Outputs
from .gating import Gating
from .registry import ProbeContext, register_probe
from .kit import finer_dtype, option
from ._memory import memory_note
from .spectrum import (budget_cut, budget_unresolved, check_slq_options, lanczos_steps_option, plan_slq,
                       reorth_note, reorth_option, rough_note, run_slq, starts_option, stop_reason)

NEURON_RULE = (
    "Σ N_l = Σ out_features of every Linear + Σ out_channels of every Conv (one neuron per channel, "
    "not per position: 001's VGG-16 count 13,416 = 4,224 conv channels + 4,096 + 4,096 + 1,000); "
    "d_x = input positions per channel (H·W; 32×32 = 1,024 for CIFAR), or the input size for flat inputs"
)
# a window wider than this share of the spectral norm means the origin is not resolved
RESOLUTION_WARNING = 0.01


@dataclass(frozen=True)
class RankOptions:
    matrix: Literal["ggn", "hessian"] = option("ggn", "ggn or hessian")
    lanczos_steps: int = lanczos_steps_option()
    starts: int = starts_option()
    reorth: Literal["auto", "full", "none"] = reorth_option()

    def __post_init__(self):
        check_slq_options(self.lanczos_steps, self.starts)


@dataclass(frozen=True)
class OriginMass:
    weight: float
    location: float  # weighted mean of the origin nodes
    window: tuple[float, float]  # (t_{a−1}, t_{b+1})
    lower_bound_holds: bool  # 0 lies where the null space's share is ≤ weight


def origin_mass(rule: Quadrature, nodes_at_origin: int, zero_tol: float) -> OriginMass:
    """The mass of the `nodes_at_origin` adjacent nodes nearest 0 (adjacent: the set of the
    n points nearest any x on a line is contiguous in sorted order), widened to every
    neighbouring node within `zero_tol` of 0.

    Nodes that close to 0 cannot be told from it: a Lanczos step taken on a residual just
    above the breakdown threshold adds a round-off direction whose node lands beside the
    true origin node with almost no weight, and the nearest node alone would then miss the
    null space's mass. The bracket holds for any contiguous block of nodes around 0.
    """
    t, w = rule.nodes, rule.weights
    m = len(t)
    n = min(nodes_at_origin, m)
    nearest = sorted(np.argsort(np.abs(t), kind="stable")[:n])
    a, b = int(nearest[0]), int(nearest[-1])
    while a > 0 and abs(t[a - 1]) <= zero_tol:
        a -= 1
    while b + 1 < m and abs(t[b + 1]) <= zero_tol:
        b += 1
    weight = float(w[a : b + 1].sum())
    location = float((w[a : b + 1] * t[a : b + 1]).sum() / weight) if weight > 0 else float(t[a])
    lo = float(t[a - 1]) if a > 0 else -math.inf
    hi = float(t[b + 1]) if b + 1 < m else math.inf
    holds = (t[a] - zero_tol <= 0 <= t[b] + zero_tol) or (a == 0 and t[a] >= 0) or (b == m - 1 and t[b] <= 0)
    return OriginMass(weight, location, (lo, hi), bool(holds))


def count_neurons(model: nn.Module) -> int:
    total = 0
    for module in model.modules():
        if isinstance(module, nn.Linear):
            total += module.out_features
        elif isinstance(module, nn.modules.conv._ConvNd):
            total += module.out_channels
    return total


def input_positions(sample_shape: tuple[int, ...]) -> int:
    if len(sample_shape) >= 2:
        return math.prod(sample_shape[1:])
    return math.prod(sample_shape)


def output_hessian_rank(loss: str, classes: int) -> int:
    # softmax cross-entropy: A = diag(p) − ppᵀ annihilates the all-ones vector
    return classes - 1 if loss in ("cross_entropy", "label_smoothing") else classes


def num_classes(ctx: ProbeContext) -> int:
    if ctx.spec is not None and ctx.spec.num_classes:
        return int(ctx.spec.num_classes)
    outputs = iter(ctx.backend.outputs())
    try:
        logits, _, _ = next(outputs)
    finally:
        # a generator left suspended would keep the backend's model mode (BN switches) set
        close = getattr(outputs, "close", None)
        if close is not None:
            close()
    return int(logits.shape[-1])


@register_probe
class RankProbe:
    """Rank degeneracy D at the origin (Granziol 2020 §3.2, App. D): the SLQ weight of the node
    nearest 0 (GGN), or of the two nodes nearest 0 combined (Hessian; their weighted mean is
    the location), averaged over start vectors with its standard error. Reported beside the
    paper's bound D ≥ 1 − 4·C·(Σ_l N_l + d_x)/P (neurons counted by NEURON_RULE, printed in
    the details) and the batch bound rank(G) ≤ N·r_A, i.e. D ≥ 1 − N·r_A/P, with r_A the rank
    of the output-space loss Hessian (C − 1 for softmax cross-entropy, C for the MSE losses);
    the batch bound holds for G only.

    SLQ resolution: D is at least the null space's share of the spectrum and at most the
    share of all eigenvalues strictly between the neighbours of the origin node(s), the
    "window" (module docstring: Chebyshev–Markov–Stieltjes). The resolution is the window's
    half-width: eigenvalues smaller than it cannot be told from 0 with this many steps.
    The reported standard error is the larger of the statistical one (over start vectors,
    at least sampling_stderr_bound) and half the width of the bracket in which the null
    space's share is known to lie (null_share_bracket),
    so that value ± 2·stderr, the interval gates and tables use, does not claim a precision
    the resolution cannot give.

    A rule --budget cut short is unresolved (details.unresolved_reason): with fewer nodes the
    window is wider, so D is another quantity than a full run's, which no gate may compare.

    Warnings: when N samples alone force at least the degeneracy the architecture does (D
    then describes the sample set, not the model), and when the resolution exceeds 1 % of
    the largest |node| (or is unbounded) so that the origin is not singled out.
    """

    name: ClassVar[str] = "rank"
    # every field is an average over the same few start vectors: t with their dof; a rerun raises them
    gating: ClassVar[Gating] = Gating(effort_option="starts", every_field_shares_draws=True)
    summary: ClassVar[str] = "rank degeneracy at the origin (SLQ) beside the rank bounds"
    Options: ClassVar[type] = RankOptions
    requires: ClassVar[frozenset[type]] = frozenset({Hvp, GGNVp, Outputs})
    command_help: ClassVar[str] = "Rank degeneracy at the origin (SLQ) beside the paper's and the batch rank bounds."

    def run(self, ctx: ProbeContext, options: RankOptions) -> ProbeResult:
        op = CurvatureOperator(ctx.backend, options.matrix)
        start = time.perf_counter()
        memory = plan_slq(ctx, op, options.lanczos_steps, "rank (SLQ)", options.reorth)
        result = run_slq(ctx, op, options.lanczos_steps, options.starts, "rank (SLQ)", memory)
        problem = ctx.backend.problem
        P, N = op.dim, problem.samples.n
        ggn = options.matrix == "ggn"
        spectral = max(abs(result.nodes_min), abs(result.nodes_max))
        zero_tol = math.sqrt(torch.finfo(op.dtype).eps) * spectral
        masses = [origin_mass(r, 1 if ggn else 2, zero_tol) for r in result.rules]
        degeneracy, spread = mean_stderr(np.array([m.weight for m in masses]))
        floor = sampling_stderr_bound(degeneracy, P=op.dim, starts=len(masses))
        statistical = max(spread, floor)
        lo = min(m.window[0] for m in masses)
        hi = max(m.window[1] for m in masses)
        resolution = hi if ggn else max(-lo, hi)

        C = num_classes(ctx)
        neurons = count_neurons(problem.model)
        sample_shape = tuple(getattr(problem.samples, "sample_shape", ()) or ())
        d_x = input_positions(sample_shape) if sample_shape else None
        paper_rank = 4 * C * (neurons + d_x) if d_x is not None else None
        paper_bound = 1 - paper_rank / P if paper_rank is not None else None
        r_A = output_hessian_rank(problem.loss.name, C)
        batch_rank = min(N * r_A, P)
        batch_bound = 1 - batch_rank / P

        closed = all(r.invariant for r in result.rules)
        # a breakdown is taken at β ≤ √eps·‖T‖, which in float32 can be a residual left in
        # eigenvalues far above round-off but too small to resolve: the rule is then a Gauss
        # rule cut short, not an exact one, and its origin node sits visibly off 0
        roundoff = torch.finfo(op.dtype).eps * spectral * max(max(r.steps for r in result.rules), math.sqrt(P))
        off_zero = max(abs(m.location) for m in masses)
        bracket = null_share_bracket(degeneracy, closed and off_zero <= roundoff,
                                     batch_bound if ggn else None,
                                     lumped=off_zero if closed and off_zero > roundoff else None,
                                     finer=finer_dtype(op.dtype))
        stderr = max(statistical, bracket.half_width)

        cut = budget_cut(result, options.lanczos_steps)
        unresolved = budget_unresolved(
            result, options.lanczos_steps, "single out the origin (the window around 0 is as wide as the nodes "
            "left it), so D is not the degeneracy a full run measures")
        warnings = _warnings(ggn, N, P, r_A, batch_bound, paper_bound, resolution, spectral,
                             _more_steps(options.lanczos_steps, cut), all(m.lower_bound_holds for m in masses))

        bn_mode = problem.bn_mode
        symbol = "G" if ggn else "H"
        location = float(np.mean([m.location for m in masses]))
        notes = (f"null-space share in [{bracket.low:.4g}, {bracket.high:.4g}] ({bracket.source}); "
                 f"at λ ≈ {location:.3g} (resolution {resolution:.3g}); paper bound "
                 f"{_fmt_bound(paper_bound)}, batch bound {batch_bound:.4g}{'' if ggn else ' (for G)'}; "
                 f"{options.starts} starts × {max(r.steps for r in result.rules)} steps; bn {bn_mode}")
        notes += rough_note(len(result.rules))
        if unresolved is not None:
            notes += f"; UNRESOLVED: {unresolved}"
        notes += memory_note(memory) + reorth_note(memory)
        if warnings:
            notes += "; WARNING: " + " | ".join(warnings)
        return ProbeResult(
            probe=self.name,
            value=degeneracy,
            stderr=stderr,
            # a spread over the start vectors: Student's t with starts − 1 degrees of freedom
            dof=len(result.rules) - 1,
            matvecs=op.matvecs,
            seconds=time.perf_counter() - start,
            seed=ctx.seed,
            label=f"degeneracy D({symbol})",
            notes=notes,
            resolved=unresolved is None,
            details={
                "matrix": options.matrix,
                "bn_mode": bn_mode,
                "parameters": P,
                "samples": N,
                "classes": C,
                "lanczos_steps": options.lanczos_steps,
                "starts": options.starts,
                "steps_taken": [r.steps for r in result.rules],
                "stop_reason": stop_reason(result),
                "origin_nodes": 1 if ggn else 2,
                "degeneracy": {"value": degeneracy, "stderr": stderr},
                "statistical_stderr": statistical,
                "statistical_stderr_parts": {
                    "spread": spread, "bound": floor,
                    "meaning": "the larger of the spread over start vectors and the bound √(2·D(1−D)/(starts·P)) "
                               "on a Rademacher quadratic form's sampling error for a projector's share D: "
                               "a few starts can agree by chance (a structured null space gives discrete "
                               "shares), and their spread is then 0"},
                "bracket": {"low": bracket.low, "high": bracket.high, "half_width": bracket.half_width,
                            "source": bracket.source,
                            "meaning": "the start vectors' null-space share lies between low and high, the "
                                       "null space's share P − rank over P within statistical_stderr of it; the "
                                       "stderr is at least half the width, so value ± 2·stderr covers it"},
                "location": location,
                "window": [lo, hi],
                "resolution": resolution,
                "resolution_meaning": "D lies between the null space's share and the share of eigenvalues "
                                      "strictly inside the window (Chebyshev–Markov–Stieltjes)",
                "per_start": [
                    {"weight": m.weight, "location": m.location, "window": list(m.window),
                     "lower_bound_holds": m.lower_bound_holds, "invariant": r.invariant, "steps": r.steps}
                    for m, r in zip(masses, result.rules)
                ],
                "paper_bound": {
                    "value": paper_bound,
                    "rank": paper_rank,
                    "neurons": neurons,
                    "d_x": d_x,
                    "formula": "1 − 4·C·(Σ N_l + d_x)/P",
                    "rule": NEURON_RULE,
                    "vacuous": paper_bound is not None and paper_bound <= 0,
                },
                "batch_bound": {
                    "value": batch_bound,
                    "rank": batch_rank,
                    "output_hessian_rank": r_A,
                    "formula": f"1 − N·r_A/P with r_A = {'C − 1' if r_A == C - 1 else 'C'} ({problem.loss.name})",
                    "applies_to": "G (the Hessian has no such bound)",
                },
                "spectral_norm": spectral,
                "warnings": warnings,
                **({"unresolved_reason": unresolved} if unresolved is not None else {}),
                "memory": memory,
            },
        )


@dataclass(frozen=True)
class Bracket:
    low: float
    high: float
    source: str  # where the low end comes from

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def null_share_bracket(degeneracy: float, exact: bool, rank_floor: float | None,
                       lumped: float | None = None, finer: str | None = None) -> Bracket:
    """Where the null space's share (P − rank)/P lies, given the origin weight D.

    D is its upper end (module docstring: each weight is at least μ_v({0})). SLQ gives no
    lower end: eigenvalues below the resolution weigh in the origin node just as zeros do,
    and moments cannot tell them apart (on a tanh MLP at N = 64, 40 steps: D = 0.810 where
    the share is 0.732). The low end is D itself only when every Krylov space closed with
    its origin node at 0 within round-off (the rule is then exact), else a rank bound that
    holds whatever the spectrum (G: the batch bound), else 0. `lumped`: the origin node's
    distance from 0 when the spaces closed at the breakdown threshold but off 0 (float32 on
    a spectrum that decays below √eps·‖G‖); `finer`, the flag of a dtype that resolves more
    (kit.finer_dtype; None in float64). Statistics can put D below the rank bound; the
    bracket is then empty."""
    if exact:
        return Bracket(degeneracy, degeneracy, "exact: every start's Krylov space closed at 0")
    why = ("" if lumped is None else
           f"the Krylov spaces closed at the breakdown threshold with the origin node at λ ≈ {lumped:.3g}, above "
           f"round-off, so it holds eigenvalues too small to resolve in this dtype"
           f"{f' ({finer} resolves smaller ones)' if finer else ''}; ")
    if rank_floor is not None and rank_floor > 0:
        return Bracket(min(rank_floor, degeneracy), degeneracy, why + "low end: the batch bound")
    return Bracket(0.0, degeneracy, why + "no lower bound: SLQ cannot tell eigenvalues below its resolution from 0")


def sampling_stderr_bound(share: float, *, P: int, starts: int) -> float:
    """A bound on the standard error of the mean of `starts` origin weights.

    A weight is a Rademacher quadratic form vᵀΠv/P of the spectral projector Π onto the
    origin node's eigenvalues, whose variance is 2(‖Π‖_F² − Σ Π_ii²)/P². For a projector
    ‖Π‖_F² = tr Π = D·P, and Σ Π_ii² ≥ (tr Π)²/P (Cauchy–Schwarz), so it is at most
    2·D(1 − D)/P, with D the share, estimated by the mean weight."""
    d = min(max(share, 0.0), 1.0)
    return math.sqrt(2 * d * (1 - d) / (P * starts))


def _more_steps(asked: int, cut: str | None) -> str:
    """How to get more nodes: more steps asked for, or, where --budget cut them, more time."""
    if cut is None:
        return f"raise --lanczos-steps (now {asked})"
    return f"{cut}: raise --budget, or lower --starts"


def _warnings(ggn: bool, N: int, P: int, r_A: int, batch_bound: float, paper_bound: float | None,
              resolution: float, spectral: float, more_steps: str, lower_bound_holds: bool) -> list[str]:
    out = []
    if ggn and batch_bound > 0 and (paper_bound is None or batch_bound >= paper_bound):
        out.append(
            f"the {N} samples alone force D ≥ {batch_bound:.4g} (rank(G) ≤ N·{r_A} = {N * r_A:,} < P = {P:,}), "
            f"at least the architecture's bound: D describes the sample set, not the model; "
            f"use --samples ≥ {math.ceil(P / r_A):,} for a measurement of the model")
    if not math.isfinite(resolution):
        out.append(f"SLQ resolution is unbounded (an origin node is an extreme node): {more_steps}")
    elif resolution > RESOLUTION_WARNING * spectral:
        out.append(f"SLQ resolution {resolution:.3g} is {resolution / spectral:.2g}× the largest |node|: eigenvalues "
                   f"that far from 0 cannot be told from it; {more_steps}")
    if not lower_bound_holds:
        out.append("in some start vectors the origin nodes do not bracket 0, so D may miss null-space mass")
    return out


def _fmt_bound(b: float | None) -> str:
    if b is None:
        return "n/a"
    return f"{b:.4g}" + (" (vacuous)" if b <= 0 else "")
