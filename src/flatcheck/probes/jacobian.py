"""Jacobian: input-output Jacobian norms ‖J(x_n)‖_F and ‖J(x_n)‖_2, mean and max over S."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ..backends.base import Outputs
from ..problem import model_mode
from ..errors import ConfigError, setting
from ..linalg.memory import gib
from ..report.result import ProbeResult
from ._inputjac import (AUTO_MAX_CLASSES, OUTPUT_HELP, ROW_BYTES, jacobian_rows, region_mask, require_independent,
                        spectral_stats, summarise)
from ._jacfree import (LANCZOS_STREAM, PROBE_STREAM, JacobianProducts, gaussian, iter_chunks, lanczos_sigma, plan,
                       rademacher)
from .kit import SampleBudget, option, progress_reporter
from .gating import Gating
from .registry import ProbeContext, register_probe



@dataclass(frozen=True)
class JacobianOptions:
    output: Literal["logits", "softmax", "sigmoid"] = option("logits", OUTPUT_HELP)
    exclude_region: str | None = option(  # "y,x,h,w" in pixels
        None, "y,x,h,w: also the Frobenius norm outside this pixel box, rescaled to its area")
    method: Literal["auto", "exact", "estimate"] = option(
        "auto", "auto, exact (C backward passes) or estimate (random projections + Lanczos)")
    projections: int = option(64, "random output projections per sample (estimate)")
    lanczos_iters: int = option(300, "most Lanczos iterations per sample for the spectral norm (estimate)")
    lanczos_tol: float = option(1e-4, "Lanczos stops at relative residual ‖JJᵀy − θy‖/θ ≤ TOL, a bound on the "
                                      "relative error of σ_max (estimate)")

    def __post_init__(self):
        if self.exclude_region is not None:
            parse_region(self.exclude_region)
        if self.projections < 2:
            raise ConfigError(f"{setting('projections')} must be at least 2 (a standard error needs two draws), got {self.projections}")
        if self.lanczos_iters < 1 or not (math.isfinite(self.lanczos_tol) and self.lanczos_tol > 0):
            raise ConfigError(f"jacobian.lanczos_iters must be ≥ 1 and jacobian.lanczos_tol > 0, got "
                              f"{self.lanczos_iters} and {self.lanczos_tol}")

    @property
    def region(self) -> tuple[int, int, int, int] | None:
        return None if self.exclude_region is None else parse_region(self.exclude_region)


def parse_region(text: str) -> tuple[int, int, int, int]:
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != 4 or values[0] < 0 or values[1] < 0 or values[2] < 1 or values[3] < 1:
        raise ConfigError(f"{setting('exclude_region')} expects y,x,h,w (4 integers, h and w ≥ 1), got {text!r}")
    return values  # type: ignore[return-value]


def choose_method(method: str, num_classes: int, input_dim: int) -> tuple[str, str]:
    """The route and why (details.route_reason)."""
    if method != "auto":
        return method, f"method={method}"
    rows = num_classes * input_dim * 8
    if num_classes > AUTO_MAX_CLASSES:
        return "estimate", f"auto: {num_classes} classes > {AUTO_MAX_CLASSES}"
    if rows > ROW_BYTES:
        return "estimate", f"auto: a sample's {num_classes}×{input_dim} rows ({gib(rows)}) exceed {gib(ROW_BYTES)}"
    return "exact", f"auto: {num_classes} classes ≤ {AUTO_MAX_CLASSES} and a sample's rows ({gib(rows)}) fit {gib(ROW_BYTES)}"


@register_probe
class JacobianProbe:
    """Per sample n: ‖J_n‖_F and ‖J_n‖_2 of J_n = ∂f(x_n)/∂x_n (f = logits or softmax(logits));
    value = mean over S of ‖J_n‖_F; details hold mean and max of both norms (MacDonald et al.
    2023 use the max of the spectral norm of the softmaxed model).

    method exact: the C rows of every J_n (C batched backward passes), norms from its singular
    values. method estimate (auto picks it when C > 128 or C·D is large): ‖J_n‖²_F from K
    Rademacher projections, unbiased, with standard error; ‖J_n‖_F = its square root (bias
    O(se²), delta-method stderr); ‖J_n‖_2 by Lanczos on the C×C J_nJ_nᵀ, with the relative
    residual and the error bound r/σ it gives, as mls and decomposition take theirs. Sample n's
    projections and start vector are drawn from its own generator, mls's for x: the two probes
    give the same estimates draw for draw, whatever the chunking. Lanczos takes fewer products than a
    power iteration on JᵀJ for the same residual, and exact once C steps exhaust the space.

    --exclude-region y,x,h,w: per sample √(‖J_out‖²_F / n_out) · √n_region, J_out the columns of
    J at pixels outside the region (all channels). n counts spatial positions only
    (n_out = H·W − h·w, n_region = h·w, as in Table 3 of Anonymous 2025, "Sharpness can be
    manipulated and misleading for generalization": 32×32 − 8×8 and 8×8 for RGB input);
    counting channels too would multiply both n by the channel count, which cancels.

    Eval-mode BatchNorm only: batch statistics make J_n depend on the other samples.
    """

    name: ClassVar[str] = "jacobian"
    summary: ClassVar[str] = "input-output Jacobian Frobenius and spectral norms (mean, max)"
    Options: ClassVar[type] = JacobianOptions
    requires: ClassVar[frozenset[type]] = frozenset({Outputs})
    gating: ClassVar[Gating] = Gating(quantity_options=("output",), tolerance_option="lanczos_tol",
                                      routes=frozenset({"exact", "estimate"}), loss_curvature=False)
    command_help: ClassVar[str] = "Input-output Jacobian norms per sample (Frobenius, spectral): mean and max."

    def run(self, ctx: ProbeContext, options: JacobianOptions) -> ProbeResult:
        start = time.perf_counter()
        problem = ctx.backend.problem
        model = problem.model
        require_independent(model, problem.bn_mode, self.name)
        first = next(iter(problem.samples)).x
        x_shape = tuple(first.shape[1:])
        input_dim = math.prod(x_shape)
        with model_mode(model, problem.bn_mode), torch.no_grad():
            num_classes = model(first[:1]).shape[1]
        method, reason = choose_method(options.method, num_classes, input_dim)
        # either route's chunk of samples planned as mls plans them: refused up front (exit 2, the
        # bytes) when one sample's cannot fit --max-memory
        with model_mode(model, problem.bn_mode):
            memory = plan(model, first[:1], options.output, [], method, ctx.memory_allowance, self.name).details()
        region = options.region
        mask = region_mask(x_shape, region) if region is not None else None
        eps = torch.finfo(first.dtype).eps
        # exact: whole batches, their rows in planned chunks; estimate: planned chunks, each
        # sample's draws from its own generator, so the values do not depend on the chunking
        chunk = problem.samples.batch_size if method == "exact" else memory["chunk_samples"]

        fro, fro_se, spec, resid, spec_err, outside, outside_se = [], [], [], [], [], [], []
        passes, iters = 0, 0
        progress = progress_reporter(ctx, f"jacobian ({method})")
        # under --budget, pieces the budget can end between (each sample's draws are its own)
        budget = SampleBudget(ctx, f"jacobian ({method})")
        with model_mode(model, problem.bn_mode):
            for index, xb, _ in iter_chunks(problem, chunk, budget, progress):
                if method == "exact":
                    for first_row in range(0, xb.shape[0], memory["chunk_samples"]):
                        rows = jacobian_rows(model, xb[first_row:first_row + memory["chunk_samples"]], options.output)
                        stats = spectral_stats(rows.dx, eps)
                        fro.append(stats.frobenius)
                        spec.append(stats.spectral)
                        if mask is not None:
                            sq = rows.dx.to(torch.float64).pow(2) * mask.to(rows.dx.device)
                            outside.append(sq.flatten(1).sum(1))
                        passes += num_classes
                else:
                    jp = JacobianProducts(model, xb, options.output, [])
                    sq, sq_out = self._projected_sqnorms(jp, ctx.seed, index, options.projections, mask)
                    est, var = sq.mean(1), sq.var(1) / options.projections
                    fro.append(est.sqrt())
                    fro_se.append(var.sqrt() / (2 * est.sqrt()).clamp_min(torch.finfo(torch.float64).tiny))
                    if sq_out is not None:
                        outside.append(sq_out.mean(1))
                        outside_se.append(sq_out.var(1) / options.projections)
                    start_vectors = gaussian(ctx.seed, index, xb.shape[0], jp.num_classes, (LANCZOS_STREAM, 0))
                    norms = lanczos_sigma(jp.gram(0), start_vectors, options.lanczos_iters, options.lanczos_tol,
                                          budget.should_stop)
                    jp.close()
                    spec.append(norms.sigma)
                    resid.append(norms.residual)
                    spec_err.append(norms.error)
                    passes += jp.backward_passes
                    iters = max(iters, int(norms.iterations.max()))

        fro_t, spec_t = torch.cat(fro).cpu(), torch.cat(spec).cpu()
        n = fro_t.numel()
        details = {
            "method": method,
            "route": method,  # as mls and decomposition name it
            "route_reason": reason,
            "output": options.output,
            "num_classes": num_classes,
            "input_dim": input_dim,
            "samples": n,
            "backward_passes": passes,  # batched reverse-mode passes; the probe makes no curvature products
            "frobenius": summarise(fro_t),
            "spectral": summarise(spec_t),
            "memory": memory,  # the route's plan under --max-memory
        }
        stderr = None
        if method == "estimate":
            se_t = torch.cat(fro_se).cpu()
            stderr = se_t.pow(2).sum().sqrt().item() / n
            details["frobenius"]["mean_stderr"] = stderr
            details["frobenius"]["max_stderr"] = se_t[details["frobenius"]["argmax"]].item()
            details["frobenius_sq_mean"] = fro_t.pow(2).mean().item()  # unbiased for (1/N) Σ ‖J_n‖²_F
            details["frobenius_sq_mean_stderr"] = (se_t * 2 * fro_t).pow(2).sum().sqrt().item() / n
            details["projections"] = options.projections
            r_t = torch.cat(resid).cpu()
            details["spectral"].update(max_residual=r_t.max().item(), max_error_bound=torch.cat(spec_err).max().item(),
                                       lanczos_iterations=iters, unconverged=int((r_t > options.lanczos_tol).sum()),
                                       lanczos_tol=options.lanczos_tol)
        else:
            details["frobenius_sq_mean"] = fro_t.pow(2).mean().item()
        if mask is not None:
            details["excluded"] = self._excluded(region, mask, torch.cat(outside).cpu(),
                                                 torch.cat(outside_se).cpu() if outside_se else None)
        notes = (f"{method}, {options.output}: ‖J‖_F max {details['frobenius']['max']:.4g}; "
                 f"‖J‖_2 mean {details['spectral']['mean']:.4g}, max {details['spectral']['max']:.4g}")
        if mask is not None:
            notes += f"; excluded-region ‖J‖_F mean {details['excluded']['mean']:.4g}"
        if method == "estimate" and details["spectral"]["unconverged"]:
            notes += f"; Lanczos: {details['spectral']['unconverged']} samples above residual tol"
        if budget.cut is not None:
            details.update(budget.cut)
            notes += f"; {budget.cut['unresolved_reason']}"
        return ProbeResult(
            probe=self.name, value=details["frobenius"]["mean"], stderr=stderr, matvecs=0,
            seconds=time.perf_counter() - start, seed=ctx.seed if method == "estimate" else None,
            label=f"mean ‖J_x‖_F ({options.output})", notes=notes, details=details,
            resolved=budget.cut is None,
        )

    @staticmethod
    def _projected_sqnorms(jp: JacobianProducts, seed: int, index: int, projections: int,
                           mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """‖J_nᵀ r_k‖² for K Rademacher r_k ∈ {±1}^C per sample, (B, K) float64, and the same over
        the pixels where `mask` (H, W) is True (all channels), or None. E[r rᵀ] = I makes each
        draw unbiased for ‖J_n‖²_F; no C×D object exists. Sample n's draws come from its own
        generator, mls's for x (the same r), whatever the chunking."""
        b, c = jp.out.shape
        r = rademacher(seed, index, b, c, PROBE_STREAM, draws=projections)
        full = torch.zeros(b, projections, dtype=torch.float64)
        outside = torch.zeros(b, projections, dtype=torch.float64) if mask is not None else None
        for k in range(projections):
            (g,) = jp.vjp(r[k], [0])
            g = g.to(torch.float64).pow(2)
            full[:, k] = g.flatten(1).sum(1).cpu()
            if outside is not None:
                outside[:, k] = (g * mask.to(g.device)).flatten(1).sum(1).cpu()
        return full, outside

    @staticmethod
    def _excluded(region, mask, sq_out, var_out) -> dict:
        n_out = int(mask.sum())
        n_region = mask.numel() - n_out
        scale = n_region / n_out
        values = (sq_out * scale).clamp_min(0).sqrt()
        out = {"region": list(region), "n_out": n_out, "n_region": n_region, **summarise(values)}
        if var_out is not None:
            se = (var_out * scale**2).sqrt() / (2 * values).clamp_min(torch.finfo(torch.float64).tiny)
            out["mean_stderr"] = se.pow(2).sum().sqrt().item() / values.numel()
        return out
