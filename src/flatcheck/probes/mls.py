"""Probe 10 (SPEC, Chen et al. 2023 §3): MLS, normalized MLS, NMLS, log local volume, local dimensionality,
and the right-hand sides of the MLS / NMLS bounds next to the quantities."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import nn

from ._hooks import is_linear_like, named_matching
from ._inputjac import iter_rows, require_independent, spectral_stats
from ..report.result import ProbeResult
from ._inputjac import OUTPUT_HELP
from ._kit import option, progress_reporter
from ..backends.base import Outputs
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class MLSOptions:
    output: Literal["logits", "softmax"] = option("logits", OUTPUT_HELP)


class _Layer:
    """Running per-sample sums for one call site of a Linear/Conv layer."""

    def __init__(self, module: nn.Module, dense: bool):
        self.module, self.dense = module, dense
        self.sens: list[torch.Tensor] = []  # ‖∂f/∂h_n‖_2
        self.inv_h_sq: list[torch.Tensor] = []  # ‖h_n‖⁻²
        self.grad_w_sq: list[torch.Tensor] = []  # ‖∇_W f(x_n)‖²_F = ‖∂f/∂z_n‖²_F ‖h_n‖² (dense only)

    def bound(self) -> float | None:
        if not self.dense:
            return None
        w2 = torch.linalg.matrix_norm(self.module.weight.detach().to(torch.float64), ord=2).item()
        inv = torch.cat(self.inv_h_sq).mean().item()
        grad = torch.cat(self.grad_w_sq).mean().item()
        return w2 * math.sqrt(inv) * math.sqrt(grad)


@register_probe
class MLSProbe:
    """Over S, with J_n = ∂f(x_n)/∂x_n (f = logits, or softmax with output=softmax):

    - MLS = (1/N) Σ ‖J_n‖_2;  normalized MLS = (1/N) Σ ‖x_n‖·‖J_n‖_2 (input-scale invariant);
    - NMLS = Σ_l (1/N) Σ_n ‖∂f/∂h_l(x_n)‖_2 over the input h_l of every Linear/Conv call;
    - log volume = (1/N) Σ_n Σ_i log σ_i(J_n) over nonzero σ_i: σ_i > eps·max(C, D)·σ_max, eps
      of the working dtype (the numerical-rank tolerance); the mean rank is reported too;
    - local dimensionality = (1/N) Σ_n (Σλ)²/Σλ², λ the eigenvalues of J_n J_nᵀ.

    Bounds (right-hand sides): per dense layer l (nn.Linear on one vector per sample)
    ‖W_l‖_2 · √((1/N) Σ ‖h_l‖⁻²) · √((1/N) Σ ‖∇_{W_l} f‖²_F), using ‖∇_W f‖²_F = ‖∂f/∂z‖²_F ‖h‖².
    The MLS bound is that of the first layer, given only when its input is x itself (up to
    flattening); NMLS's is the sum over layers, given only when every layer is dense. For a
    conv (weight-shared) layer the identity fails, so its bound is None ("n/a"), not a false number.

    Exact: all C rows of every Jacobian (C backward passes per batch). Eval-mode BatchNorm only.
    """

    name: ClassVar[str] = "mls"
    summary: ClassVar[str] = "maximum local sensitivity (MLS, NMLS), log-volume, local dimension, bounds"
    Options: ClassVar[type] = MLSOptions
    requires: ClassVar[frozenset[type]] = frozenset({Outputs})
    command_help: ClassVar[str] = "MLS, normalized MLS, NMLS, log local volume and local dimensionality, with bounds."

    def run(self, ctx: ProbeContext, options: MLSOptions) -> ProbeResult:
        start = time.perf_counter()
        problem = ctx.backend.problem
        require_independent(problem.model, problem.bn_mode, self.name)
        taps = named_matching(problem.model, is_linear_like)
        eps = None
        spec, norm_spec, logvol, rank, ldim = [], [], [], [], []
        layers: dict[str, _Layer] = {}
        first_is_input = True
        first_key = None
        passes = 0
        progress = progress_reporter(ctx, "mls")
        for x, _, rows in iter_rows(problem, options.output, taps, tap_outputs=True, progress=progress):
            eps = torch.finfo(x.dtype).eps
            passes += rows.out.shape[1]
            stats = spectral_stats(rows.dx, eps)
            x_norm = x.flatten(1).to(torch.float64).norm(dim=1)
            spec.append(stats.spectral)
            norm_spec.append(x_norm * stats.spectral)
            logvol.append(stats.log_volume)
            rank.append(stats.rank)
            ldim.append(stats.local_dim)
            for i, tap in enumerate(rows.taps):
                key = tap.call.key
                dense = isinstance(tap.call.module, nn.Linear) and tap.h.ndim == 2
                layer = layers.setdefault(key, _Layer(tap.call.module, dense))
                if i == 0:
                    first_key = key
                    same = tap.h.shape[0] == x.shape[0] and tap.h.flatten(1).shape == x.flatten(1).shape
                    first_is_input &= bool(same and torch.equal(tap.h.flatten(1), x.flatten(1)))
                layer.sens.append(spectral_stats(tap.dh, eps).spectral)
                h_sq = tap.h.flatten(1).to(torch.float64).pow(2).sum(1)
                layer.inv_h_sq.append(1 / h_sq)
                if dense:
                    dz_sq = tap.dz.flatten(2).to(torch.float64).pow(2).sum((1, 2))
                    layer.grad_w_sq.append(dz_sq * h_sq)

        mls = torch.cat(spec).mean().item()
        per_layer = {}
        for key, layer in layers.items():
            per_layer[key] = {
                "type": type(layer.module).__name__,
                "dense": layer.dense,
                "sensitivity": torch.cat(layer.sens).mean().item(),
                "bound": layer.bound(),
            }
        nmls = sum(v["sensitivity"] for v in per_layer.values())
        all_dense = bool(per_layer) and all(v["dense"] for v in per_layer.values())
        nmls_bound = sum(v["bound"] for v in per_layer.values()) if all_dense else None
        mls_bound = per_layer[first_key]["bound"] if first_key is not None and first_is_input else None
        details = {
            "output": options.output,
            "mls": mls,
            "mls_bound": mls_bound,
            "normalized_mls": torch.cat(norm_spec).mean().item(),
            "nmls": nmls,
            "nmls_bound": nmls_bound,
            "log_volume": torch.cat(logvol).mean().item(),
            "mean_rank": torch.cat(rank).to(torch.float64).mean().item(),
            "rank_tolerance": f"sigma > {eps:.3g} * max(C, D) * sigma_max",
            "local_dimensionality": torch.cat(ldim).mean().item(),
            "per_layer": per_layer,
            "backward_passes": passes,  # batched, C per batch; the probe makes no curvature products
        }
        fmt = lambda b: "n/a" if b is None else f"{b:.4g}"  # noqa: E731
        notes = (f"MLS {mls:.4g} (bound {fmt(mls_bound)}), NMLS {nmls:.4g} (bound {fmt(nmls_bound)}), "
                 f"normalized MLS {details['normalized_mls']:.4g}, log-vol {details['log_volume']:.4g}, "
                 f"local dim {details['local_dimensionality']:.4g}")
        return ProbeResult(probe=self.name, value=mls, stderr=None, matvecs=0,
                           seconds=time.perf_counter() - start, label=f"MLS ({options.output})",
                           notes=notes, details=details)
