"""Relative flatness (Petzka et al. 2021, Taleghani et al. 2026 Definition 1): relative flatness κ of the head."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

from ._head import head_statistics, resolve_head
from ..report.result import ProbeResult
from ._head import HEAD_HELP
from .kit import option
from ..backends.base import Outputs
from .gating import Gating
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class RelativeFlatnessOptions:
    head: str | None = option(None, HEAD_HELP)  # module name; default: the spec's head, else auto-detected


@register_probe
class RelativeFlatnessProbe:
    """κ = Σ_{s,s'} ⟨w_s, w_s'⟩ Tr(H_{s,s'}) over the rows w_s of the head weight W, with
    H_{s,s'} the Hessian block of the loss w.r.t. rows s and s'. Since z = W·φ + b,
    Tr(H_{s,s'}) = (1/N) Σ_n A_n[s,s'] ‖φ_n‖², so in closed form, for every loss,

        κ = (1/N) Σ_n ‖φ_n‖² Tr(A_n W Wᵀ),

    for cross entropy (1/N) Σ_n ‖φ_n‖² (Σ_s p_ns ‖w_s‖² − ‖Σ_s p_ns w_s‖²). One forward per batch.

    Per-class contributions κ_s = Σ_{s'} ⟨w_s, w_s'⟩ Tr(H_{s,s'}) sum to κ (details.per_class).
    The bias is not part of κ (Petzka's definition is over the weights).

    Taleghani et al. 2026's convolutional version (Definition 1) replaces φ by the channel-wise
    average patch φ̄ of the conv head's input and w_s by the flattened filter. For a 1×1-conv head
    followed by global average pooling the patch is one pixel, φ̄ is the pooled feature vector
    and the filter is the weight row, so Definition 1 coincides with the formula above; the
    same holds for a larger kernel, with φ̄ the average (C_in·K_H·K_W) patch, which is what
    flatcheck.head captures. There is therefore one number, not two.

    κ is invariant under scaling the layer feeding the head by α and the head by 1/α in a
    ReLU network (φ → αφ, W → W/α), unlike the head trace, whose weight part scales by α².
    """

    name: ClassVar[str] = "relative-flatness"
    gating: ClassVar[Gating] = Gating(loss_curvature=False)  # closed form
    summary: ClassVar[str] = "relative flatness κ of the final linear layer (closed form)"
    Options: ClassVar[type] = RelativeFlatnessOptions
    requires: ClassVar[frozenset[type]] = frozenset({Outputs})
    command_help: ClassVar[str] = "Relative flatness κ of the final linear layer (closed form, per-class parts in the JSON)."

    def run(self, ctx: ProbeContext, options: RelativeFlatnessOptions) -> ProbeResult:
        start = time.perf_counter()
        head = resolve_head(ctx.backend.problem.model, ctx.spec, options.head)
        stats = head_statistics(ctx.backend, head)
        W = head.matrix()
        per_class = stats.class_kappa.tolist()
        top = max(range(len(per_class)), key=lambda c: per_class[c])
        return ProbeResult(
            probe=self.name,
            value=stats.kappa,
            stderr=None,
            matvecs=0,
            seconds=time.perf_counter() - start,
            label="κ (relative flatness)",
            notes=f"head {head.name}; largest class share: class {top} "
                  f"({100 * per_class[top] / stats.kappa:.1f}%)" if stats.kappa else f"head {head.name}",
            details={
                "head": head.name,
                "head_kind": "conv" if head.is_conv else "linear",
                "classes": W.shape[0],
                "features": W.shape[1],
                "per_class": {str(c): v for c, v in enumerate(per_class)},
                "weight_trace": stats.weight_trace,
                "weight_sqnorm": W.to(dtype=stats.class_kappa.dtype).pow(2).sum().item(),
                "mean_feature_sqnorm": stats.feature_sqnorm,
                "convolutional_definition": "coincides (Taleghani et al. 2026 Def. 1 with the average patch = φ)",
            },
        )
