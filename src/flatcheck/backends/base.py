"""The backend contract: the problem a backend differentiates, and what a backend is.

A backend is any object with the required products (`Backend`: `hvp`, `ggn_vp`, `outputs`);
the optional capabilities (`HvpSums`, `Vhv`, `ExactGGN`) are protocols of their own, checked
with isinstance, so that a backend has a capability exactly when it has the method. How
backends are found and built is flatcheck.backends.registry.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from ..layout import ParamLayout
from ..models.spec import LossSpec

BN_MODES = ("eval", "train")


class SampleSetLike(Protocol):
    n: int
    num_batches: int

    def __iter__(self) -> Iterator: ...


@dataclass
class Problem:
    """Everything a curvature product depends on: L(θ) = (1/N) Σ_n ℓ(f(x_n; θ), y_n).

    `samples` yields batches with weight |batch|/N (flatcheck.data.batches.SampleSet);
    `layout` names the parameters θ the products are taken with respect to.
    """

    model: nn.Module
    loss: LossSpec
    samples: SampleSetLike
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


@dataclass(frozen=True)
class GGNTrace:
    per_param: Tensor  # (len(layout.names),) float64; sums to Tr(G)
    stderr: float | None  # None when every class column was used (exact)
    columns: int  # per-sample VJPs spent, Σ_n K_n


@dataclass(frozen=True)
class BackendSpec:
    """How a backend was made: the name --backend gave ("func", "distributed:func") and the
    options it took (("compile", True), …). `registry.rebuild` makes another backend from it."""

    name: str
    options: tuple[tuple[str, object], ...] = ()


# ------------------------------------------------------------------ required products
# Every product takes V of shape (k, P) (k vectors over the flat parameters of
# `problem.layout`) and returns (k, P). Probes reach autograd only through these.


@runtime_checkable
class Hvp(Protocol):
    def hvp(self, V: Tensor) -> Tensor:
        """H V for the Hessian of the whole-sample-set loss."""
        ...


@runtime_checkable
class GGNVp(Protocol):
    def ggn_vp(self, V: Tensor) -> Tensor:
        """G V for the generalised Gauss-Newton matrix Jᵀ A J."""
        ...


@runtime_checkable
class Outputs(Protocol):
    def outputs(self) -> Iterator[tuple[Tensor, Tensor, float]]:
        """(logits, labels, batch weight) for every batch, without a graph."""
        ...


@runtime_checkable
class Backend(Hvp, GGNVp, Outputs, Protocol):
    """Products of curvature matrices of the whole-sample-set loss with blocks of vectors."""

    name: str
    problem: Problem
    spec: BackendSpec  # set by registry.create_backend; what rebuild() repeats


# ------------------------------------------------------------------ optional capabilities


@runtime_checkable
class HvpSums(Protocol):
    def hvp_sums(self, S: Tensor) -> Tensor:
        """Per-parameter-tensor sums of V ⊙ HV, (k, len(layout.names)) float64, for V given as
        a (k, P) block (int8 signs allowed) without forming the (k, P) product."""
        ...


@runtime_checkable
class Vhv(Protocol):
    # why vhv fell back to Hessian-vector products, once it did (None: it has not)
    vhv_error: str | None

    def vhv(self, S: Tensor, scale: Tensor | None = None) -> Tensor:
        """vᵀHv for v = s ⊙ scale, every row s of S, (k,) float64: the total only (no split
        over parameters), by whatever route is cheapest."""
        ...


@runtime_checkable
class ExactGGN(Protocol):
    def ggn_trace(self, class_samples: int | None = None, generator: torch.Generator | None = None,
                  progress: Callable[[int, int], None] | None = None) -> GGNTrace:
        """Tr(G) split per parameter tensor; exact, or class-sampled when class_samples is set."""
        ...


CAPABILITIES: tuple[type, ...] = (Hvp, GGNVp, Outputs, HvpSums, Vhv, ExactGGN)


def capability_name(cap: type) -> str:
    """What a capability is called in messages: its method (hvp, ggn_trace, …)."""
    return next(n for n in vars(cap) if not n.startswith("_") and callable(vars(cap)[n]))


def missing_capabilities(backend: object, needs) -> list[str]:
    """The names of the capabilities in `needs` that `backend` lacks, sorted."""
    return sorted(capability_name(cap) for cap in needs if not isinstance(backend, cap))


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
