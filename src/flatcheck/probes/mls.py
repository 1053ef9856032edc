"""MLS (Chen et al. 2023 §3): MLS, normalized MLS, NMLS, log local volume, local dimensionality,
and the right-hand sides of the MLS / NMLS bounds next to the quantities."""

from __future__ import annotations

import dataclasses
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
from ._jacfree import (LANCZOS_STREAM, PROBE_STREAM, JacobianProducts, MatrixFreeOptions, gaussian, iter_chunks,
                       lanczos_sigma, local_dimension, plan, rademacher)
from .kit import SampleBudget, option, progress_reporter
from ..backends.base import Outputs
from ..problem import model_mode
from .gating import Gating
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class MLSOptions(MatrixFreeOptions):
    output: Literal["logits", "softmax", "sigmoid"] = option("logits", OUTPUT_HELP)
    # per layer, the estimate route runs one Lanczos per sample on every Linear/Conv input (a
    # ViT-S/16 has 50): nearly all of its cost, and nothing a normalized-MLS scan plots
    nmls: bool = option(True, "NMLS: the sensitivity ‖∂f/∂h‖₂ of every Linear/Conv input, and the per-layer "
                              "bounds; off, only the input Jacobian (MLS, normalized MLS, local dimensionality), "
                              "at a fraction of the cost on large models", flags=("--nmls/--no-nmls",))


class _Layer:
    """Running per-sample sums for one call site of a Linear/Conv layer."""

    def __init__(self, module: nn.Module, dense: bool, shape: tuple[int, ...]):
        self.module, self.dense, self.shape = module, dense, shape  # shape: one sample's input h
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
    # J of the logits is not J of the softmax
    gating: ClassVar[Gating] = Gating(quantity_options=("output",), tolerance_option="lanczos_tol",
                                      routes=frozenset({"exact", "estimate"}), loss_curvature=False)
    command_help: ClassVar[str] = "MLS, normalized MLS, NMLS, log local volume and local dimensionality, with bounds."

    def run(self, ctx: ProbeContext, options: MLSOptions) -> ProbeResult:
        start = time.perf_counter()
        problem = ctx.backend.problem
        require_independent(problem.model, problem.bn_mode, self.name)
        taps = named_matching(problem.model, is_linear_like) if options.nmls else []
        x1 = next(iter(problem.samples)).x[:1]
        with model_mode(problem.model, problem.bn_mode):
            route = plan(problem.model, x1, options.output, taps, options.method, ctx.memory_allowance, self.name,
                         tap_outputs=True)
        if route.route == "estimate":
            result = self._estimate(ctx, options, taps, route)
        else:
            result = self._exact(ctx, options, taps, route)
        result.details.update(route.details())
        if not options.nmls:
            for key in ("nmls", "nmls_bound", "nmls_error_bound", "mls_bound"):
                if key in result.details:
                    result.details[key] = None
            result.details["nmls_reason"] = "not computed: nmls=false (only the input Jacobian was taken)"
            for key in ("mls_bound_reason", "nmls_bound_reason"):
                result.details[key] = "not computed: nmls=false (the bound needs the first layer's gradients)"
        return dataclasses.replace(result, seconds=time.perf_counter() - start)

    def _exact(self, ctx: ProbeContext, options: MLSOptions, taps, route) -> ProbeResult:
        problem = ctx.backend.problem
        eps = None
        spec, norm_spec, logvol, rank, ldim = [], [], [], [], []
        layers: dict[str, _Layer] = {}
        first_is_input = True
        first_key = None
        passes = 0
        budget = SampleBudget(ctx, "mls")
        progress = progress_reporter(ctx, "mls")
        for x, _, rows in iter_rows(problem, options.output, taps, tap_outputs=True, progress=progress,
                                   chunk=route.chunk, budget=budget):
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
                layer = layers.setdefault(key, _Layer(tap.call.module, dense, tuple(tap.h.shape[1:])))
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
                "input_shape": list(layer.shape),
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
            **bound_reasons(per_layer, first_key, first_is_input),
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
        nmls_note = (f"NMLS {nmls:.4g} (bound {_fmt_bound(nmls_bound, details['nmls_bound_reason'])})"
                     if options.nmls else "NMLS off")
        notes = (f"MLS {mls:.4g} (bound {_fmt_bound(mls_bound, details['mls_bound_reason'])}), {nmls_note}, "
                 f"normalized MLS {details['normalized_mls']:.4g}, log-vol {details['log_volume']:.4g}, "
                 f"local dim {details['local_dimensionality']:.4g}")
        if budget.cut is not None:
            details.update(budget.cut)
            notes += f"; {budget.cut['unresolved_reason']}"
        return ProbeResult(probe=self.name, value=mls, stderr=None, matvecs=0, seconds=0.0,
                           label=f"MLS ({options.output})", notes=notes, details=details,
                           resolved=budget.cut is None)

    def _estimate(self, ctx: ProbeContext, options: MLSOptions, taps, route) -> ProbeResult:
        """The matrix-free route: per sample, σ_max of J_x and of every ∂f/∂h_l by Lanczos on
        JJᵀ, Tr(JJᵀ) and Tr((JJᵀ)²) of J_x and ‖∂f/∂z_l‖²_F of the dense layers by Hutchinson."""
        problem = ctx.backend.problem
        model, k = problem.model, options.projections
        budget = SampleBudget(ctx, "mls (estimate)")
        should_stop = budget.should_stop
        progress = progress_reporter(ctx, "mls (estimate)")
        sig, sig_err, norm_sig, norm_err, t1s, t2s = [], [], [], [], [], []
        layers: dict[str, dict] = {}
        iters, unconverged, worst = [], 0, 0.0
        first_key, first_is_input, passes = None, True, 0
        for index, x, _ in iter_chunks(problem, route.chunk, budget, progress):
            with model_mode(model, problem.bn_mode):
                jp = JacobianProducts(model, x, options.output, taps, tap_outputs=True)
            b, c = jp.out.shape
            dense = [isinstance(call.module, nn.Linear) and call.input.ndim == 2 for call in jp.calls]
            # Hutchinson: one reverse pass per draw gives Jᵀr at x and every dense layer's output
            r = rademacher(ctx.seed, index, b, c, PROBE_STREAM, draws=k)
            t1, t2 = torch.zeros(b, k, dtype=torch.float64), torch.zeros(b, k, dtype=torch.float64)
            dz_sq = {i: torch.zeros(b, k, dtype=torch.float64) for i, d in enumerate(dense) if d}
            for j in range(k):
                grads = jp.vjp(r[j], [0] + [jp.output_index(i) for i in dz_sq])
                t1[:, j] = _sq(grads[0])
                t2[:, j] = jp.jv(0, grads[0]).pow(2).sum(1).cpu()  # ‖JJᵀr‖²
                for g, i in zip(grads[1:], dz_sq):
                    dz_sq[i][:, j] = _sq(g)
            t1s.append(t1)
            t2s.append(t2)
            # Lanczos on J_x J_xᵀ, then on every layer's ∂f/∂h_l (∂f/∂h_l)ᵀ
            targets = [(0, None)] + [(jp.input_index(i), i) for i in range(len(jp.calls))]
            for t, i in targets:
                start = gaussian(ctx.seed, index, b, c, (LANCZOS_STREAM, t))
                norms = lanczos_sigma(jp.gram(t), start, options.lanczos_iters, options.lanczos_tol, should_stop)
                iters.append(norms.iterations)
                unconverged += int((~norms.converged).sum())
                worst = max(worst, norms.residual.max().item())
                if i is None:
                    x_norm = x.flatten(1).to(torch.float64).norm(dim=1).cpu()
                    sig.append(norms.sigma)
                    sig_err.append(norms.error)
                    norm_sig.append(x_norm * norms.sigma)
                    norm_err.append(x_norm * norms.error)
                    continue
                call = jp.calls[i]
                if i == 0:
                    first_key = call.key
                    h = call.input.detach().flatten(1)
                    first_is_input &= bool(h.shape == x.flatten(1).shape and torch.equal(h, x.flatten(1)))
                layer = layers.setdefault(call.key, {"module": call.module, "dense": dense[i], "sens": [], "err": [],
                                                     "inv_h_sq": [], "grad_w_sq": [],
                                                     "shape": tuple(call.input.shape[1:])})
                layer["sens"].append(norms.sigma)
                layer["err"].append(norms.error)
                h_sq = call.input.detach().flatten(1).to(torch.float64).pow(2).sum(1).cpu()
                layer["inv_h_sq"].append(1 / h_sq)
                if dense[i]:
                    layer["grad_w_sq"].append(dz_sq[i] * h_sq.unsqueeze(1))  # draws of ‖∇_W f‖²_F
            passes += jp.backward_passes
            jp.close()

        n = sum(len(v) for v in sig)
        sig_t, err_t = torch.cat(sig), torch.cat(sig_err)
        per_layer = {key: _estimated_layer(v, n) for key, v in layers.items()}
        nmls = sum(v["sensitivity"] for v in per_layer.values())
        all_dense = bool(per_layer) and all(v["dense"] for v in per_layer.values())
        nmls_bound = sum(v["bound"] for v in per_layer.values()) if all_dense else None
        mls_bound = per_layer[first_key]["bound"] if first_key is not None and first_is_input else None
        t1_t, t2_t = torch.cat(t1s), torch.cat(t2s)
        ld, ld_se = local_dimension(t1_t, t2_t)
        fro = t1_t.mean(1)
        fro_se = t1_t.var(1, unbiased=True).sqrt() / math.sqrt(k)
        it = torch.cat(iters).to(torch.float64)
        details = {
            "output": options.output,
            "mls": sig_t.mean().item(),
            "mls_error_bound": err_t.mean().item(),
            "mls_bound": mls_bound,
            **bound_reasons(per_layer, first_key, first_is_input),
            "normalized_mls": torch.cat(norm_sig).mean().item(),
            "normalized_mls_error_bound": torch.cat(norm_err).mean().item(),
            "nmls": nmls,
            "nmls_error_bound": sum(v["sensitivity_error_bound"] for v in per_layer.values()),
            "nmls_bound": nmls_bound,
            "log_volume": None,
            "mean_rank": None,
            "null_reason": ("log_volume and mean_rank need every singular value of J, which the matrix-free "
                            f"route ({route.num_classes} classes) does not compute; use method=exact where "
                            "the C×D rows fit"),
            "local_dimensionality": ld.mean().item(),
            "local_dimensionality_stderr": ld_se.pow(2).sum().sqrt().item() / n,
            "frobenius_sq_mean": fro.mean().item(),  # Tr(JJᵀ) = ‖J_x‖²_F, mean over S
            "frobenius_sq_mean_stderr": fro_se.pow(2).sum().sqrt().item() / n,
            "per_layer": per_layer,
            "projections": k,
            "lanczos": {"max_iters": options.lanczos_iters, "tol": options.lanczos_tol,
                        "iterations_mean": it.mean().item(), "iterations_max": int(it.max().item()),
                        "unconverged": unconverged, "max_relative_residual": worst,
                        "stop_reason": "budget" if should_stop is not None and should_stop() else "converged"
                        if unconverged == 0 else "max_iters"},
            "backward_passes": passes,  # batched reverse passes, double-VJP ones included
        }
        if details["lanczos"]["stop_reason"] == "budget":
            details["stop_reason"] = "budget"
        cut = budget.cut
        if cut is not None:
            details.update(cut)
        nmls_note = f"NMLS {nmls:.4g} ± {details['nmls_error_bound']:.2g}" if options.nmls else "NMLS off"
        mls_bound_text = _fmt_bound(mls_bound, details["mls_bound_reason"])
        notes = (f"estimate: MLS {details['mls']:.4g} ± {details['mls_error_bound']:.2g} (bound {mls_bound_text}), "
                 f"{nmls_note}, normalized MLS "
                 f"{details['normalized_mls']:.4g}, local dim {details['local_dimensionality']:.4g} ± "
                 f"{details['local_dimensionality_stderr']:.2g}; log-vol n/a (needs every σ)")
        if unconverged:
            notes += f"; Lanczos: {unconverged} norms above tol"
        if cut is not None:
            notes += f"; {cut['unresolved_reason']}"
        # Lanczos values: within their residual bound of the exact mean, not exact
        return ProbeResult(probe=self.name, value=details["mls"], stderr=None, matvecs=0, seconds=0.0,
                           error_bound=details["mls_error_bound"],
                           seed=ctx.seed, label=f"MLS ({options.output})", notes=notes, details=details,
                           resolved=cut is None)


def bound_reasons(per_layer: dict, first_key: str | None, first_is_input: bool) -> dict:
    """Why mls_bound and nmls_bound are null (each None where its bound is given), in the words
    a table note and the JSON both carry: the layer that rules the bound out, the input the
    bound needs against the one the layer got, and that the quantity stands without it."""
    not_dense = [f"{key} ({_kind(v)})" for key, v in per_layer.items() if not v["dense"]]
    # Chen et al. 2023 §3 state the bound for a dense layer z = W h + b, one vector h per sample
    identity = ("the bound rests on ‖∇_W f‖_F = ‖∂f/∂z‖_F·‖h‖, true for a Linear on one vector per sample and "
                "false where one weight is shared over positions (a conv, a Linear over a sequence)")
    if first_key is None:
        mls_reason = "no Linear/Conv layer, so no first layer to bound MLS by"
    elif not first_is_input:
        mls_reason = (f"the first layer {first_key} does not take the input x itself (something transforms x "
                      "before it), and the bound needs ∂f/∂x = ∂f/∂h there")
    elif not per_layer[first_key]["dense"]:
        first = per_layer[first_key]
        what = f"the first layer {first_key} is a {_kind(first)}"
        if first["type"] == "Linear":
            shape = first["input_shape"]
            what += f", {math.prod(shape[:-1])} vectors a sample, where the bound needs one, (N, {shape[-1]})"
        mls_reason = (f"{what}: {identity}. MLS does not need the bound and stands as measured; only a model whose "
                      "first layer is a Linear on x flattened (an MLP) has one")
    else:
        mls_reason = None
    if not per_layer:
        nmls_reason = "no Linear/Conv layer"
    elif not_dense:
        shown = ", ".join(not_dense[:3]) + (f" and {len(not_dense) - 3} more" if len(not_dense) > 3 else "")
        nmls_reason = (f"not every layer is dense ({shown}): {identity}. NMLS does not need the bound and stands "
                       "as measured; each dense layer's own bound is in details.per_layer")
    else:
        nmls_reason = None
    return {"mls_bound_reason": mls_reason, "nmls_bound_reason": nmls_reason}


def _kind(layer: dict) -> str:
    """A layer's type; for a Linear fed more than one vector a sample, with the input it got."""
    shape = layer["input_shape"]
    if layer["type"] != "Linear" or len(shape) == 1:
        return layer["type"]
    return "Linear fed (" + ", ".join(["N", *map(str, shape)]) + ")"


def _fmt_bound(bound: float | None, reason: str | None) -> str:
    return f"{bound:.4g}" if bound is not None else f"n/a: {reason}"


def _sq(g: torch.Tensor) -> torch.Tensor:
    """Per-sample squared norm in float64."""
    return g.flatten(1).to(torch.float64).pow(2).sum(1).cpu()


def _estimated_layer(v: dict, n: int) -> dict:
    """A layer's mean sensitivity and Lanczos error bound over S and, for a dense layer, its
    bound ‖W‖₂ √(mean ‖h‖⁻²) √(mean ‖∇_W f‖²_F) from the Hutchinson draws, with the
    delta-method standard error of the last factor."""
    out = {"type": type(v["module"]).__name__, "dense": v["dense"], "input_shape": list(v["shape"]),
           "sensitivity": torch.cat(v["sens"]).mean().item(),
           "sensitivity_error_bound": torch.cat(v["err"]).mean().item(), "bound": None, "bound_stderr": None}
    if v["dense"]:
        draws = torch.cat(v["grad_w_sq"])  # (N, K)
        grad = draws.mean().item()
        grad_se = (draws.var(1, unbiased=True) / draws.shape[1]).sum().sqrt().item() / n
        w2 = torch.linalg.matrix_norm(v["module"].weight.detach().to(torch.float64), ord=2).item()
        inv = torch.cat(v["inv_h_sq"]).mean().item()
        out["bound"] = w2 * math.sqrt(inv) * math.sqrt(grad)
        out["bound_stderr"] = w2 * math.sqrt(inv) * grad_se / (2 * math.sqrt(grad)) if grad > 0 else 0.0
    return out
