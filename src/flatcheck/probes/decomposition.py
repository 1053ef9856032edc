"""Decomposition (Anonymous 2025 §3, App. A.1): the centered decomposition of Tr(G) per Linear/Conv
layer and its scale-aware upper bound, next to the exact GGN trace of the same weights.

Anonymous 2025: "Sharpness can be manipulated and misleading for generalization", under
double-blind review."""

from __future__ import annotations

import math
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
from ..errors import ConfigError
from ._jacfree import LANCZOS_STREAM, PROBE_STREAM, JacobianProducts, MatrixFreeOptions, gaussian, iter_chunks, \
    lanczos_sigma, plan, rademacher
from .kit import SampleBudget, option, progress_reporter
from ..backends.base import ExactGGN
from ..problem import model_mode
from .gating import Gating
from .registry import ProbeContext, register_probe

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@dataclass(frozen=True)
class DecompositionOptions(MatrixFreeOptions):
    class_samples: int = option(8, "sampled classes per sample of the Tr(G) it is compared with (estimate route; "
                                   "the exact route uses every class)")

    def __post_init__(self):
        super().__post_init__()
        if self.class_samples < 1:
            raise ConfigError(f"decomposition.class_samples must be ≥ 1, got {self.class_samples}")


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


@dataclass(frozen=True)
class DecompositionGating(Gating):
    """Until schema 2.5 `details.ggn_trace` was the GGN trace over the layer weights alone, and
    a weight used twice lacked its cross terms; a baseline of then is another quantity."""

    def superseded(self, probe, result, schema, fields):
        if schema is not None and schema < (2, 5) and "ggn_trace" in (result.get("details") or {}):
            return (f"measured with schema {schema[0]}.{schema[1]}, whose details.ggn_trace is the GGN trace over "
                    "layer weights only (from 2.5 it is Tr(G) over every parameter, and shared weights count their "
                    "cross terms)")
        return None


class _Layer:
    def __init__(self, module: nn.Module, exact: bool):
        self.module, self.exact = module, exact
        self.sums = torch.zeros(5, dtype=torch.float64)  # s, λmax, centered, s·centered, bound
        self.errors: Tensor | None = None  # estimate route: see add_errors

    def add(self, s: Tensor, lam: Tensor, centered: Tensor, bound_factor: Tensor) -> None:
        self.sums += torch.stack([s.sum(), lam.sum(), centered.sum(), (s * centered).sum(),
                                  (s * lam * bound_factor).sum()]).cpu()

    def add_errors(self, s: Tensor, draws: Tensor, norms, bound_factor: Tensor) -> None:
        """The estimate route's uncertainty: Σ_n of the Hutchinson variances of centered and
        s·centered (draws (B, K)), and Σ_n of the Lanczos error bounds on λmax and the bound
        (λ = σ² within (σ + e)² − σ²)."""
        k = draws.shape[1]
        var = draws.var(1, unbiased=True) / k
        lam_err = (norms.sigma + norms.error).pow(2) - norms.sigma.pow(2)
        add = torch.stack([var.sum(), (s.pow(2) * var).sum(), lam_err.sum(), (s * lam_err * bound_factor).sum()])
        self.errors = add if self.errors is None else self.errors + add

    def error_details(self, n: int) -> dict:
        if self.errors is None:
            return {}
        var_c, var_t, lam_err, bound_err = self.errors.tolist()
        return {"centered_stderr": math.sqrt(var_c) / n, "term_stderr": math.sqrt(var_t) / n,
                "lambda_max_error_bound": lam_err / n, "bound_error_bound": bound_err / n}


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

    value = Σ_l term, plus for a dense weight used by several calls i, j the cross terms
    2 (a_i·a_j) Tr(A D_i D_jᵀ) (D = ∂f/∂z of each call) its calls' terms leave out. It is shown
    against the GGN trace of the same weights (details.ggn_trace_weights: biases and norm
    parameters are left out, as in Anonymous 2025), beside Tr(G) over every probed parameter
    (details.ggn_trace). The decomposition is exact for a dense layer applied to one vector per sample
    (‖∇_W f_i·∇_W f_j‖ = ‖a‖² δ_iᵀδ_j), whatever the rest of the network. For a conv layer
    (weight-shared over positions t) the exact inner product is Σ_{t,t'} (a_t·a_t')(δ_it·δ_jt');
    the decomposition keeps t = t' and replaces ‖a_t‖² by its mean over t, so there it is an
    approximation and the per-layer exact GGN value is shown next to it.
    Eval-mode BatchNorm only (per-sample ∂f/∂z).
    """

    name: ClassVar[str] = "decomposition"
    gating: ClassVar[Gating] = DecompositionGating(tolerance_option="lanczos_tol", routes=frozenset({"exact", "estimate"}))
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
        x1 = next(iter(problem.samples)).x[:1]
        with model_mode(problem.model, problem.bn_mode):
            route = plan(problem.model, x1, "logits", taps, options.method, ctx.memory_allowance, self.name,
                         tap_outputs=True)
        # Tr(G) is a pass over the data of its own, as long as the terms' on a large model:
        # shown as such, not left to run behind a finished progress line
        if route.route == "estimate":
            layers, cross, n_total, passes, extra = self._estimate(ctx, options, taps, route)
            ggn_result = ctx.backend.ggn_trace(options.class_samples, ctx.generator(),
                                               progress=progress_reporter(ctx, "decomposition: Tr(G)"))
        else:
            layers, cross, n_total, passes, extra = self._exact(ctx, taps, route)
            ggn_result = ctx.backend.ggn_trace(progress=progress_reporter(ctx, "decomposition: Tr(G)"))
        ggn = ggn_result.per_param.cpu()
        ggn_by_name = dict(zip(layout.names, ggn.tolist()))
        per_layer = {}
        for key, layer in layers.items():
            s, lam_max, centered, term, bound = (layer.sums / n_total).tolist()
            name = _weight_name(key.split("#")[0])
            per_layer[key] = {"type": type(layer.module).__name__, "exact": layer.exact, "s": s,
                              "lambda_max": lam_max, "centered": centered, "term": term, "bound": bound,
                              "ggn_weight": ggn_by_name[name],
                              # the s that would make s·centered exact: how far a conv layer is from dense
                              "s_effective": ggn_by_name[name] / centered if centered else None,
                              **layer.error_details(n_total)}
        # a layer called twice has one weight: its GGN counts once in the comparison, and the
        # terms of its calls miss the cross terms between them (`cross`, dense weights only)
        calls: dict[str, list[dict]] = {}
        for key, v in per_layer.items():
            calls.setdefault(_weight_name(key.split("#")[0]), []).append(v)
        weights = set(calls)
        terms = sum(v["term"] for v in per_layer.values())
        total = terms + sum(cross.values())
        ggn_all = float(ggn.sum())
        ggn_total = sum(ggn_by_name[w] for w in weights)
        bound = sum(v["bound"] for v in per_layer.values())
        dense = {w for w, vs in calls.items() if all(v["exact"] for v in vs) and (len(vs) == 1 or w in cross)}
        exact = bool(per_layer) and dense == weights
        # under --budget the terms cover the first samples only, Tr(G) every one: no comparison
        cut = extra.get("samples_used")
        rel = abs(total - ggn_total) / abs(ggn_total) if ggn_total and cut is None else None
        dense_terms = sum(v["term"] for w in dense for v in calls[w]) + sum(cross.get(w, 0.0) for w in dense)
        dense_ggn = sum(ggn_by_name[w] for w in dense)
        rel_text = "not compared" if cut is not None else "n/a" if rel is None else f"{rel:.3g}"
        estimate = route.route == "estimate"
        ggn_name = f"Tr(G) ({options.class_samples} sampled classes)" if estimate else "exact Tr(G)"
        shared = f" + shared weights' cross terms {sum(cross.values()):.3g} = {total:.4g}" if cross else ""
        notes = (f"{route.route} route: Σ terms {terms:.4g}{shared}{_pm(extra.get('total_stderr'))} vs {ggn_name} "
                 f"of the same weights {ggn_total:.4g} (rel. diff {rel_text}, "
                 f"{'exact' if exact else 'approximate: conv layers or shared conv weights'}); bound {bound:.4g}; "
                 f"Tr(G) over every probed parameter {ggn_all:.4g}")
        details = {"total": total, "terms_total": terms, "shared_cross_terms": cross,
                   # Tr(G) over every probed parameter, and over the probed layers' weights alone
                   # (biases and norm parameters left out, as the decomposition leaves them out):
                   # the value is compared with the latter
                   "ggn_trace": ggn_all, "ggn_trace_weights": ggn_total, "relative_difference": rel,
                   "exact": exact, "bound": bound, "dense_total": dense_terms, "dense_ggn_trace_weights": dense_ggn,
                   "loss": problem.loss.name, "per_layer": per_layer,
                   # the Jacobian products' batched passes (C per batch on the exact route), not Tr(G)'s
                   "backward_passes": passes, **extra, **route.details()}
        if estimate:
            # the comparison's Tr(G) is class-sampled: the stderr of each of the two sums
            details["ggn_class_samples"] = options.class_samples
            details["ggn_trace_stderr"] = ggn_result.stderr
            mask = torch.tensor([n in weights for n in layout.names])
            stderr_of = getattr(ggn_result, "stderr_of", None)
            details["ggn_trace_weights_stderr"] = stderr_of(mask) if stderr_of is not None else None
        if cut is not None:
            details["relative_difference_null_reason"] = (
                f"the terms are over the first {cut} of {extra['samples_requested']} samples (--budget) "
                "and Tr(G) over all of them")
        if "unresolved_reason" in extra:
            notes += f"; {extra['unresolved_reason']}, while Tr(G) is over all of them"
        return ProbeResult(
            probe=self.name, value=total, stderr=extra.get("total_stderr"), matvecs=0,
            seconds=time.perf_counter() - start, seed=ctx.seed if estimate else None,
            label="Σ_l s·centered" + (" + shared cross terms" if cross else ""), notes=notes, details=details, resolved="unresolved_reason" not in extra,
        )

    def _exact(self, ctx: ProbeContext, taps, route) -> tuple[dict, dict, int, int, dict]:
        problem = ctx.backend.problem
        layers: dict[str, _Layer] = {}
        cross: dict[str, float] = {}
        n_total, passes = 0, 0
        budget = SampleBudget(ctx, "decomposition")
        progress = progress_reporter(ctx, "decomposition")
        for _, y, rows in iter_rows(problem, "logits", taps, tap_outputs=True, progress=progress,
                                    chunk=route.chunk, budget=budget):
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
            for i, j, name in shared_pairs([(t.call, t.h) for t in rows.taps]):
                # 2 (h_i·h_j) Tr(A D_i D_jᵀ), D = ∂f/∂z of each call
                ti, tj = rows.taps[i], rows.taps[j]
                Dij = ti.dz.flatten(2).to(torch.float64) @ tj.dz.flatten(2).to(torch.float64).transpose(1, 2)
                cross[name] = cross.get(name, 0.0) + (2 * _dot(ti.h, tj.h) * (A * Dij).sum((1, 2))).sum().item()
            n_total += y.shape[0]
            passes += rows.out.shape[1]
        return layers, {name: v / n_total for name, v in cross.items()}, n_total, passes, budget.cut or {}

    def _estimate(self, ctx: ProbeContext, options: DecompositionOptions, taps,
                  route) -> tuple[dict, dict, int, int, dict]:
        """Matrix-free: λmax(M_l) = σ_max(∂f/∂z_l)² by Lanczos on M_l; centered = Tr(A M_l) =
        E[⟨∂f/∂z_lᵀ w', ∂f/∂z_lᵀ w⟩] with w = Σ_k √|λ_k| ξ_k U_k, w' the same with sign(λ_k),
        ξ Rademacher over the loss's output-Hessian factors A = Σ_k λ_k U_k U_kᵀ. A shared dense
        weight's cross term 2 (h_i·h_j) Tr(A D_i D_jᵀ) comes from the same draws."""
        problem = ctx.backend.problem
        model, k = problem.model, options.projections
        budget = SampleBudget(ctx, "decomposition (estimate)")
        should_stop = budget.should_stop
        progress = progress_reporter(ctx, "decomposition (estimate)")
        layers: dict[str, _Layer] = {}
        cross: dict[str, float] = {}
        n_total, passes, unconverged, worst, total_var = 0, 0, 0, 0.0, 0.0
        for index, x, y in iter_chunks(problem, route.chunk, budget, progress):
            with model_mode(model, problem.bn_mode):
                jp = JacobianProducts(model, x, "logits", taps, tap_outputs=True)
            b = x.shape[0]
            U, lam = output_hessian_factors(jp.logits.detach(), y, problem.loss)
            U, lam = U.to(torch.float64).cpu(), lam.to(torch.float64).cpu()
            signed = bool((lam < 0).any())
            xi = rademacher(ctx.seed, index, b, lam.shape[1], PROBE_STREAM, draws=k)
            outs = [jp.output_index(i) for i in range(len(jp.calls))]
            draws = torch.zeros(len(outs), b, k, dtype=torch.float64)
            pairs = shared_pairs([(c, c.input) for c in jp.calls])
            cross_draws = torch.zeros(len(pairs), b, k, dtype=torch.float64)
            for j in range(k):
                w = torch.einsum("bck,bk->bc", U, lam.abs().sqrt() * xi[j])
                g = jp.vjp(w, outs)
                g2 = jp.vjp(torch.einsum("bck,bk->bc", U, lam.sign() * lam.abs().sqrt() * xi[j]), outs) if signed else g
                for li, (a, a2) in enumerate(zip(g, g2)):
                    draws[li, :, j] = (a.flatten(1).to(torch.float64) * a2.flatten(1).to(torch.float64)).sum(1).cpu()
                for pi, (li, lj, _) in enumerate(pairs):
                    cross_draws[pi, :, j] = (_dot(g2[li], g[lj]) + _dot(g2[lj], g[li])).cpu()
            if problem.loss.name in ("cross_entropy", "label_smoothing"):
                factor = torch.full((b,), 2.0, dtype=torch.float64)
            else:
                factor = (lam * U.pow(2).sum(1)).sum(1)  # Tr(A)
            total_draws = torch.zeros(b, k, dtype=torch.float64)
            for li, call in enumerate(jp.calls):
                start = gaussian(ctx.seed, index, b, jp.num_classes, (LANCZOS_STREAM, outs[li]))
                norms = lanczos_sigma(jp.gram(outs[li]), start, options.lanczos_iters, options.lanczos_tol, should_stop)
                unconverged += int((~norms.converged).sum())
                worst = max(worst, norms.residual.max().item())
                s_ = patch_sqnorm(call.module, call.input.detach()).cpu()
                exact = isinstance(call.module, nn.Linear) and call.input.ndim == 2
                layer = layers.setdefault(call.key, _Layer(call.module, exact))
                centered = draws[li].mean(1)
                layer.add(s_, norms.sigma.pow(2), centered, factor)
                layer.add_errors(s_, draws[li], norms, factor)
                total_draws += s_.unsqueeze(1) * draws[li]
            for pi, (li, lj, name) in enumerate(pairs):
                hh = _dot(jp.calls[li].input.detach(), jp.calls[lj].input.detach()).cpu()
                cross_draws[pi] *= hh.unsqueeze(1)
                cross[name] = cross.get(name, 0.0) + cross_draws[pi].mean(1).sum().item()
                total_draws += cross_draws[pi]
            total_var += (total_draws.var(1, unbiased=True) / k).sum().item()
            n_total += b
            passes += jp.backward_passes
            jp.close()
        extra = {"total_stderr": math.sqrt(total_var) / n_total, "projections": k, "lanczos": {"max_iters": options.lanczos_iters, "tol": options.lanczos_tol,
                                               "unconverged": unconverged, "max_relative_residual": worst}}
        if should_stop is not None and should_stop():
            extra["stop_reason"] = "budget"
        extra.update(budget.cut or {})
        return layers, {name: v / n_total for name, v in cross.items()}, n_total, passes, extra



def shared_pairs(calls: list[tuple]) -> list[tuple[int, int, str]]:
    """(i, j, weight name) for every pair of calls i < j of one dense layer (a Linear on one
    vector per sample): a weight used twice, whose Tr(G) holds the cross terms between its
    calls beside each call's own term. Conv calls are left out: their terms are approximate."""
    dense = [(i, c) for i, (c, h) in enumerate(calls) if isinstance(c.module, nn.Linear) and h.ndim == 2]
    return [(i, j, _weight_name(ci.key.split("#")[0]))
            for a, (i, ci) in enumerate(dense) for j, cj in dense[a + 1:] if cj.module is ci.module]


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Per-sample inner products of two (B, …) tensors, in float64."""
    return (a.flatten(1).to(torch.float64) * b.flatten(1).to(torch.float64)).sum(1)


def _pm(stderr: float | None) -> str:
    return "" if stderr is None else f" ± {stderr:.2g}"


def _weight_name(module_name: str) -> str:
    return "weight" if module_name == "<root>" else f"{module_name}.weight"
