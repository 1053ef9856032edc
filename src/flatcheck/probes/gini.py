"""Probe 8 (SPEC): mean Gini impurity 1 − ‖p‖², with mean entropy, accuracy and mean loss."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..losses import per_sample_loss
from ..report.result import ProbeResult
from ..backends.base import Outputs
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class GiniOptions:
    pass


@register_probe
class GiniProbe:
    """Exact averages over the sample set of 1 − ‖p_n‖², the entropy −Σ p log p (nats),
    top-1 accuracy and the loss of the spec; p = softmax of the logits."""

    name: ClassVar[str] = "gini"
    summary: ClassVar[str] = "1 − ‖p‖², entropy, accuracy, mean loss"
    Options: ClassVar[type] = GiniOptions
    requires: ClassVar[frozenset[type]] = frozenset({Outputs})

    def run(self, ctx: ProbeContext, options: GiniOptions) -> ProbeResult:
        start = time.perf_counter()
        loss_spec = ctx.backend.problem.loss
        sums = torch.zeros(4, dtype=torch.float64)
        for logits, y, weight in ctx.backend.outputs():
            logp = logits.to(torch.float64).log_softmax(-1)
            p = logp.exp()
            per_sample = torch.stack([
                1 - p.pow(2).sum(-1),
                -(p * logp).sum(-1),
                (logits.argmax(-1) == y).to(torch.float64),
                per_sample_loss(logits, y, loss_spec).to(torch.float64),
            ])
            sums += per_sample.mean(1).cpu() * weight
        gini, entropy, accuracy, loss = sums.tolist()
        return ProbeResult(
            probe=self.name,
            value=gini,
            stderr=None,
            matvecs=0,
            seconds=time.perf_counter() - start,
            label="mean 1−‖p‖²",
            notes=f"accuracy {accuracy:.4f}, loss {loss:.4g}, entropy {entropy:.4g}",
            details={"entropy": entropy, "accuracy": accuracy, "loss": loss, "loss_name": loss_spec.name},
        )
