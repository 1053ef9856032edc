"""Head trace (Taleghani et al. 2026, Theorem 1, Corollary 3): exact Hessian trace of the loss
w.r.t. the head."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from torch import Tensor

from ..backends import Hvp, Outputs, ParamLayout, rebuild
from ..errors import ConfigError, setting
from ._head import Head, HeadStatistics, head_statistics, resolve_head
from ..report.result import ProbeResult
from ._head import HEAD_HELP
from .kit import option, progress_reporter
from .gating import Gating
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class HeadTraceOptions:
    verify: bool = option(False, "recompute the head's Hessian diagonal with autograd and print both",
                          flags=("--verify",))
    # coordinates of the head whose autograd Hessian diagonal --verify computes
    verify_max: int = option(4096, "most head coordinates --verify computes (a seeded random subset above it)")
    verify_block: int = option(64, "basis vectors per Hessian-vector product pass of --verify")
    head: str | None = option(None, HEAD_HELP)  # module name; default: the spec's head, else auto-detected

    def __post_init__(self):
        if self.verify_max < 1:
            raise ConfigError(f"{setting('verify_max')} must be a positive integer, got {self.verify_max}")
        if self.verify_block < 1:
            raise ConfigError(f"head-trace.verify_block must be a positive integer, got {self.verify_block}")


@register_probe
class HeadTraceProbe:
    """Tr ∇²_{W,b} L for the final linear layer z = W·φ + b, exactly, from one forward per batch:

        Tr_W = (1/N) Σ_n Tr(A_n) ‖φ_n‖²,   Tr_b = (1/N) Σ_n Tr(A_n),   A_n = ∇²_z ℓ_n,

    for every loss (z is linear in W and b; for cross entropy Tr(A) = Σ_j p_j(1 − p_j), which
    is Taleghani et al. 2026, Theorem 1 and Corollary 3). φ is the head's input; for a conv
    head followed by global average pooling, the average patch. The value is Tr_W + Tr_b; each is reported.

    The head is the spec's (or `head`), whatever `--params` says: this is a trace over the
    head by definition. `verify` recomputes the Hessian diagonal of the head by autograd
    (basis-vector Hessian-vector products through the whole model); above `verify_max`
    coordinates it checks a seeded random subset of them and says so.
    """

    name: ClassVar[str] = "head-trace"
    gating: ClassVar[Gating] = Gating(loss_curvature=False)  # closed form
    summary: ClassVar[str] = "exact Hessian trace w.r.t. the final linear layer (closed form)"
    Options: ClassVar[type] = HeadTraceOptions
    requires: ClassVar[frozenset[type]] = frozenset({Outputs})
    command_help: ClassVar[str] = ("Exact Hessian trace w.r.t. the final linear layer (closed form), with relative "
                                   "flatness; --verify recomputes it with autograd.")
    shows_layers: ClassVar[bool] = True  # the weight and bias parts

    def requires_for(self, options: HeadTraceOptions) -> frozenset[type]:
        """--verify takes the head's Hessian diagonal from Hessian-vector products."""
        return self.requires | {Hvp} if options.verify else self.requires

    def run(self, ctx: ProbeContext, options: HeadTraceOptions) -> ProbeResult:
        backend = ctx.backend
        head = resolve_head(backend.problem.model, ctx.spec, options.head)
        start = time.perf_counter()
        stats = head_statistics(backend, head, diagonal=options.verify)
        closed_seconds = time.perf_counter() - start
        details = head_details(stats)
        details["closed_form_seconds"] = closed_seconds
        notes = (f"head {head.name}: Tr_W {stats.weight_trace:.6g}"
                 + (f", Tr_b {stats.bias_trace:.6g}" if stats.bias_trace is not None else ", no bias")
                 + f"; κ {stats.kappa:.4g}")
        matvecs, seed = 0, None
        if options.verify:
            if not isinstance(backend, Hvp):
                raise ConfigError(f"{setting('verify')} needs Hessian-vector products, which backend {backend.name} lacks")
            check = verify(ctx, head, stats, options)
            details["verify"] = check
            matvecs = check["matvecs"]
            seed = ctx.seed if check["subset"] else None
            notes += (f"; autograd {check['autograd']:.10g} vs closed form {check['closed_form']:.10g} "
                      f"(rel. diff {check['relative_difference']:.2e}"
                      + (f", {check['coordinates']} of {check['total_coordinates']} coordinates" if check["subset"]
                         else "") + f"; {check['autograd_seconds']:.3g}s vs {closed_seconds:.3g}s)")
        return ProbeResult(
            probe=self.name,
            value=stats.trace,
            stderr=None,
            matvecs=matvecs,
            seconds=time.perf_counter() - start,
            seed=seed,
            label="Tr(H) of head",
            notes=notes,
            details=details,
        )


def head_details(stats: HeadStatistics) -> dict:
    head = stats.head
    W = head.matrix()
    layers = {f"{head.name}.weight": {"value": stats.weight_trace, "stderr": None, "parameters": W.numel()}}
    if stats.bias_trace is not None:
        layers[f"{head.name}.bias"] = {"value": stats.bias_trace, "stderr": None, "parameters": W.shape[0]}
    return {
        "head": head.name,
        "head_kind": "conv" if head.is_conv else "linear",
        "classes": W.shape[0],
        "features": W.shape[1],
        "parameters": sum(p["parameters"] for p in layers.values()),
        "weight_trace": stats.weight_trace,
        "bias_trace": stats.bias_trace,
        "relative_flatness": stats.kappa,
        "mean_feature_sqnorm": stats.feature_sqnorm,
        "per_class_trace": {str(c): v for c, v in enumerate(stats.class_trace.tolist())},
        "layers": layers,
    }


def verify(ctx: ProbeContext, head: Head, stats: HeadStatistics, options: HeadTraceOptions) -> dict:
    """Autograd Hessian diagonal of the head against the closed-form one, on the same coordinates."""
    problem = ctx.backend.problem
    layout = ParamLayout.from_model(problem.model, head.param_names())
    closed = [stats.weight_diagonal.reshape(-1)]
    if stats.bias_diagonal is not None:
        closed.append(stats.bias_diagonal)
    closed_diag = torch.cat(closed)
    total = layout.dim
    subset = total > options.verify_max
    if subset:
        coords = torch.randperm(total, generator=ctx.generator())[: options.verify_max].sort().values
    else:
        coords = torch.arange(total)

    start = time.perf_counter()
    auto_diag = hessian_diagonal(rebuild(ctx.backend, layout=layout), coords,
                                 block=options.verify_block,
                                 progress=progress_reporter(ctx, "head-trace --verify (autograd)"))
    seconds = time.perf_counter() - start
    auto_sum = auto_diag.sum().item()
    closed_sum = closed_diag[coords].sum().item()
    scale = max(abs(closed_sum), torch.finfo(torch.float64).tiny)
    return {
        "autograd": auto_sum,
        "closed_form": closed_sum,
        "relative_difference": abs(auto_sum - closed_sum) / scale,
        "max_coordinate_difference": (auto_diag - closed_diag[coords]).abs().max().item(),
        "coordinates": len(coords),
        "total_coordinates": total,
        "subset": subset,
        "matvecs": len(coords),
        "autograd_seconds": seconds,
        "dtype": str(problem.dtype).removeprefix("torch."),
    }


def hessian_diagonal(backend, coords: Tensor, *, block: int = 64,
                     progress: Callable[[int, int], None] | None = None) -> Tensor:
    """H_ii for the flat coordinates `coords` of the backend's layout: one HVP per coordinate (float64)."""
    problem = backend.problem
    dim = problem.layout.dim
    out = []
    for start in range(0, len(coords), block):
        idx = coords[start : start + block]
        E = torch.zeros(len(idx), dim, dtype=problem.dtype, device=problem.device)
        rows, cols = torch.arange(len(idx), device=E.device), idx.to(E.device)
        E[rows, cols] = 1
        out.append(backend.hvp(E)[rows, cols].to(torch.float64).cpu())
        if progress is not None:
            progress(start + len(idx), len(coords))
    return torch.cat(out)
