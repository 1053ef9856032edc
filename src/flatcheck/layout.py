"""Flat views of a parameter subset.

Estimators work on flat blocks V of shape (k, P); backends need per-parameter tensors.
`ParamLayout` is the one place that maps between the two and groups parameters by the
module that owns them (for per-layer breakdowns).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .errors import ConfigError
from .linalg.reduce import rowsum64


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
                    f"--params {','.join(patterns)} matches no trainable parameter; "
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
