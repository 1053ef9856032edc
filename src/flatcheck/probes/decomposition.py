"""Probe 12 (SPEC, Anonymous 2025 §3, App. A.1): the centered decomposition of Tr(G) per Linear/Conv
layer and its scale-aware upper bound, next to the exact GGN trace of the same weights.

Anonymous 2025: "Sharpness can be manipulated and misleading for generalization", under
double-blind review."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._hooks import is_linear_like, named_matching
from ._inputjac import iter_rows, require_independent
from ..losses import output_hessian_factors
from ..report.result import ProbeResult
from ._kit import progress_reporter
from ..backends.base import ExactGGN
from .registry import ProbeContext, register_probe

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@dataclass(frozen=True)
class DecompositionOptions:
    pass


def patch_sqnorm(module: nn.Module, h: Tensor) -> Tensor:
    """s_{l−1} per sample: ‖h‖² for a dense layer; for a conv layer the mean over output
    positions t (and groups) of ‖a_t‖², a_t the input patch that position t sees (zero padding
    included) — computed as a convolution of h² with a kernel of ones, no unfolding."""
    h = h.to(torch.float64)
    if isinstance(module, nn.Linear):
        return h.flatten(1).pow(2).sum(1)
    conv = _CONV[h.ndim - 2]
    groups = module.groups
    ones = torch.ones(groups, h.shape[1] // groups, *module.kernel_size, dtype=h.dtype, device=h.device)
    # non-zero padding modes (reflect, circular) are left out of the patches: an approximation
    padding = module.padding if module.padding_mode == "zeros" else 0
    patches = conv(h.pow(2), ones, stride=module.stride, padding=padding, dilation=module.dilation, groups=groups)
    return patches.flatten(2).mean(2).mean(1)


class _Layer:
    def __init__(self, module: nn.Module, exact: bool):
        self.module, self.exact = module, exact
        self.sums = torch.zeros(5, dtype=torch.float64)  # s, λmax, centered, s·centered, bound

    def add(self, s: Tensor, lam: Tensor, centered: Tensor, bound_factor: Tensor) -> None:
        self.sums += torch.stack([s.sum(), lam.sum(), centered.sum(), (s * centered).sum(),
                                  (s * lam * bound_factor).sum()]).cpu()


@register_probe
class DecompositionProbe:
    """Per Linear/Conv layer l with a probed weight, averaged over S (per sample, then mean):

    - s_{l−1} = ‖a^{(l−1)}‖², a^{(l−1)} the layer's input;
    - M^{(l)} = (∂f/∂z^{(l)})(∂f/∂z^{(l)})ᵀ (C×C, f = logits), λmax(M) = σ_max(∂f/∂z^{(l)})²;
    - centered = Σ_i p_i (v_i − v̄)ᵀ M (v_i − v̄) with v_i = e_i, v̄ = p, i.e. Tr(A M) for the
      loss's output Hessian A (diag(p) − ppᵀ for cross entropy; Tr(A M) for mse/sigmoid-mse);
    - term = s_{l−1}·centered, the layer's share of Tr(G) in Anonymous 2025's decomposition;
    - bound = 2 s_{l−1} λmax(M) Σ_i p_i ‖v_i‖² (= 2 s λmax for cross entropy, since ‖e_i‖ = 1;
      for other losses s λmax Tr(A), the same Rayleigh bound).

    value = Σ_l term, shown against the exact GGN trace of the same weights (biases excluded, as
    in the seed). The decomposition is exact for a dense layer applied to one vector per sample
    (‖∇_W f_i·∇_W f_j‖ = ‖a‖² δ_iᵀδ_j), whatever the rest of the network. For a conv layer
    (weight-shared over positions t) the exact inner product is Σ_{t,t'} (a_t·a_t')(δ_it·δ_jt');
    the decomposition keeps t = t' and replaces ‖a_t‖² by its mean over t, so there it is an
    approximation and the per-layer exact GGN value is shown next to it.
    Eval-mode BatchNorm only (per-sample ∂f/∂z).
    """

    name: ClassVar[str] = "decomposition"
    summary: ClassVar[str] = "centered GGN decomposition per layer (Anonymous 2025), scale-aware bound, vs exact Tr(G)"
    Options: ClassVar[type] = DecompositionOptions
    requires: ClassVar[frozenset[type]] = frozenset({ExactGGN})
    command_help: ClassVar[str] = ("Centered decomposition of Tr(G) per layer (Anonymous 2025), its bound, "
                                   "vs exact Tr(G).")

    def run(self, ctx: ProbeContext, options: DecompositionOptions) -> ProbeResult:
        start = time.perf_counter()
        problem = ctx.backend.problem
        require_independent(problem.model, problem.bn_mode, self.name)
        layout = problem.layout
        probed = set(layout.names)
        taps = [(n, m) for n, m in named_matching(problem.model, is_linear_like)
                if _weight_name(n) in probed]
        layers: dict[str, _Layer] = {}
        n_total, passes = 0, 0
        progress = progress_reporter(ctx, "decomposition")
        for _, y, rows in iter_rows(problem, "logits", taps, tap_outputs=True, progress=progress):
            U, lam = output_hessian_factors(rows.logits, y, problem.loss)
            U, lam = U.to(torch.float64), lam.to(torch.float64)
            A = torch.einsum("bck,bk,bdk->bcd", U, lam, U)
            if problem.loss.name in ("cross_entropy", "label_smoothing"):
                factor = torch.full_like(lam[:, 0], 2.0)  # 2 Σ_i p_i ‖e_i‖²
            else:
                factor = torch.einsum("bcc->b", A)
            for tap in rows.taps:
                dz = tap.dz.flatten(2).to(torch.float64)
                M = dz @ dz.transpose(1, 2)
                lam_max = torch.linalg.eigvalsh(M)[:, -1].clamp_min(0)
                centered = (A * M).sum((1, 2))
                s = patch_sqnorm(tap.call.module, tap.h)
                exact = isinstance(tap.call.module, nn.Linear) and tap.h.ndim == 2
                layers.setdefault(tap.call.key, _Layer(tap.call.module, exact)).add(s, lam_max, centered, factor)
            n_total += y.shape[0]
            passes += rows.out.shape[1]

        ggn = ctx.backend.ggn_trace().per_param.cpu()
        ggn_by_name = dict(zip(layout.names, ggn.tolist()))
        per_layer = {}
        for key, layer in layers.items():
            s, lam_max, centered, term, bound = (layer.sums / n_total).tolist()
            name = _weight_name(key.split("#")[0])
            per_layer[key] = {"type": type(layer.module).__name__, "exact": layer.exact, "s": s,
                              "lambda_max": lam_max, "centered": centered, "term": term, "bound": bound,
                              "ggn_weight": ggn_by_name[name],
                              # the s that would make s·centered exact: how far a conv layer is from dense
                              "s_effective": ggn_by_name[name] / centered if centered else None}
        # a layer called twice has one weight: its exact GGN counts once in the comparison
        weights = {_weight_name(k.split("#")[0]) for k in per_layer}
        total = sum(v["term"] for v in per_layer.values())
        ggn_total = sum(ggn_by_name[w] for w in weights)
        bound = sum(v["bound"] for v in per_layer.values())
        exact = bool(per_layer) and all(v["exact"] for v in per_layer.values()) and len(weights) == len(per_layer)
        rel = abs(total - ggn_total) / abs(ggn_total) if ggn_total else None
        dense_terms = sum(v["term"] for v in per_layer.values() if v["exact"])
        dense_ggn = sum(v["ggn_weight"] for v in per_layer.values() if v["exact"])
        rel_text = "n/a" if rel is None else f"{rel:.3g}"
        notes = (f"Σ terms {total:.4g} vs exact Tr(G) of the same weights {ggn_total:.4g} (rel. diff {rel_text}, "
                 f"{'exact' if exact else 'approximate: conv/shared layers'}); bound {bound:.4g}")
        return ProbeResult(
            probe=self.name, value=total, stderr=None, matvecs=0, seconds=time.perf_counter() - start,
            label="Σ_l s·centered", notes=notes,
            details={"total": total, "ggn_trace": ggn_total, "relative_difference": rel, "exact": exact,
                     "bound": bound, "dense_total": dense_terms, "dense_ggn_trace": dense_ggn,
                     "loss": problem.loss.name, "per_layer": per_layer,
                     # the Jacobian rows' batched passes (C per batch), not the exact Tr(G)'s per-sample ones
                     "backward_passes": passes},
        )


def _weight_name(module_name: str) -> str:
    return "weight" if module_name == "<root>" else f"{module_name}.weight"
