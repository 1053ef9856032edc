"""The problem a backend differentiates, the backend protocol, and the backend registry."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import torch
from torch import Tensor, nn

from ..errors import ConfigError
from ..models.spec import LossSpec
from ..layout import ParamLayout

BN_MODES = ("eval", "train")


@dataclass
class Problem:
    """Everything a curvature product depends on: L(θ) = (1/N) Σ_n ℓ(f(x_n; θ), y_n).

    `samples` yields batches with weight |batch|/N (flatcheck.data.batches.SampleSet);
    `layout` names the parameters θ the products are taken with respect to.
    """

    model: nn.Module
    loss: LossSpec
    samples: "SampleSetLike"
    layout: ParamLayout
    bn_mode: str = "eval"

    @property
    def dtype(self) -> torch.dtype:
        return self.layout.params(self.model)[0].dtype

    @property
    def device(self) -> torch.device:
        return self.layout.params(self.model)[0].device

    def split_params(self) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(probed parameters, everything else the forward needs) for torch.func.functional_call."""
        chosen = dict(zip(self.layout.names, (p.detach() for p in self.layout.params(self.model))))
        frozen = {n: t.detach() for n, t in self.model.named_parameters() if n not in chosen}
        frozen.update(dict(self.model.named_buffers()))
        return chosen, frozen


@dataclass(frozen=True)
class GGNTrace:
    per_param: Tensor  # (len(layout.names),) float64; sums to Tr(G)
    stderr: float | None  # None when every class column was used (exact)
    columns: int  # per-sample VJPs spent, Σ_n K_n


class SampleSetLike(Protocol):
    n: int
    num_batches: int

    def __iter__(self) -> Iterator: ...


class Backend(Protocol):
    """Products of curvature matrices of the whole-sample-set loss with blocks of vectors.

    Every product takes V of shape (k, P) (k vectors over the flat parameters of
    `problem.layout`) and returns (k, P). Probes reach autograd only through this.
    """

    name: str
    capabilities: frozenset[str]
    problem: Problem

    def hvp(self, V: Tensor) -> Tensor: ...

    # optional, with "hvp_sums" in capabilities: per-parameter-tensor sums of V ⊙ HV,
    # (k, len(layout.names)) float64, for V given as a (k, P) block (int8 signs allowed)
    # without forming the (k, P) product
    # def hvp_sums(self, S: Tensor) -> Tensor: ...

    # optional, with "vhv" in capabilities: vᵀHv for v = s ⊙ scale, every row s of S,
    # (k,) float64, the total only (no split over parameters), by whatever route is cheapest
    # def vhv(self, S: Tensor, scale: Tensor | None = None) -> Tensor: ...

    def ggn_vp(self, V: Tensor) -> Tensor: ...

    def ggn_trace(self, class_samples: int | None = None, generator: torch.Generator | None = None,
                  progress: Callable[[int, int], None] | None = None) -> GGNTrace:
        """Tr(G) split per parameter tensor; exact, or class-sampled when class_samples is set."""
        ...

    def outputs(self) -> Iterator[tuple[Tensor, Tensor, float]]:
        """(logits, labels, batch weight) for every batch, without a graph."""
        ...


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
    if bn_mode == "train":
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


_BACKENDS: dict[str, Callable[[Problem], Backend]] = {}


def register_backend(name: str):
    def deco(factory):
        _BACKENDS[name] = factory
        return factory

    return deco


def _load_builtin() -> None:
    from . import autograd, distributed, func  # noqa: F401  (importing registers them)


def list_backends() -> list[str]:
    _load_builtin()
    return sorted(_BACKENDS)


def create_backend(name: str, problem: Problem, *, compile: bool = False) -> Backend:
    """`name` is a registered backend, or "distributed:INNER" to shard another one.

    compile: torch.compile the Hessian-vector product (the func backend's pure function).
    """
    _load_builtin()
    base, _, inner = name.partition(":")
    if base not in _BACKENDS or (inner and (base != "distributed" or inner not in _BACKENDS or inner == base)):
        choices = list_backends() + [f"distributed:{b}" for b in list_backends() if b != "distributed"]
        raise ConfigError(f"--backend {name!r} is unknown; available: {', '.join(choices)}")
    if problem.bn_mode not in BN_MODES:
        raise ConfigError(f"--bn-mode must be one of {', '.join(BN_MODES)}, got {problem.bn_mode!r}")
    leaf = inner or ("autograd" if base == "distributed" else base)
    if compile and leaf != "func":
        raise ConfigError(f"--compile needs --backend func or distributed:func (it compiles their torch.func "
                          f"product), got --backend {name}")
    kwargs = {"compile": True} if compile else {}
    return _BACKENDS[base](problem, inner, **kwargs) if inner else _BACKENDS[base](problem, **kwargs)
