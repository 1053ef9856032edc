"""Stochastic trace estimators: Hutchinson (with a standard-error stopping rule) and Hutch++.

Both take any operator with `matmat((k, P)) -> (k, P)`, `dim`, `dtype`, `device`, and an
optional `split` that sums a (k, P) block within parameter groups, which yields a
per-group (per-layer) breakdown whose parts add up to the total exactly.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

import torch
from torch import Tensor

from .forecast import stderr_forecast
from .random import rademacher, rademacher_signs
from .reduce import rowsum64

Split = Callable[[Tensor], dict[str, Tensor]]
# (done, total, *, value=None, stderr=None): value/stderr are the running estimate, where there is one
Progress = Callable[..., None]
StopTest = Callable[[], bool]  # true once the caller's budget is spent


@runtime_checkable
class Operator(Protocol):
    """A symmetric linear operator the estimators take. `matmat(V)` ((k, P) → (k, P)) returns
    a new tensor the caller owns: not V, not a view of it, not a buffer the operator reuses
    across calls, and V is left as it was. The estimators rely on it to save P-sized copies:
    block Lanczos keeps the product as the storage of its next basis rows and writes its
    leftovers over it, and Hutch++ forms its per-entry products in place."""

    dim: int
    dtype: torch.dtype
    device: torch.device
    matvecs: int  # matrix-vector products made so far; estimators report their own share

    def matmat(self, V: Tensor) -> Tensor: ...


@runtime_checkable
class StreamsTotals(Protocol):
    """An operator that may give vᵀAv for a block of ±1 int8 signs without a (k, P) product:
    `quadratic(S)` → ((k,) float64, {}), where `streams_total` (it depends on the matrix and
    the backend, so it is a flag, not only the method)."""

    streams_total: bool

    def quadratic(self, S: Tensor, split: Split | None = None) -> tuple[Tensor, dict]: ...


def form_cost(op: Operator) -> float:
    """What one vᵀAv of `op.quadratic` (without parts) is expected to cost over one product of
    `op.matmat`, where the operator says (`form_cost`); a product's otherwise."""
    return float(getattr(op, "form_cost", 1.0))


@runtime_checkable
class StreamsParts(Protocol):
    """As StreamsTotals, with the per-group parts of `split` as well (`quadratic(S, split)`),
    where `streams_quadratic`."""

    streams_quadratic: bool

    def quadratic(self, S: Tensor, split: Split | None = None) -> tuple[Tensor, dict]: ...


@dataclass(frozen=True)
class TraceEstimate:
    """value = offset + mean(samples): `samples` are the per-probe values the standard error is
    the spread of (Hutchinson: every vᵀAv; Hutch++: the residual's gᵀAg), `offset` the part
    known without sampling error given the draw (Hutch++: Tr(QᵀAQ)). Kept so that two runs
    with the same probes can be compared probe by probe (a paired test; see flatcheck.gate)."""

    value: float
    stderr: float | None  # None only when fewer than two probe values exist
    matvecs: int
    # random probe vectors drawn; Hutch++ draws k for its sketch and k for its residual part,
    # and only the residual's k are `samples` (the sketch's part is the exact `offset`)
    probes: int
    stop_reason: str
    groups: dict[str, tuple[float, float | None]] = field(default_factory=dict)
    samples: tuple[float, ...] = ()
    offset: float = 0.0
    # Hutchinson where the products were formed: the standard error from the estimator's own
    # variance (ProductVariance); `stderr` is then the larger of it and the values' spread
    known_stderr: float | None = None
    # which interval value ± q·stderr is (q: Student's t on `dof`, or normal where dof is None):
    # INTERVAL_FLOOR, INTERVAL_SKEW (Hutchinson), or "t" (Hutch++: the residual's spread)
    interval: str = "t"
    spread_stderr: float | None = None  # the values' standard deviation over √m, unwidened
    skewness: float | None = None  # the values' adjusted sample skewness G1 (INTERVAL_SKEW)

    @property
    def dof(self) -> int | None:
        """Degrees of freedom of `stderr` where it is a sample standard deviation over
        len(samples) (Student's t); None where the products' variance bounds it (a normal
        interval: that variance is not an m − 1 dof sample variance)."""
        if self.known_stderr is not None:
            return None
        return len(self.samples) - 1 if len(self.samples) >= 2 else None


# the interval a Hutchinson estimate's (stderr, dof) stand for (TraceEstimate.interval)
INTERVAL_FLOOR = "normal_product_variance_floor"
INTERVAL_SKEW = "t_skewness_enclosure"
Z95 = 1.959963984540054  # Φ⁻¹(0.975): the two-sided 95 % normal quantile
# the one-sided Cornish–Fisher term of the studentized mean at the two-sided 95 % level,
# (2z² + 1)/6 with z = Z95 (Johnson 1978; Hall 1992, §3.5)
SKEW_TERM = (2 * Z95**2 + 1) / 6


def skewness(values: Tensor) -> float | None:
    """The adjusted sample skewness G1 = g1·√(m(m − 1))/(m − 2) of the values; None below
    three values or with no spread."""
    m = values.shape[0]
    if m < 3:
        return None
    x = values.to(torch.float64)
    centred = x - x.mean()
    m2, m3 = centred.pow(2).mean().item(), centred.pow(3).mean().item()
    if not m2 > 0:
        return None
    return m3 / m2**1.5 * math.sqrt(m * (m - 1)) / (m - 2)


def skew_widening(values: Tensor, normal: bool = False) -> float:
    """The factor on the spread's standard error s = std/√m that makes value ± q·(factor·s)
    (q: Student's t on m − 1 dof, or the normal quantile where `normal`) the symmetric
    enclosure of the skewness-corrected 95 % interval of the mean.

    vᵀAv over Rademacher v is a weighted sum of squares: where a few eigenvalues of A dominate
    ‖A‖_F it is skewed (|skewness| up to 2√2), and a sample that missed the long tail has a low
    mean and a small spread together, so the t interval covers less than it says (about 93 % for
    95 % at m = 10–50 on small networks' Hessians). The studentized mean's quantiles shift by
    G1·(2z² + 1)/(6√m) at first order (Cornish–Fisher): the equal-tailed corrected interval is
    x̄ − s·(±t + that shift); its symmetric enclosure, x̄ ± s·(t + |G1|·(2z² + 1)/(6√m)), is what
    a gate reads as value ± q·stderr. Symmetric values (G1 ≈ 0) keep the t interval. Where one
    eigenvalue carries nearly all of ‖A‖_F² few values rarely show the tail, and it still
    covers less than it says (A of rank one: 90 % at m = 10, 93 % at m = 20, 95 % at m = 50,
    where t gave 86, 89 and 92 %); products (ProductVariance) bound that case."""
    m = values.shape[0]
    g1 = skewness(values)
    if g1 is None and not normal:  # the t interval itself (q/q): no quantile, no scipy import
        return 1.0
    # scipy.stats' t.ppf and norm.ppf, bit for bit, for a tenth of scipy.stats' import (half
    # of import torch's), which a short run would pay
    from scipy.special import ndtri, stdtrit

    q = float(stdtrit(m - 1, 0.975))
    half = q + (abs(g1) * SKEW_TERM / math.sqrt(m) if g1 is not None else 0.0)
    return half / (float(ndtri(0.975)) if normal else q)


class ProductVariance:
    """Var(vᵀAv) = 2(‖A‖_F² − Σ_i A_ii²) for a Rademacher v (Hutchinson 1989), estimated from
    the products: ‖v ⊙ Av‖² = ‖Av‖² is unbiased for ‖A‖_F², and ⟨v ⊙ Av, v' ⊙ Av'⟩ over pairs
    of independent probes for Σ_i A_ii². When a few eigenvalues dominate, the m values vᵀAv are
    skewed and their spread is small exactly when their mean is low: a t interval from it then
    covers less than it says at small m (about 90 % for 95 % at m = 10 on a small CNN's GGN).
    These sums of P squares track the true variance far more steadily. One running P-vector."""

    def __init__(self, dim: int, dtype: torch.dtype, device):
        self.total = torch.zeros(dim, dtype=dtype, device=device)
        self.squares = 0.0
        self.count = 0

    def add(self, prod: Tensor) -> None:
        """Rows v ⊙ Av of a block."""
        self.squares += rowsum64(prod * prod).sum().item()
        self.total += prod.sum(0)
        self.count += prod.shape[0]

    def stderr(self) -> float | None:
        m = self.count
        if m < 2:
            return None
        frob = self.squares / m
        diag = (rowsum64((self.total * self.total).unsqueeze(0))[0].item() - self.squares) / (m * (m - 1))
        return math.sqrt(2 * max(frob - diag, 0.0) / m)


BLOCK_BYTES = 64 * 2**20  # memory for one (k, P) block of probes when no block size is given
MAX_BLOCK = 8


def auto_block(dim: int, dtype: torch.dtype) -> int:
    """Probes per block: as many vectors of `dtype` as fit BLOCK_BYTES, between 1 and MAX_BLOCK.

    A block shares each batch's forward (and gradient) across its vectors. Given as
    floats with their product, a block holds 2·k·P numbers: for an 11M-parameter
    ResNet-18 a block of 8 would hold 700 MB where one vector at a time needs 90 MB, as
    PyHessian does, so large models get 1. An operator that streams vᵀAv (the autograd
    backend's Hessian) needs only the block's int8 signs and one float vector at a
    time: 5 probes per block for ResNet-18, 8 for the demo.
    """
    per_vector = dim * dtype.itemsize
    return max(1, min(MAX_BLOCK, BLOCK_BYTES // max(per_vector, 1)))


def _streams(op: Operator, parts: bool) -> bool:
    """Whether `op.quadratic` gives vᵀAv (with per-group parts if `parts`) without a (k, P) product."""
    if parts:
        return isinstance(op, StreamsParts) and op.streams_quadratic
    return isinstance(op, StreamsTotals) and op.streams_total


def default_block(op: Operator, parts: bool = True) -> int:
    """hutchinson's block size when none is given (see auto_block); `parts`: whether the
    per-group parts are asked for."""
    if _streams(op, parts):
        return auto_block(op.dim, torch.int8)  # a streamed block holds only its int8 signs
    return auto_block(op.dim, op.dtype)


def _mean_stderr(values: Tensor, variance: "ProductVariance | None" = None,
                 widen: bool = False, normal: bool = False) -> tuple[float, float | None]:
    """The mean and its standard error: the values' spread, or, given the products' variance,
    the larger of the two. `widen`: the spread times skew_widening (`normal`: for a normal
    quantile), where no products' variance is given."""
    m = values.shape[0]
    mean = values.mean().item()
    if m < 2:
        return mean, None
    spread = values.std(unbiased=True).item() / math.sqrt(m)
    known = variance.stderr() if variance is not None else None
    if known is None and not widen:
        return mean, spread
    return mean, interval_stderr(spread, values, known, normal)


def interval_stderr(spread: float, values: "Tensor | None", known: float | None = None, normal: bool = False) -> float:
    """A Hutchinson stderr from its values' spread s = std/√m: the larger of s and the products'
    own stderr `known` where the products were formed (INTERVAL_FLOOR; `values` unused), else s times
    skew_widening (INTERVAL_SKEW). A gate checks a baseline's stderr against it."""
    if known is not None:
        return max(spread, known)
    return spread * skew_widening(values, normal)


def hutchinson(
    op: Operator,
    *,
    generator: torch.Generator,
    max_probes: int,
    rtol: float | None = None,
    min_probes: int = 10,
    block_size: int | None = None,
    split: Split | None = None,
    progress: Progress | None = None,
    should_stop: StopTest | None = None,
    rows: int | None = None,
    time_left: Callable[[], float] | None = None,
) -> TraceEstimate:
    """Tr(A) ≈ (1/m) Σ v_kᵀ A v_k with Rademacher v_k.

    `rows` (plan_block): products are taken that many vectors at a time within a block, a
    memory bound that changes no value (the draws and the stopping rule stay per block).

    Stops after `max_probes`, or earlier once at least `min_probes` values give
    stderr/|mean| < rtol; the standard error is the sample standard deviation of the
    per-probe values over √m, so the rule is a statistical one, not a change threshold.
    `should_stop` (a budget) ends it after any block once two probes give a standard error
    (stop_reason "budget"); the estimate is then that of the probes drawn, unbiased as any.
    With `time_left()` (seconds of that budget) the blocks are sized so it can end on time: the
    first holds two probes, which times a probe, each later one what the time left takes at
    that rate (at most the block size), so a budget is overrun by about a probe, not a block.
    The draws do not depend on the block sizes, so neither do the values.
    """
    values: list[Tensor] = []
    parts: dict[str, list[Tensor]] = {}
    done, reason = 0, "max_probes"
    streams = _streams(op, parts=split is not None)
    # a streamed block gives vᵀAv alone, summed over batches: no product to take the variance from
    variance = None if streams else ProductVariance(op.dim, op.dtype, op.device)
    block = block_size or default_block(op, parts=split is not None)
    per_probe = None
    # the progress line's total: the probes the rtol rule forecasts (linalg/forecast.py), not
    # max_probes, once a standard error exists
    total = max_probes if rtol is None else 0
    while done < max_probes:
        k = min(block, max_probes - done)
        if time_left is not None:
            k = min(k, 2 if per_probe is None else max(1, int(time_left() / per_probe)))
        started = time.monotonic()
        if streams:
            S = rademacher_signs(k, op.dim, generator, device=op.device)
            vals, pieces = op.quadratic(S, split)
        else:
            # the block's draws at once (int8, as rademacher draws them), its products `rows`
            # vectors at a time: the values are those of the whole block
            S = rademacher_signs(k, op.dim, generator, device="cpu")
            within = None if progress is None else (
                lambda n, done=done, k=k: progress(done + n, max(total, done + k) if total else 0))
            vals, pieces = _products(op, S, rows or k, split, variance, within)
        values.append(vals.cpu())
        per_probe = max(time.monotonic() - started, 1e-9) / k
        for name, v in pieces.items():
            parts.setdefault(name, []).append(v.to(torch.float64).cpu())
        done += k
        mean, se = _mean_stderr(torch.cat(values), variance, widen=True)
        if progress is not None:
            total = stderr_forecast(done, mean, se, rtol, min_probes, max_probes)
            progress(done, total, value=mean, stderr=se)
        if rtol is not None and done >= min_probes:
            if se is not None and mean != 0 and se / abs(mean) < rtol:
                reason = "rtol"
                break
        if should_stop is not None and done >= 2 and done < max_probes and should_stop():
            reason = "budget"
            break
    samples = torch.cat(values)
    known = variance.stderr() if variance is not None else None
    value, spread = _mean_stderr(samples)
    stderr = None if spread is None else interval_stderr(spread, samples, known)
    # the parts share the total's dof (a gate reads theirs from it): normal where it floors
    groups = {name: _mean_stderr(torch.cat(v), widen=True, normal=known is not None) for name, v in parts.items()}
    return TraceEstimate(value, stderr, done, done, reason, groups, tuple(samples.tolist()), known_stderr=known,
                         interval=INTERVAL_SKEW if known is None else INTERVAL_FLOOR, spread_stderr=spread,
                         skewness=skewness(samples))


def _products(op: Operator, S: Tensor, rows: int, split: Split | None,
              variance: ProductVariance | None = None,
              within: Callable[[int], None] | None = None) -> tuple[Tensor, dict]:
    """vᵀAv and the parts of v ⊙ Av for the rows v of the ±1 block S, `rows` at a time (and
    v ⊙ Av into `variance`); `within(rows done)` after each but the last, so a block of slow
    products shows its count as it goes."""
    vals, pieces = [], {}
    for i in range(0, S.shape[0], rows):
        V = S[i:i + rows].to(dtype=op.dtype, device=op.device)
        prod = op.matmat(V).mul_(V)
        vals.append(rowsum64(prod))
        if variance is not None:
            variance.add(prod)
        for name, part in (split(prod) if split is not None else {}).items():
            pieces.setdefault(name, []).append(part)
        del V, prod
        if within is not None and i + rows < S.shape[0]:
            within(i + rows)
    return torch.cat(vals), {name: torch.cat(parts) for name, parts in pieces.items()}


# Hutch++ takes each third's products in about this many pieces when progress is shown, so a
# third of slow products is not one silent stretch (a line after each piece)
PIECES = 4


def _short_of(progress: Progress | None, total: int) -> Progress | None:
    """progress that leaves out the report of the last unit: that one carries the estimate."""
    if progress is None:
        return None
    return lambda done, _total: None if done >= total else progress(done, total)


def _in_pieces(apply: Callable[[Tensor], Tensor], M: Tensor, progress: Progress | None, done: int,
               total: int) -> Tensor:
    """apply(M) (rows of M → rows), in PIECES pieces of rows with progress(done + rows, total)
    after each; in one call when nothing listens. Each piece is written into one output as it
    comes: a list of pieces and their concatenation would hold the block twice."""
    if progress is None:
        return apply(M)
    step = max(1, -(-M.shape[0] // PIECES))
    out: Tensor | None = None
    for i in range(0, M.shape[0], step):
        piece = apply(M[i:i + step])
        if out is None:
            out = piece.new_empty((M.shape[0], *piece.shape[1:]))
        out[i:i + piece.shape[0]] = piece
        del piece
        progress(done + min(i + step, M.shape[0]), total)
    return out


# P-sized vectors beside a block: a streamed block's one float vector, its product and the
# product's pieces; a product's own per vector: the vector, its product and the backend's
# (k, P) temporaries (the GGN's pullback stacks its rows before flattening them)
STREAM_WORK = 4
ROW_WORK = 4


def plan_block(block: int | None, op: Operator, parts: bool, limit: int | None, what: str) -> tuple[int, int]:
    """(vectors per product, bytes held) for hutchinson's blocks of `block` probes (None: its
    default) with or without per-group `parts`, under `limit` bytes (None: no limit). A
    block's int8 signs are held whole; unstreamed products are taken as many vectors at a
    time as fit (values unchanged). Refuses (exit 2) up front when the block's signs and one
    vector's product cannot fit, naming the --block-size that would."""
    from .memory import most_that_fit, refuse_count

    streams = _streams(op, parts)
    block = block or default_block(op, parts)
    item = op.dtype.itemsize
    if streams:
        refuse_count(block, op.dim, STREAM_WORK * op.dim * item, limit, what, "--block-size")
        return block, block * op.dim + STREAM_WORK * op.dim * item
    per = ROW_WORK * op.dim * item
    fixed = block * op.dim + op.dim * item  # the signs, and ProductVariance's running sum
    rows = most_that_fit(per, fixed, limit)
    if rows is None:
        return block, fixed + block * per
    if rows < 1:
        refuse_count(block, op.dim, per, limit, what, "--block-size")
    rows = min(rows, block)
    return rows, fixed + rows * per


def hutchpp_columns(matvecs: int, dim: int | None) -> int:
    """Hutch++'s sketch columns k at `matvecs` products: a third of them, capped at the dimension
    P (when known), where the sketch spans the space and the trace is exact (hutchpp)."""
    k = matvecs // 3
    if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0:
        k = min(k, dim)
    return k


def hutchpp(
    op: Operator,
    *,
    generator: torch.Generator,
    matvecs: int,
    split: Split | None = None,
    progress: Progress | None = None,
    time_left: Callable[[], float] | None = None,
    pace: Callable[..., None] | None = None,
) -> TraceEstimate:
    """Hutch++ (Meyer, Musco, Musco, Woodruff 2021) with `matvecs` products, in thirds.

    `pace` (report/pulse.pace_changes, where given) tells a progress display about quadratic
    forms after the sketch's products: `pace(ahead=(k, cost))` before the sketch where a form
    is expected to cost less than a product (`form_cost`), so that its ETA prices them so, and
    `pace()` when they begin, so that it times them afresh.

    `time_left()` (seconds, a --budget) sizes the thirds: the sketch's first product is timed
    and k is cut to what three times k products take in the time left (at least 2; stop_reason
    "budget"). The estimator stays the same, with fewer vectors: Hutch++ cannot stop midway,
    since its residual probes are projected off the finished sketch.

    Tr(A) = Tr(QᵀAQ) + Tr(P⊥AP⊥) with Q an orthonormal basis of A·S; the first term is
    exact, the second is Hutchinson on projected probes. The standard error is that of
    the Hutchinson part given Q. A group's part (D its diagonal 0/1 mask) splits the same
    way with no cross term: Tr(DA) = Tr(DAQQᵀ) + Tr(DAP⊥), the first Σ_i q_iᵀDAq_i (exact:
    the entries of Q ⊙ AQ in the group), the second Tr(P⊥DAP⊥) by the cyclic property and
    P⊥² = P⊥ (Hutchinson: the entries of g ⊙ Ag in the group, g projected). So each part is
    unbiased for its group's diagonal block, and the parts sum to the total entry by entry.

    Without parts, only the sketch A·S needs products: Tr(QᵀAQ) and the residual's gᵀAg are
    quadratic forms, which an operator that streams them (`streams_total`) takes without one.

    k is capped at P = op.dim: a sketch of P columns gives a basis Q of the whole space (the
    QR's Householder Q is orthonormal and P × P even where A·S is rank-deficient), so Tr(QᵀAQ)
    is the exact trace and the residual probes project to zero. More columns only cost: on
    a 599-parameter CNN, --probes-max 3000 took 2,599 products for the value that 3·P = 1,797
    give to 1e-14. It takes 3·min(⌊matvecs/3⌋, P) products; stop_reason "exact" where k = P.
    """
    k = hutchpp_columns(matvecs, op.dim)
    if matvecs // 3 < 2:
        raise ValueError("Hutch++ needs at least 6 matrix-vector products")
    S = rademacher(k, op.dim, generator, dtype=op.dtype, device=op.device)
    forms = split is None and _streams(op, parts=False)
    # the last two thirds are quadratic forms; where each is a fraction of a sketch product (by
    # forward tangents), an ETA that priced them as products would be off by about half the time left
    cost = form_cost(op) if forms else 1.0
    announce = pace is not None and cost < 1.0
    stop_reason = "exact" if k == op.dim else "matvecs"
    if time_left is None:
        if announce:
            pace(ahead=(k, cost))
        AS = _in_pieces(op.matmat, S, progress, 0, 3 * k)
    else:
        started = time.monotonic()
        first = op.matmat(S[:1])
        per_product = max(time.monotonic() - started, 1e-9)
        fit = max(2, min(k, int((time_left() / per_product + 1) // 3)))
        if fit < k:
            k, S, stop_reason = fit, S[:fit], "budget"
        if announce:  # once k is what the budget leaves
            pace(ahead=(k, cost))
        AS = torch.cat([first, _in_pieces(op.matmat, S[1:], progress, 1, 3 * k)])  # k ≥ 2
        del first
    Q, _ = torch.linalg.qr(AS.T)  # (P, k)
    del AS, S  # the sketch's rows are done with: a (k, P) block each
    Q = Q.T.contiguous()  # rows are basis vectors
    # the residual's probes, drawn and projected before the forms begin, so that the forms run
    # back to back and a rate taken on the first of them holds for the rest
    G = rademacher(k, op.dim, generator, dtype=op.dtype, device=op.device)
    G.addmm_(G @ Q.T, Q, alpha=-1)
    if forms:
        if pace is not None:
            pace()  # timed afresh from here (on any route: a form is not a sketch product)
        head_values = _in_pieces(lambda M: op.quadratic(M)[0], Q, progress, k, 3 * k)
    else:
        AQ = _in_pieces(op.matmat, Q, progress, k, 3 * k)
    if forms:
        resid_values = _in_pieces(lambda M: op.quadratic(M)[0], G, _short_of(progress, 3 * k), 2 * k, 3 * k)
        resid_values = resid_values.cpu()
        r_mean, r_se = _mean_stderr(resid_values)
        offset = head_values.sum().item()
        if progress is not None:  # the last line carries the estimate, as Hutchinson's do
            progress(3 * k, 3 * k, value=offset + r_mean, stderr=r_se)
        return TraceEstimate(offset + r_mean, r_se, 3 * k, 2 * k, stop_reason, {}, tuple(resid_values.tolist()),
                             offset)
    AG = _in_pieces(op.matmat, G, _short_of(progress, 3 * k), 2 * k, 3 * k)

    # made in place: no (k, P) block beyond Q, G, AQ and AG
    head = Q.mul_(AQ)  # q ⊙ Aq
    resid = AG.mul_(G)  # g ⊙ Ag
    del Q, AQ, G, AG
    exact_part = rowsum64(head).sum().item()
    resid_values = rowsum64(resid).cpu()
    r_mean, r_se = _mean_stderr(resid_values)
    if progress is not None:
        progress(3 * k, 3 * k, value=exact_part + r_mean, stderr=r_se)
    groups: dict[str, tuple[float, float | None]] = {}
    if split is not None:
        head_g, resid_g = split(head), split(resid)
        for name in head_g:
            m, se = _mean_stderr(resid_g[name].to(torch.float64).cpu())
            groups[name] = (head_g[name].sum().item() + m, se)
    return TraceEstimate(exact_part + r_mean, r_se, 3 * k, 2 * k, stop_reason, groups, tuple(resid_values.tolist()),
                         exact_part)
