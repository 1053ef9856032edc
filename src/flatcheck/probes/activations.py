"""Activations (Anonymous 2025, "Sharpness can be manipulated and misleading for generalization", §2):
activation frequency η and death frequency ξ per ReLU-like layer."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..backends.base import Outputs
from ..problem import model_mode
from ._hooks import is_relu_like, named_matching, record
from ..report.result import ProbeResult
from .kit import progress_reporter
from .gating import Gating
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class ActivationsOptions:
    pass


class _Counts:
    def __init__(self, module_type: str):
        self.type = module_type
        self.ever_active: torch.Tensor | None = None  # (positions,) bool
        self.active_total = 0  # Σ_n #active positions of sample n
        self.samples = 0

    def add(self, out: torch.Tensor) -> None:
        active = (out.detach() > 0).flatten(1)
        any_active = active.any(0).cpu()
        self.ever_active = any_active if self.ever_active is None else self.ever_active | any_active
        self.active_total += int(active.sum())
        self.samples += active.shape[0]

    def result(self) -> dict:
        positions = self.ever_active.numel()
        alive = int(self.ever_active.sum())
        return {
            "type": self.type,
            "positions": positions,
            "dead": positions - alive,
            "death_frequency": (positions - alive) / positions,
            # a position active for some sample is alive by definition, so every active count
            # already lies among the alive positions: η = mean_n #active_n / #alive, exactly
            "activation_frequency": self.active_total / (self.samples * alive) if alive else None,
        }


@register_probe
class ActivationsProbe:
    """For every call of a ReLU-like module (ReLU, ReLU6, LeakyReLU, PReLU, GELU, SiLU, ELU, Mish,
    Hardswish …, in-place variants, timm's activation classes of the same names), a position
    (an element of one sample's output: channel × spatial, or token × feature) is *active* for a
    sample when its output is > 0. Over the whole sample set S:

    - death frequency ξ = #(positions active for no sample) / #positions;
    - activation frequency η = mean over samples of #active / #(positions not dead).

    value = mean ξ over layers; per-layer values in details. One forward pass over S: the
    ever-active mask and the total active count are accumulated across batches, which is
    exact because active positions are never dead. Activations applied as functions inside
    a block's forward (F.relu) have no module and cannot be hooked. Evaluated in the run's
    --bn-mode (train mode: batch statistics of each batch).
    """

    name: ClassVar[str] = "activations"
    gating: ClassVar[Gating] = Gating(loss_curvature=False)  # exact counts
    summary: ClassVar[str] = "activation and death frequency per ReLU-like layer"
    Options: ClassVar[type] = ActivationsOptions
    requires: ClassVar[frozenset[type]] = frozenset({Outputs})
    command_help: ClassVar[str] = "Activation and death frequency of every ReLU-like layer over the sample set."

    def run(self, ctx: ProbeContext, options: ActivationsOptions) -> ProbeResult:
        start = time.perf_counter()
        problem = ctx.backend.problem
        modules = named_matching(problem.model, is_relu_like)
        progress = progress_reporter(ctx, "activations")
        counts: dict[str, _Counts] = {}

        def on_call(key, module, inp, out):
            counts.setdefault(key, _Counts(type(module).__name__)).add(out)

        with model_mode(problem.model, problem.bn_mode), torch.no_grad(), record(modules, on_call) as rec:
            for i, batch in enumerate(problem.samples):
                rec.reset()
                problem.model(batch.x)
                if progress is not None:
                    progress(i + 1, problem.samples.num_batches)

        layers = {key: c.result() for key, c in counts.items()}
        if not layers:
            return ProbeResult(probe=self.name, value=None, stderr=None, matvecs=0,
                               seconds=time.perf_counter() - start, label="mean death frequency",
                               notes="no hookable ReLU-like module in the model", details={"per_layer": {}})
        death = sum(v["death_frequency"] for v in layers.values()) / len(layers)
        etas = [v["activation_frequency"] for v in layers.values() if v["activation_frequency"] is not None]
        eta = sum(etas) / len(etas) if etas else None
        positions = sum(v["positions"] for v in layers.values())
        dead = sum(v["dead"] for v in layers.values())
        eta_text = "n/a" if eta is None else f"{eta:.4g}"
        return ProbeResult(
            probe=self.name, value=death, stderr=None, matvecs=0, seconds=time.perf_counter() - start,
            label="mean death frequency",
            notes=f"{len(layers)} layers: mean activation frequency {eta_text}; {dead}/{positions} positions dead",
            details={"mean_death_frequency": death, "mean_activation_frequency": eta,
                     "dead_positions": dead, "positions": positions, "bn_mode": problem.bn_mode,
                     "per_layer": layers},
        )
