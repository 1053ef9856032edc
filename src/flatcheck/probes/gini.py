"""Gini: mean Gini impurity 1 − ‖p‖², with mean entropy, accuracy and mean loss."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..report.result import ProbeResult
from .kit import accuracy, loss_statistic, progress_reporter, sample_means
from ..backends.base import Outputs
from .gating import Gating
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class GiniOptions:
    pass


@register_probe
class GiniProbe:
    """Exact averages over the sample set of 1 − ‖p_n‖², the entropy −Σ p log p (nats),
    top-1 accuracy and the loss of the spec; p = softmax of the logits."""

    name: ClassVar[str] = "gini"
    gating: ClassVar[Gating] = Gating(loss_curvature=False)  # exact averages of p
    summary: ClassVar[str] = "1 − ‖p‖², entropy, accuracy, mean loss"
    Options: ClassVar[type] = GiniOptions
    requires: ClassVar[frozenset[type]] = frozenset({Outputs})
    command_help: ClassVar[str] = "Mean Gini impurity 1 − ‖p‖², entropy, accuracy and mean loss over the sample set."

    def run(self, ctx: ProbeContext, options: GiniOptions) -> ProbeResult:
        start = time.perf_counter()
        progress = progress_reporter(ctx, "gini")
        loss_spec = ctx.backend.problem.loss

        def impurity(logits, y):
            return 1 - logits.to(torch.float64).softmax(-1).pow(2).sum(-1)

        def entropy(logits, y):
            logp = logits.to(torch.float64).log_softmax(-1)
            return -(logp.exp() * logp).sum(-1)

        gini, entropy_, accuracy_, loss = sample_means(ctx.backend, impurity, entropy, accuracy,
                                                       loss_statistic(ctx.backend))
        if progress is not None:  # one pass over the samples: its end line, as every probe has
            progress(1, 1, value=gini)
        return ProbeResult(
            probe=self.name,
            value=gini,
            stderr=None,
            matvecs=0,
            seconds=time.perf_counter() - start,
            label="mean 1−‖p‖²",
            notes=f"accuracy {accuracy_:.4f}, loss {loss:.4g}, entropy {entropy_:.4g}",
            details={"entropy": entropy_, "accuracy": accuracy_, "loss": loss, "loss_name": loss_spec.name},
        )
