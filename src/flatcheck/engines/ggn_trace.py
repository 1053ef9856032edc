"""The GGN trace Tr(G) = (1/N) Σ_n Σ_k λ_nk ‖J_nᵀ u_nk‖², split per parameter tensor.

Exact with all C columns of the output Hessian's factorisation, or class-sampled. Three
strategies give the per-sample squared norms ‖J_nᵀ u‖²: from layer inputs and output
gradients (flatcheck.engines.persample), by per-sample VJPs under vmap, or, where the
samples are coupled (BatchNorm on batch statistics) or vmap has no rule for an op, by
pulling back e_n ⊗ u_nk through the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor
from torch.func import functional_call, vjp, vmap

from ..problem import Problem, model_mode
from ..losses import output_hessian_factors, sample_columns
from .persample import layer_sqnorms
from .pullback import pullback

# Memory allowed for one chunk of per-sample, per-column parameter gradients: the working set
# stays this whatever the number of classes C (all C columns of a 1,000-class model's
# factorisation at once held C gradients of every parameter: gigabytes).
PER_SAMPLE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class GGNTrace:
    """Tr(G) as a backend's exact GGN route returns it (backends.base.ExactGGN)."""

    per_param: Tensor  # (len(layout.names),) float64; sums to Tr(G)
    stderr: float | None  # None when every class column was used (exact)
    columns: int  # per-sample VJPs spent, Σ_n K_n


@dataclass(frozen=True)
class SampledGGNTrace(GGNTrace):
    """A class-sampled Tr(G) with the covariance of its per-parameter parts, so that the
    standard error of any sum of parts (the weights alone, say) is known, not only the total's."""

    covariance: Tensor | None = None  # (n_params, n_params) float64; sums to stderr²
    # Σ_n w_n² over the samples' shares w_n of stderr² (Welch–Satterthwaite's denominator)
    share_sq: float = 0.0
    third: float | None = None  # the total's third cumulant, estimated (K ≥ 3 draws per sample)
    draws: int = 2  # K

    @property
    def dof(self) -> int | None:
        """⌊ν⌋ of the Welch–Satterthwaite ν = (Σ w_n)²·(K − 1)/Σ w_n², w_n a sample's share of
        stderr², each from K − 1 dof; None where no draw differed.

        The draws λ‖Jᵀu‖²/q are heavy-tailed where a class with a small q has a large ‖Jᵀu‖²:
        a few samples then carry most of stderr², whose own spread is large, and a draw that
        missed them has a low value and a small stderr together. A normal interval covered
        Tr(G) in 88 % of seeds at K = 2 (600 samples, 4 classes; ν ≈ 4); t on ν, 93 %."""
        if not self.share_sq > 0 or self.stderr is None or not self.stderr > 0:
            return None
        return max(1, int(self.stderr**4 * (self.draws - 1) / self.share_sq))

    @property
    def skewness(self) -> float | None:
        """The total's estimated skewness κ₃/stderr³ (None at K = 2: a third cumulant needs
        three draws of a sample)."""
        if self.third is None or self.stderr is None or not self.stderr > 0:
            return None
        return self.third / self.stderr**3

    def stderr_of(self, mask: Tensor) -> float | None:
        """The standard error of the sum of the parts where `mask` (bool, one per parameter tensor) holds."""
        if self.covariance is None:
            return None
        m = mask.to(dtype=torch.float64, device=self.covariance.device)
        return max((m @ self.covariance @ m).item(), 0.0) ** 0.5


def _column_chunk(dim: int, element_size: int, columns: int) -> int:
    """How many columns' parameter gradients (and their squares) fit PER_SAMPLE_BYTES."""
    return max(1, min(columns, PER_SAMPLE_BYTES // max(dim * element_size * 3, 1)))


def ggn_trace(problem: Problem, class_samples: int | None = None, generator: torch.Generator | None = None,
              progress: Callable[[int, int], None] | None = None, per_sample: str = "layers") -> GGNTrace:
    """Tr(G) per parameter tensor: (1/N) Σ_n Σ_k λ_nk ‖J_nᵀ u_nk‖².

    Exact with all C columns of the factorisation. With `class_samples` = K, each
    sample uses K columns drawn with replacement, with probability ∝ |λ_nk|·‖u_nk‖²
    (p_c·‖e_c − p‖² for cross entropy; see losses.sample_columns), and
    importance weights λ/(K·q): unbiased, with a standard error from the spread of the
    K single-draw estimates within each sample.

    per_sample: "layers" tries the layer route first, "vmap" goes straight to per-sample VJPs.
    """
    params = problem.layout.params(problem.model)
    total = torch.zeros(len(params), dtype=torch.float64, device=problem.device)
    covariance = torch.zeros(len(params), len(params), dtype=torch.float64)
    share_sq, third = 0.0, 0.0
    columns = 0
    with model_mode(problem.model, problem.bn_mode):
        for i, batch in enumerate(problem.samples):
            with torch.no_grad():
                logits = problem.model(batch.x)
            U, lam = output_hessian_factors(logits, batch.y, problem.loss)
            if class_samples is not None:
                U, lam = sample_columns(U, lam, class_samples, generator)
            if not problem.batch_statistics:
                sq = _per_sample_sqnorms(problem, params, batch.x, U, per_sample)
            else:
                # Batch statistics couple the samples: f_n depends on the whole batch,
                # so per-sample forwards would be wrong. Pull back e_n ⊗ u_nk instead.
                sq = _coupled_sqnorms(problem, params, batch.x, U)
            sq = sq.to(torch.float64)  # (B, K, n_params)
            scale = batch.weight / batch.x.shape[0]  # = 1/N
            total += torch.einsum("bk,bkp->p", lam.to(torch.float64), sq) * scale
            columns += U.shape[0] * U.shape[-1]
            if class_samples is not None and class_samples > 1:
                # (B, K, n_params) single-draw estimates per parameter tensor: their spread within
                # each sample, as a covariance, gives the stderr of the total and of any sum of parts
                draws = (lam.to(torch.float64) * class_samples).unsqueeze(-1) * sq
                centred = draws - draws.mean(1, keepdim=True)
                covariance += (torch.einsum("bkp,bkq->pq", centred, centred).cpu()
                               * scale**2 / ((class_samples - 1) * class_samples))
                # the total's draws: each sample's share of stderr² (for Welch's dof) and,
                # from three draws, its unbiased third cumulant k₃ (for the skewness)
                c = centred.sum(-1)
                share = c.pow(2).sum(1) * scale**2 / ((class_samples - 1) * class_samples)
                share_sq += share.pow(2).sum().item()
                if class_samples >= 3:
                    k3 = c.pow(3).sum(1) * class_samples / ((class_samples - 1) * (class_samples - 2))
                    third += k3.sum().item() * scale**3 / class_samples**2
            if progress is not None:
                progress(i + 1, problem.samples.num_batches)
    if class_samples is None:
        return GGNTrace(total, None, columns)
    if class_samples < 2:
        return GGNTrace(total, float("nan"), columns)
    return SampledGGNTrace(total, max(covariance.sum().item(), 0.0) ** 0.5, columns, covariance, share_sq,
                           third if class_samples >= 3 else None, class_samples)


def _per_sample_sqnorms(problem: Problem, params: list[Tensor], x: Tensor, U: Tensor, per_sample: str) -> Tensor:
    """‖J_nᵀ U[n, :, k]‖² per sample, column and parameter tensor: (B, K, n_params).

    From layer inputs and output gradients where every probed parameter sits in a layer
    `layer_sqnorms` covers (one forward, K activation-only backwards), else by
    per-sample VJPs under vmap.
    """
    if per_sample == "layers":
        sq = layer_sqnorms(problem.model, problem.layout, x, U)
        if sq is not None:
            return sq
    return _vmap_sqnorms(problem, params, x, U)


def _vmap_sqnorms(problem: Problem, params: list[Tensor], x: Tensor, U: Tensor) -> Tensor:
    model, layout = problem.model, problem.layout
    chosen, frozen = problem.split_params()

    cols = _column_chunk(layout.dim, x.element_size(), U.shape[-1])

    def one(xn: Tensor, Un: Tensor) -> Tensor:
        def f(p):
            return functional_call(model, (p, frozen), (xn.unsqueeze(0),)).squeeze(0)

        _, pull = vjp(f, chosen)
        parts = []
        for j in range(0, Un.shape[-1], cols):
            (g,) = vmap(pull)(Un[:, j : j + cols].T)  # dict name -> (cols, *shape)
            parts.append(torch.stack([g[n].reshape(g[n].shape[0], -1).pow(2).sum(1) for n in layout.names], dim=1))
        return torch.cat(parts)

    chunk = max(1, PER_SAMPLE_BYTES // (cols * layout.dim * x.element_size() * 3))
    try:
        parts = [vmap(one)(x[i : i + chunk], U[i : i + chunk]) for i in range(0, len(x), chunk)]
    except RuntimeError:
        return _coupled_sqnorms(problem, params, x, U)  # no vmap rule for some op: exact but slower
    return torch.cat(parts)


def _coupled_sqnorms(problem: Problem, params: list[Tensor], x: Tensor, U: Tensor) -> Tensor:
    logits = problem.model(x)
    b, c, kk = U.shape
    cols = _column_chunk(problem.layout.dim, x.element_size(), kk)
    rows = []
    for n in range(b):
        parts = []
        for j in range(0, kk, cols):
            cot = torch.zeros(min(cols, kk - j), b, c, dtype=x.dtype, device=x.device)
            cot[:, n, :] = U[n, :, j : j + cols].T
            grads = pullback(logits, params, cot)
            parts.append(torch.stack([g.reshape(cot.shape[0], -1).pow(2).sum(1) for g in grads], dim=1))
        rows.append(torch.cat(parts))
    return torch.stack(rows)
