"""Per-batch state (first-order graphs, vᵀHv primals) kept across products within one
memory budget, and dropped when the model it was built on moved (flatcheck.engines.state)."""

from __future__ import annotations

import itertools
from typing import Callable, Iterator

from .state import ModelState

# Per-batch state kept across products over several batches (estimated size, see
# AutogradBackend._grad_with_graph). Each kept batch saves its forward and gradient (about a
# third of an HVP's cost) in every later product.
GRAPH_CACHE_BYTES = 1024 * 2**20


class Pool:
    """The kept per-batch state of one backend: the bytes it holds, against its budget
    (GRAPH_CACHE_BYTES at most), and the model state it was built on."""

    def __init__(self, state: ModelState):
        self.used = 0
        self.state = state
        # lowered under --max-memory to what a micro-batch in flight leaves of the allowance
        self.budget = GRAPH_CACHE_BYTES


class KeptPrefix:
    """Per-batch state (a first-order graph, a vᵀHv primal) kept across calls for batches
    0, 1, … while it fits GRAPH_CACHE_BYTES with the rest of its pool; the rest is rebuilt on
    every call. A single batch's is always kept, since every product needs it (under
    --max-memory a single batch is one whose graph fits: see flatcheck.engines.microbatch). Over several
    batches keeping starts with the second call: a single pass (one Hutchinson block) would
    hold the memory for nothing.
    """

    def __init__(self, pool: Pool):
        self.pool = pool
        self.items: list = []
        self.bytes = 0
        self.passes = 0
        pool.state.register(self.clear)

    def each(self, samples, build: Callable) -> Iterator:
        """build(batch) → (item, bytes it holds); yields every batch's item, kept or rebuilt."""
        self.pool.state.check()
        self.passes += 1
        n = samples.num_batches
        yield from self.items
        if len(self.items) == n:
            return  # every batch's is kept: the data is not read again
        start = len(self.items)
        for i, batch in enumerate(itertools.islice(samples, start, None), start):
            item, held = build(batch)
            fits = self.passes > 1 and self.pool.used + held <= self.pool.budget
            # only right after the kept prefix, so that the kept items stay batches 0, 1, …
            if i == len(self.items) and (n == 1 or fits):
                self.items.append(item)
                self.bytes += held
                self.pool.used += held
            yield item

    def clear(self) -> None:
        self.pool.used -= self.bytes
        self.items, self.bytes = [], 0
