"""The `distributed` backend: each rank takes every W-th batch, products are all-reduced.

Batch weights are |batch|/N over the whole set, so the sum over ranks of the per-rank
products is the product of the whole-set loss. Every rank runs the same estimator with the
same seed, hence the same probe vectors, so all ranks hold the same numbers and they equal
the single-process ones up to summation order. Cheap passes (`outputs`) are not sharded.

A wrapper: `--backend distributed` shards the reference autograd backend,
`distributed:func` the func one, and the sharded backend has exactly the optional
capabilities of the one it shards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

from .ranks import ensure_process_group
from ..problem import Problem
from .base import Backend, BackendSpec, ExactGGN, GGNTrace, HvpSums, Vhv
from .registry import Make, register_wrapper


@dataclass
class ShardedSamples:
    """The batches of a SampleSet whose index ≡ rank (mod world)."""

    samples: object
    rank: int
    world: int

    @property
    def n(self) -> int:
        return self.samples.n

    @property
    def num_batches(self) -> int:
        return len(range(self.rank, self.samples.num_batches, self.world))

    def __iter__(self) -> Iterator:
        return (b for b in self.samples if b.index % self.world == self.rank)

    def describe(self) -> dict:
        return self.samples.describe()


class DistributedBackend:
    """The required products, summed over ranks."""

    name = "distributed"

    def __init__(self, problem: Problem, local: Backend, full: Backend, rank: int, world: int):
        self.problem = problem
        self.spec = BackendSpec(self.name)
        self.rank, self.world = rank, world
        self.inner_name = local.name
        self._local = local
        self._full = full  # only for `outputs`, which has no product

    def _sum(self, t: Tensor) -> Tensor:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def hvp(self, V: Tensor) -> Tensor:
        return self._sum(self._local.hvp(V))

    def ggn_vp(self, V: Tensor) -> Tensor:
        return self._sum(self._local.ggn_vp(V))

    def outputs(self):
        return self._full.outputs()


class _HvpSums:
    def hvp_sums(self, S: Tensor) -> Tensor:
        return self._sum(self._local.hvp_sums(S))


class _Vhv:
    def vhv(self, S: Tensor, scale: Tensor | None = None) -> Tensor:
        return self._sum(self._local.vhv(S, scale))

    @property
    def vhv_error(self) -> str | None:
        return self._local.vhv_error


class _ExactGGN:
    def ggn_trace(self, class_samples=None, generator=None, progress=None) -> GGNTrace:
        local = self._local.ggn_trace(class_samples, generator, progress)
        var = 0.0 if local.stderr is None or math.isnan(local.stderr) else local.stderr**2
        extra = torch.tensor([var, float(local.columns)], dtype=torch.float64, device=local.per_param.device)
        per_param, extra = self._sum(local.per_param.clone()), self._sum(extra)
        stderr = None if local.stderr is None else math.sqrt(extra[0].item())
        return GGNTrace(per_param, stderr, int(extra[1].item()))


# each optional capability of the sharded backend, and what adds it
_CAPABILITIES = ((HvpSums, _HvpSums), (Vhv, _Vhv), (ExactGGN, _ExactGGN))
_CLASSES: dict[tuple[type, ...], type] = {}


@register_wrapper("distributed", default_inner="autograd")
def sharded(problem: Problem, make: Make) -> Backend:
    rank, world = ensure_process_group(problem.device)
    local = make(replace(problem, samples=ShardedSamples(problem.samples, rank, world)))
    extra = tuple(mixin for cap, mixin in _CAPABILITIES if isinstance(local, cap))
    cls = _CLASSES.get(extra)
    if cls is None:
        cls = _CLASSES[extra] = type("DistributedBackend", (*extra, DistributedBackend), {})
    return cls(problem, local, make(problem), rank, world)
