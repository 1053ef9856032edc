"""A batch that fills the device: on a GPU, batches larger than the default when the graph of
a product over them fits the memory a probe may take.

A product's cost on a GPU is nearly flat in the batch until the device is busy, so the default
batch (128) leaves most of a large card idle. Every product is a sum over batches weighted
|b|/N (flatcheck.engines.microbatch), so another batch size changes values by round-off
only — except under batch statistics (BatchNorm in train mode), where the batch is part of the
quantity and is never changed. A batch the user chose is kept as it is.

The decision (`grown_batch`) is a pure function of the device kind, the memory limit and one
sample's graph, so that it is tested without a GPU; `fill_batch` measures those on a problem.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..linalg.memory import gib, memory_limit, process_allowance, resident_bytes
from .microbatch import GRAPH_FACTOR, forward_bytes_per_sample

@dataclass(frozen=True)
class BatchGrowth:
    """The batch size products run over, the one asked for, and why they differ or not."""

    size: int
    default: int
    reason: str

    @property
    def grown(self) -> bool:
        return self.size > self.default

    def details(self) -> dict:
        return {"batch_size": self.size, "batch_size_default": self.default, "batch_size_reason": self.reason}


def grown_batch(*, default: int, samples: int, device_type: str, per_sample: int | None, limit: int | None,
                bn_train: bool, chosen: bool = False) -> BatchGrowth:
    """The batch for `samples` samples on a `device_type` device whose probes may take `limit`
    bytes, when a product over one sample holds `per_sample` bytes of graph.

    Grows only on CUDA, only past `default`, never under --bn-mode train (`bn_train`) nor when
    the user chose the batch (`chosen`). A grown batch's graph fits the limit whole, and the
    samples are split into equal batches (1,000 samples that fit 600 at a time: two of 500).
    The vectors a probe stores are planned when it runs, against the same limit: a batch that
    does not fit beside them is cut into micro-batches then (flatcheck.engines.microbatch),
    which changes no value, so each pass is as large as the probe's plan allows, and never
    smaller than the default's."""
    def kept(why: str) -> BatchGrowth:
        return BatchGrowth(default, default, why)

    if chosen:
        return kept("chosen by the user")
    if device_type != "cuda":
        return kept(f"default: batches grow on a CUDA device only, not {device_type}")
    if bn_train:
        return kept("default: under --bn-mode train, BatchNorm's batch statistics make the quantity depend on the batch")
    if samples <= default:
        return kept(f"default: one batch holds all {samples} samples")
    if limit is None or per_sample is None:
        return kept("default: the device's free memory cannot be read")
    fits = limit // max(1, per_sample)
    if fits <= default:
        return kept(f"default: a larger batch's graph ({gib(per_sample)} a sample) does not fit "
                    f"the {gib(limit)} a probe may take")
    batches = math.ceil(samples / min(fits, samples))
    size = math.ceil(samples / batches)
    return BatchGrowth(size, default, f"grown from {default}: {batches} batch{'es' if batches > 1 else ''} of "
                                      f"{size}, whose graph (about {gib(size * per_sample)}) fits the "
                                      f"{gib(limit)} a probe may take")


def fill_batch(problem, *, default: int, chosen: bool, max_memory: int | None, vectors: int = 1,
               device_type: str | None = None, limit: int | None = None) -> BatchGrowth:
    """grown_batch for `problem`: one sample's graph measured (GRAPH_FACTOR of its forward's
    saved tensors, times the `vectors` one pass carries), the limit a probe may take on its
    device (probe_allowance). `device_type` and `limit` stand in for the device's own (tests
    pass a CUDA device that is not there)."""
    device = problem.device
    device_type = device.type if device_type is None else device_type
    bn_train = str(problem.bn_mode) == "train"
    if chosen or device_type != "cuda" or bn_train or problem.samples.n <= default:
        per_sample = None  # nothing to measure: the decision does not depend on it
    else:
        per_sample = GRAPH_FACTOR * forward_bytes_per_sample(problem) * vectors
        limit = probe_allowance(device, max_memory) if limit is None else limit
    return grown_batch(default=default, samples=problem.samples.n, device_type=device_type, per_sample=per_sample,
                       limit=limit, bn_train=bn_train, chosen=chosen)


def probe_allowance(device, max_memory: int | None) -> int | None:
    """What a probe may take, as the run will leave it: --max-memory less what the process
    holds now, else half the free memory."""
    if max_memory is not None:
        max_memory = process_allowance(device, max_memory, resident_bytes(device))
    return memory_limit(device, max_memory)


def rebatched(samples, size: int):
    """`samples` (a SampleSet) in batches of `size` (itself when it has them already)."""
    if size == samples.batch_size:
        return samples
    from ..data.batches import SampleSet

    return SampleSet(samples.dataset, samples=samples.n, batch_size=size, device=samples.device, dtype=samples.dtype)


def filled(problem, backend, make_backend, *, default: int, chosen: bool, max_memory: int | None):
    """(problem, backend, growth): `problem` and its `backend` again, over grown batches when
    fill_batch grows them (`make_backend(problem)` builds the backend anew), else as they were.
    A distributed backend keeps its batches: ranks whose free memory differs would cut the
    same data differently."""
    if getattr(backend, "name", "").startswith("distributed"):
        return problem, backend, BatchGrowth(default, default, "default: a distributed backend keeps its batches")
    growth = fill_batch(problem, default=default, chosen=chosen, max_memory=max_memory,
                        vectors=getattr(backend, "chunk", 1))
    if not growth.grown:
        return problem, backend, growth
    problem = dataclasses.replace(problem, samples=rebatched(problem.samples, growth.size))
    return problem, make_backend(problem), growth
