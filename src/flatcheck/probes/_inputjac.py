"""Per-sample input Jacobians J(x) = ∂f(x)/∂x (and ∂f/∂h for layer inputs h), batched over samples.

Samples are independent only when BatchNorm uses running statistics: then the gradient of
Σ_n f_nc with respect to the batch is, row by row, every sample's own ∂f_nc/∂x_n, so C
backward passes give all rows of all samples at once. With batch statistics f_n depends on
every x_m of its batch and "the Jacobian of sample n" is no longer a C×D matrix of x_n
alone; callers refuse that case with `require_independent` rather than report a number that
depends on the batching.

`jacobian_rows` materialises the C rows per sample (exact; memory C·D per sample, bounded
by processing the batch in chunks of samples). The matrix-free route, products with J and Jᵀ
that never hold more than a few D-vectors per sample, is flatcheck.probes._jacfree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Literal

import torch
from torch import Tensor, nn

from ..problem import model_mode, uses_batch_statistics
from ..errors import ConfigError, setting
from ._hooks import Call, record
from .kit import SampleBudget

Output = Literal["logits", "softmax", "sigmoid"]
# Rows of all samples of one chunk together; a single sample larger than this still runs.
ROW_BYTES = 256 * 2**20
# "auto" materialises the C rows per sample only up to this many classes: the exact route costs
# C backward passes per batch and C·D numbers per sample.
AUTO_MAX_CLASSES = 128

# the help of the probes' `output` option (jacobian, mls)
# sigmoid: Chen et al. 2023 (App. F) put a sigmoid on the logits for normalized MLS
OUTPUT_HELP = "differentiate the logits, softmax(logits) or sigmoid(logits)"


def require_independent(model: nn.Module, bn_mode: str, probe: str) -> None:
    if uses_batch_statistics(model, bn_mode):
        raise ConfigError(
            f"{setting('bn_mode')} train: probe {probe} needs per-sample input Jacobians, which batch statistics "
            f"make depend on the whole batch; use {setting('bn_mode')} eval"
        )


def apply_output(logits: Tensor, output: Output) -> Tensor:
    if output == "softmax":
        return logits.softmax(-1)
    return logits.sigmoid() if output == "sigmoid" else logits


def sample_chunks(n: int, per_sample_elems: int, element_size: int) -> Iterator[slice]:
    step = max(1, ROW_BYTES // max(1, per_sample_elems * element_size))
    for i in range(0, n, step):
        yield slice(i, min(n, i + step))


@dataclass
class TapRows:
    """One call of a tapped layer: its input h and output z, and the rows of ∂f/∂h and ∂f/∂z."""

    call: Call
    h: Tensor  # (B, *h) detached
    dh: Tensor  # (B, C, *h)
    dz: Tensor | None  # (B, C, *z), when asked for


@dataclass
class Rows:
    out: Tensor  # (B, C) outputs (logits or softmax), detached
    logits: Tensor  # (B, C) detached
    dx: Tensor  # (B, C, *x)
    taps: list[TapRows]


def jacobian_rows(model: nn.Module, x: Tensor, output: Output,
                  taps: list[tuple[str, nn.Module]] = (), tap_outputs: bool = False) -> Rows:
    """Every sample's C×D input Jacobian (and ∂f/∂h_l, ∂f/∂z_l of the tapped layers): C backward passes.

    The caller sets the model mode (eval-mode BatchNorm) and chooses the chunk size.
    """
    x = x.detach().requires_grad_(True)
    with torch.enable_grad(), record(list(taps)) as rec:
        logits = model(x)
        out = apply_output(logits, output)
        calls = list(rec.calls)
        inputs = [x] + [c.input for c in calls] + ([c.output for c in calls] if tap_outputs else [])
        rows: list[list[Tensor]] = [[] for _ in inputs]
        num_classes = out.shape[1]
        for c in range(num_classes):
            grads = torch.autograd.grad(out[:, c].sum(), inputs, retain_graph=c < num_classes - 1,
                                        allow_unused=True)
            for acc, g, t in zip(rows, grads, inputs):
                acc.append(torch.zeros_like(t) if g is None else g)
    stacked = [torch.stack(r, dim=1) for r in rows]
    k = len(calls)
    tap_rows = [
        TapRows(call, call.input.detach(), stacked[1 + i], stacked[1 + k + i] if tap_outputs else None)
        for i, call in enumerate(calls)
    ]
    return Rows(out.detach(), logits.detach(), stacked[0], tap_rows)


@dataclass
class SpectralStats:
    """Per-sample quantities of a batch of C×D Jacobians, from their singular values (float64)."""

    frobenius: Tensor  # (B,)
    spectral: Tensor  # (B,)
    local_dim: Tensor  # (B,) (Σλ)²/Σλ² of the eigenvalues λ = σ² of J Jᵀ
    log_volume: Tensor  # (B,) Σ log σ_i over σ_i > tol
    rank: Tensor  # (B,) number of σ_i > tol


def spectral_stats(rows: Tensor, eps: float) -> SpectralStats:
    """rows (B, C, *D) → per-sample stats.

    "Nonzero" singular value: σ_i > eps · max(C, D) · σ_max, the usual numerical-rank
    tolerance, with eps that of the dtype the rows were computed in — below that, σ_i is
    indistinguishable from rounding noise of J's entries.
    """
    J = rows.flatten(2).to(torch.float64)
    c, d = J.shape[1], J.shape[2]
    sv = torch.linalg.svdvals(J)  # (B, min(C, D)), descending
    lam = sv.pow(2)
    frob_sq = J.pow(2).sum((1, 2))
    tol = eps * max(c, d) * sv[:, :1]
    keep = sv > tol
    log_vol = torch.where(keep, sv.clamp_min(torch.finfo(torch.float64).tiny).log(), torch.zeros_like(sv)).sum(1)
    log_vol = torch.where(keep.any(1), log_vol, torch.full_like(log_vol, -torch.inf))
    return SpectralStats(
        frobenius=frob_sq.sqrt(),
        spectral=sv[:, 0],
        local_dim=lam.sum(1).pow(2) / lam.pow(2).sum(1),
        log_volume=log_vol,
        rank=keep.sum(1),
    )


def region_mask(x_shape: tuple[int, ...], region: tuple[int, int, int, int]) -> Tensor:
    """Boolean (H, W) mask, True outside the (y, x, h, w) region; inputs are (channels, H, W)."""
    if len(x_shape) != 3:
        raise ConfigError(f"{setting('exclude_region')} needs image inputs (channels, height, width), got shape {tuple(x_shape)}")
    _, height, width = x_shape
    y0, x0, h, w = region
    if y0 + h > height or x0 + w > width:
        raise ConfigError(f"{setting('exclude_region')} {y0},{x0},{h},{w} does not fit inside the {height}×{width} input")
    if h * w >= height * width:
        raise ConfigError(f"{setting('exclude_region')} covers the whole input; nothing is left outside it")
    mask = torch.ones(height, width, dtype=torch.bool)
    mask[y0:y0 + h, x0:x0 + w] = False
    return mask


def summarise(values: Tensor) -> dict:
    """Mean, max (with the sample index attaining it) and min of per-sample values over S."""
    v = values.to(torch.float64).cpu()
    i = int(v.argmax())
    return {"mean": v.mean().item(), "max": v[i].item(), "argmax": i, "min": v.min().item()}


def iter_rows(problem, output: Output, taps: list[tuple[str, nn.Module]], tap_outputs: bool,
              progress: Callable[[int, int], None] | None = None,
              chunk: int | None = None, budget: SampleBudget | None = None) -> Iterator[tuple[Tensor, Tensor, Rows]]:
    """(x, y, Rows) for chunks of every batch: `chunk` samples (sized by the caller's memory
    plan), or without one sized from the first chunk's row count; `budget` caps the chunk and
    may end the loop before a chunk's rows are taken.

    Runs under the problem's model mode; the caller has checked `require_independent`.
    """
    per_sample = None
    done = 0
    for batch in problem.samples:
        start = 0
        while start < batch.x.shape[0]:
            # the first chunk is one sample, which measures the per-sample size of all rows
            if chunk is not None:
                step = chunk
            else:
                step = 1 if per_sample is None else next(sample_chunks(batch.x.shape[0] - start, per_sample, 8)).stop
            if budget is not None:
                if budget.ends(done, problem.samples.n):
                    return
                step = budget.chunk(step, done)
            x, y = batch.x[start:start + step], batch.y[start:start + step]
            # held for the forward only, not across the yield (see AutogradBackend.outputs)
            with model_mode(problem.model, problem.bn_mode):
                rows = jacobian_rows(problem.model, x, output, taps, tap_outputs)
            if per_sample is None:
                per_sample = rows.dx[0].numel() + sum(
                    t.dh[0].numel() + (t.dz[0].numel() if t.dz is not None else 0) for t in rows.taps)
            yield x, y, rows
            start += step
            done += x.shape[0]
            # in samples, after each chunk: one batch of slow samples (a ViT's 1,000 rows each)
            # showed no count and no ETA until it was all through
            if progress is not None:
                progress(done, problem.samples.n)
