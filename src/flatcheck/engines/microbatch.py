"""How much one sample's autograd graph holds, and batches cut into micro-batches so that a
batch's graph fits a memory allowance (--max-memory).

A product over a batch holds that batch's graph while it runs; the graph grows with the
batch. Cutting batch b (weight |b|/N) into micro-batches m with weights |m|/N leaves the
loss L = Σ_m (|m|/N)·mean_m ℓ unchanged, so every product is the same sum taken in other
pieces: values agree with the whole batch's to round-off. Batch statistics (BatchNorm in
train mode) tie a batch's samples together, so such a batch is never cut.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from ..errors import ConfigError, setting
from ..linalg.memory import gib, limit_words

# what a product over a sample holds, in units of its forward's saved tensors: the forward
# graph, the create_graph reverse pass over it (about twice as much), and the allocator's slack
# around them. Measured for an HVP on ViT-S/16 (random init, CPU): 3.1× the forward's saved
# bytes at batch 4, 3.7× at batch 1; 3 let ViT-B/16's spectrum reach 8.5 GB under an 8 GB cap
GRAPH_FACTOR = 4


def saved_bytes(run: Callable[[], Any], model: nn.Module | None = None) -> int:
    """Bytes of the tensors `run()` saves for backward (each storage once), less the model's
    own parameters and buffers, which exist whatever the batch: what its graph holds per
    input, measured instead of guessed."""
    own = set()
    if model is not None:
        own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[tuple, int] = {}
    # every saved tensor is held until `run` returns, so none is freed midway and its storage
    # handed to a later tensor (whose pointer would then be counted once); the hook itself
    # returns nothing: `run` is never differentiated, and returning the tensor would tie an
    # op's saved output to its own grad_fn, a cycle through autograd's C++ nodes that Python's
    # collector cannot see, so every measured graph would outlive the call
    held: list[Tensor] = []

    def pack(t: Tensor):
        held.append(t)
        try:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in own:
                key = (ptr, t.device)
                seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. functional wrappers)
            seen[(id(t),)] = t.numel() * t.element_size()
        return None

    def unpack(_):
        raise RuntimeError("saved_bytes measures a forward pass; it cannot be differentiated")

    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            run()
    finally:
        held.clear()
    return sum(seen.values())


def batch_sizes(samples) -> list[int]:
    """The sizes of the batches `samples` yields (without reading them where it can)."""
    if isinstance(samples, MicroBatches):
        return list(samples.sizes)
    if hasattr(samples, "batch_size") and hasattr(samples, "num_batches"):
        n, b = samples.n, samples.batch_size
        return [min(b, n - k * b) for k in range(samples.num_batches)]
    return [batch.x.shape[0] for batch in samples]


class MicroBatches:
    """The batches of `samples` with every batch larger than `size` cut into pieces of at most
    `size` samples, each weighted |piece|/N."""

    def __init__(self, samples, size: int, sizes: list[int]):
        self.samples = samples
        self.size = size
        self.n = samples.n
        self.num_batches = sum(math.ceil(b / size) for b in sizes)
        self.sizes = [min(size, b - s) for b in sizes for s in range(0, b, size)]

    def __iter__(self) -> Iterator:
        for batch in self.samples:
            b = batch.x.shape[0]
            if b <= self.size:
                yield batch
                continue
            for s in range(0, b, self.size):
                x, y = batch.x[s:s + self.size], batch.y[s:s + self.size]
                yield dataclasses.replace(batch, x=x, y=y, weight=x.shape[0] / self.n, first=batch.first + s)

    def describe(self) -> dict:
        return self.samples.describe()


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """Samples per micro-batch (None: batches run whole), from one sample's graph and the
    bytes allowed for graphs."""

    per_sample: int  # bytes a product over one sample holds (estimated)
    allowance: int  # bytes allowed for one micro-batch's graph
    size: int | None  # samples per micro-batch; None when every batch fits whole
    largest_batch: int

    @property
    def chunks(self) -> int:
        """Micro-batches the largest batch is cut into."""
        return 1 if self.size is None else math.ceil(self.largest_batch / self.size)

    def details(self) -> dict:
        return {"graph_bytes_per_sample": self.per_sample, "graph_allowance_bytes": self.allowance,
                "microbatch_samples": self.size, "chunks_per_batch": self.chunks}


def plan_batches(per_sample: int, allowance: int, sizes: list[int], splittable: bool, what: str) -> BatchPlan:
    """How many samples a micro-batch may hold so that its graph fits `allowance`; refuses
    (exit 2) up front when one sample cannot fit, or when a batch that cannot be cut
    (`splittable` False: batch statistics) does not fit whole."""
    largest = max(sizes)
    fits = allowance // max(1, per_sample)
    if fits < 1:
        raise ConfigError(f"{what}: one sample's graph needs about {per_sample:,} bytes ({gib(per_sample)}), more than "
                          f"the {allowance:,} bytes ({gib(allowance)}) left for it ({limit_words()}) after the stored vectors; "
                          f"raise {setting('max_memory')} or free memory")
    if fits >= largest:
        return BatchPlan(per_sample, allowance, None, largest)
    if not splittable:
        raise ConfigError(f"{what}: a batch of {largest} samples needs about {largest * per_sample:,} bytes "
                          f"({gib(largest * per_sample)}) for its graph, more than the {allowance:,} bytes "
                          f"({gib(allowance)}) left under {setting('max_memory')}, and {setting('bn_mode')} train (batch "
                          f"statistics) cannot cut a batch; use {setting('batch_size')} {fits} or less, "
                          f"{setting('bn_mode')} eval, or raise {setting('max_memory')}")
    return BatchPlan(per_sample, allowance, int(fits), largest)


def has_batch_statistics(problem) -> bool:
    return problem.batch_statistics


def forward_bytes_per_sample(problem) -> int:
    """What one sample's forward and loss save for backward (the model's own tensors left
    out). Batch statistics need two samples to run: their forward is measured and halved."""
    from ..problem import model_mode
    from ..losses import per_sample_loss

    batch = next(iter(problem.samples))
    take = min(batch.x.shape[0], 2 if has_batch_statistics(problem) else 1)
    x, y = batch.x[:take], batch.y[:take]

    def forward():
        per_sample_loss(problem.model(x), y, problem.loss).mean()

    with model_mode(problem.model, problem.bn_mode):
        return math.ceil(saved_bytes(forward, problem.model) / take)


def plan_products(problem, allowance: int, what: str, vectors: int = 1) -> BatchPlan:
    """The micro-batches of a backend's products under `allowance` bytes of graph: a product
    over one sample holds GRAPH_FACTOR of its forward's saved tensors, times the vectors one
    pass carries together (a vmapped block)."""
    per_sample = GRAPH_FACTOR * forward_bytes_per_sample(problem) * vectors
    return plan_batches(per_sample, allowance, batch_sizes(problem.samples), not has_batch_statistics(problem), what)


def micro_batches(samples, plan: BatchPlan | None):
    """`samples`, cut as `plan` says (unchanged without a plan or when every batch fits)."""
    if plan is None or plan.size is None:
        return samples
    return MicroBatches(samples, plan.size, batch_sizes(samples))
