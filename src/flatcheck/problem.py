"""The problem every curvature product is taken on: the parameters (`ParamLayout`, flat
views of a parameter subset), the model, loss and samples (`Problem`), and the mode its
forwards run in (`model_mode`, `uses_batch_statistics`).

Estimators work on flat blocks V of shape (k, P); backends need per-parameter tensors.
`ParamLayout` is the one place that maps between the two and groups parameters by the
module that owns them (for per-layer breakdowns).

A floor module: engines, backends and probes build on it, and it imports no flatcheck
module but errors, settings and linalg.reduce (the loss spec only for its type).
"""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Protocol

import torch
from torch import Tensor, nn

from .errors import ConfigError, setting
from .linalg.reduce import rowsum64
from .settings import BnMode

if TYPE_CHECKING:
    from .models.spec import LossSpec


class SampleSetLike(Protocol):
    n: int
    num_batches: int

    def __iter__(self) -> Iterator: ...


@dataclass(frozen=True)
class ParamLayout:
    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    sizes: tuple[int, ...]
    groups: tuple[str, ...]  # owning module of each parameter, "" for the root

    @classmethod
    def from_model(cls, model: nn.Module, patterns: tuple[str, ...] = ()) -> "ParamLayout":
        """Trainable parameters, optionally restricted to names matching any glob pattern."""
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if patterns:
            named = [(n, p) for n, p in named if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
            if not named:
                raise ConfigError(
                    f"{setting('params')} {','.join(patterns)} matches no trainable parameter; "
                    f"names look like {', '.join(n for n, _ in list(model.named_parameters())[:4])}"
                )
        if not named:
            raise ConfigError("the model has no trainable parameters")
        return cls(
            names=tuple(n for n, _ in named),
            shapes=tuple(p.shape for _, p in named),
            sizes=tuple(p.numel() for _, p in named),
            groups=tuple(n.rpartition(".")[0] for n, _ in named),
        )

    @property
    def dim(self) -> int:
        return sum(self.sizes)

    def params(self, model: nn.Module) -> list[Tensor]:
        table = dict(model.named_parameters())
        return [table[n] for n in self.names]

    def split(self, block: Tensor) -> list[Tensor]:
        """(k, P) → per-parameter views of shape (k, *shape)."""
        k = block.shape[0]
        return [piece.view(k, *shape) for piece, shape in zip(block.split(self.sizes, dim=1), self.shapes)]

    def unflatten(self, v: Tensor) -> list[Tensor]:
        """One vector (P,) → per-parameter views of shape `shape`."""
        return [piece.view(shape) for piece, shape in zip(v.split(self.sizes), self.shapes)]

    def flatten(self, pieces: list[Tensor], k: int) -> Tensor:
        """Per-parameter (k, *shape) tensors → (k, P)."""
        return torch.cat([p.reshape(k, -1) for p in pieces], dim=1)

    def param_sum_matrix(self, block: Tensor) -> Tensor:
        """(k, P) → (k, len(names)) sums within each parameter tensor, in float64.

        Accumulated in float64 (and group sums from these), so the parts add up to the
        total whatever the working dtype.
        """
        return torch.stack([rowsum64(piece) for piece in block.split(self.sizes, dim=1)], dim=1)

    def group_sums_of(self, sums: Tensor) -> dict[str, Tensor]:
        """Per-parameter sums (k, len(names)) → {group: (k,)}."""
        out: dict[str, Tensor] = {}
        for j, group in enumerate(self.groups):
            out[group] = out[group] + sums[:, j] if group in out else sums[:, j].clone()
        return out

    def group_sizes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for size, group in zip(self.sizes, self.groups):
            out[group] = out.get(group, 0) + size
        return out


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def uses_batch_statistics(model: nn.Module, bn_mode: str) -> bool:
    """Whether a forward in `bn_mode` couples the samples of a batch (BatchNorm on batch
    statistics): the one place that decides it, for probes, engines and the live API alike."""
    return BnMode(bn_mode) is BnMode.TRAIN and has_batchnorm(model)


@dataclass
class Problem:
    """Everything a curvature product depends on: L(θ) = (1/N) Σ_n ℓ(f(x_n; θ), y_n).

    `samples` yields batches with weight |batch|/N (flatcheck.data.batches.SampleSet);
    `layout` names the parameters θ the products are taken with respect to.
    """

    model: nn.Module
    loss: "LossSpec"
    samples: SampleSetLike
    layout: ParamLayout
    bn_mode: BnMode = BnMode.EVAL
    # the largest |logit| over the samples for a softmax loss, as the run's checks measured it
    # (api._check_batches; 0: not measured): the logits' own float rounding moves the curvature
    # by about eps·M relative, which the eigen-solvers' round-off floor takes (linalg/certify.py)
    max_abs_logit: float = 0.0
    # a float32 product's relative error against float64, in units of eps, where it exceeds what
    # the floor takes (api._check_products; 0: not measured or within it): the floor takes it too
    product_error: float = 0.0

    def __post_init__(self):
        self.bn_mode = BnMode(self.bn_mode)  # checked with the run's settings (flatcheck.settings)

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.params(self.model)[0].dtype

    @property
    def device(self) -> torch.device:
        return self.layout.params(self.model)[0].device

    @property
    def batch_statistics(self) -> bool:
        """Whether the samples of a batch are coupled (uses_batch_statistics)."""
        return uses_batch_statistics(self.model, self.bn_mode)

    def split_params(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(probed parameters, everything else the forward needs) for torch.func.functional_call."""
        chosen = dict(zip(self.layout.names, (p.detach() for p in self.layout.params(self.model))))
        frozen = {n: t.detach() for n, t in self.model.named_parameters() if n not in chosen}
        frozen.update(dict(self.model.named_buffers()))
        return chosen, frozen

    def outputs(self) -> Iterator[tuple[Tensor, Tensor, float]]:
        """(logits, labels, batch weight) for every batch, without a graph.

        The mode is held for each forward only, never across a yield: a caller that stops
        early, or raises between batches, must not be left with BatchNorm switched or
        gradients off.
        """
        for batch in self.samples:
            with model_mode(self.model, self.bn_mode), torch.no_grad():
                logits = self.model(batch.x)
            yield logits, batch.y, batch.weight


@contextlib.contextmanager
def model_mode(model: nn.Module, bn_mode: str):
    """Dropout and stochastic depth off; BatchNorm on running stats ("eval") or batch stats ("train").

    In "train" mode running statistics must stay untouched, so batch-norm layers run with
    track_running_stats switched off: torch then normalises with batch statistics and has
    no running buffers to update (momentum tricks would still bump num_batches_tracked).
    """
    was_training = {m: m.training for m in model.modules()}
    touched: list[nn.Module] = []
    model.eval()
    if BnMode(bn_mode) is BnMode.TRAIN:
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                touched.append(m)
                m.train()
                m.track_running_stats = False
    try:
        yield model
    finally:
        for m in touched:
            m.track_running_stats = True
        for m, flag in was_training.items():
            m.training = flag
