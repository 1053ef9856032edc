"""The backend contract: what a backend is (the problem it differentiates is flatcheck.problem).

A backend is any object with the required products (`Backend`: `hvp`, `ggn_vp`, `outputs`);
the optional capabilities (`HvpSums`, `Vhv`, `ExactGGN`, `LimitMemory`, `HvpFailure`) are
protocols of their own, checked
with isinstance, so that a backend has a capability exactly when it has the method. How
backends are found and built is flatcheck.backends.registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Protocol, runtime_checkable

import torch
from torch import Tensor

from ..engines.ggn_trace import GGNTrace
from ..problem import Problem

if TYPE_CHECKING:
    from ..engines.microbatch import BatchPlan


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


@runtime_checkable
class LimitMemory(Protocol):
    def limit_memory(self, allowance: int | None, what: str = "products") -> "BatchPlan | None":
        """Cut the batches products run over into micro-batches whose graphs fit `allowance`
        bytes (None: run them whole); the plan, or None when batches stay whole. A backend
        without it runs every batch whole."""
        ...


@runtime_checkable
class HvpFailure(Protocol):
    # why Hessian-vector products failed on this model (an op without a second derivative),
    # once one did; None: none has. A backend that has it lets a probe switch to a route
    # that needs no second derivative (forward tangents)
    hvp_error: str | None


# the products a probe may require (probes.registry.requirements); LimitMemory and HvpFailure
# change how a probe plans, never whether it can run
CAPABILITIES: tuple[type, ...] = (Hvp, GGNVp, Outputs, HvpSums, Vhv, ExactGGN)


def capability_name(cap: type) -> str:
    """What a capability is called in messages: its method (hvp, ggn_trace, …)."""
    return next(n for n in vars(cap) if not n.startswith("_") and callable(vars(cap)[n]))


def missing_capabilities(backend: object, needs) -> list[str]:
    """The names of the capabilities in `needs` that `backend` lacks, sorted."""
    return sorted(capability_name(cap) for cap in needs if not isinstance(backend, cap))
