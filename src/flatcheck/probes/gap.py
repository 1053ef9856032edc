"""Generalisation gap: loss and accuracy on train and test, and their difference."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import ClassVar, Literal

from ..backends import Outputs, rebuild
from ..data.batches import SampleSet
from ..data.registry import MissingSplitError
from ..errors import ConfigError, DataError
from ..report.result import ProbeResult
from .kit import loss_and_accuracy, option, progress_reporter
from .gating import Gating
from .registry import ProbeContext, register_probe


@dataclass(frozen=True)
class GapOptions:
    # "skip": report no value (with the reason) when a split is missing, so that
    # `flatcheck probe` can include the gap by default; "error": exit 2, which is what
    # `flatcheck gap`, asked for the gap alone, does
    missing: Literal["error", "skip"] = option("skip", "a missing split: skip (no value, the reason) or error",
                                               command_value="error")


def evaluate(backend) -> tuple[float, float, int]:
    """Mean loss and accuracy over the backend's sample set (exact), and its size."""
    return (*loss_and_accuracy(backend), backend.problem.samples.n)


def _check_distinct(train: SampleSet, test: SampleSet) -> None:
    """A source that serves its train samples as the test split would give a gap of exactly 0."""
    if train.fingerprint == test.fingerprint:
        raise MissingSplitError(f"data '{test.name}': the test split holds the same {test.n} samples as the train split")


@register_probe
class GapProbe:
    """value = test loss − train loss, each the exact mean over the first N samples of its split
    (N = --samples, capped by the split's size). Accuracy gap = train − test accuracy.

    Both splits come from the same --data source and preprocessing; the split given with
    --split is one of the two, the other is loaded here. Evaluated in the run's --bn-mode.
    """

    name: ClassVar[str] = "gap"
    gating: ClassVar[Gating] = Gating()  # exact means
    summary: ClassVar[str] = "train vs test loss and accuracy, and their gap"
    Options: ClassVar[type] = GapOptions
    requires: ClassVar[frozenset[type]] = frozenset({Outputs})
    command_help: ClassVar[str] = "Loss and accuracy on the train and test splits, and their difference."

    def run(self, ctx: ProbeContext, options: GapOptions) -> ProbeResult:
        start = time.perf_counter()
        progress = progress_reporter(ctx, "gap")
        if ctx.split_samples is None:
            raise ConfigError("probe gap needs both data splits; run it through flatcheck.run or the CLI")
        problem = ctx.backend.problem
        try:
            splits = {split: ctx.split_samples(split) for split in ("train", "test")}
            _check_distinct(splits["train"], splits["test"])
        except MissingSplitError as exc:
            if options.missing == "error":
                raise DataError(f"probe gap needs a train and a test split: {exc}") from None
            return ProbeResult(probe=self.name, value=None, stderr=None, matvecs=0,
                               seconds=time.perf_counter() - start, label="test − train loss",
                               notes=f"skipped: {exc}", details={"skipped": str(exc)})
        results = {}
        for i, (split, samples) in enumerate(splits.items(), start=1):  # a pass over each split
            results[split] = evaluate(rebuild(ctx.backend, samples=samples))
            if progress is not None:
                gap = results["test"][0] - results["train"][0] if split == "test" else None
                progress(i, len(splits), value=gap)
        (tr_loss, tr_acc, tr_n), (te_loss, te_acc, te_n) = results["train"], results["test"]
        return ProbeResult(
            probe=self.name,
            value=te_loss - tr_loss,
            stderr=None,
            matvecs=0,
            seconds=time.perf_counter() - start,
            label="test − train loss",
            notes=f"loss {tr_loss:.4g} → {te_loss:.4g}, accuracy {tr_acc:.4f} → {te_acc:.4f} (train → test)",
            details={
                "train": {"loss": tr_loss, "accuracy": tr_acc, "samples": tr_n},
                "test": {"loss": te_loss, "accuracy": te_acc, "samples": te_n},
                "loss_gap": te_loss - tr_loss,
                "accuracy_gap": tr_acc - te_acc,
                "loss_name": problem.loss.name,
                "bn_mode": problem.bn_mode,
            },
        )
