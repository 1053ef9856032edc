"""The one owner of "did the model change since this was built?" for a backend's caches.

A backend keeps per-batch state across products (first-order graphs, vᵀHv primals) that
saved the model's tensors as they were when it was built. Whatever rewrites a weight or a
buffer in place (adaptive-sharpness's perturbations, an invariance rescaling), even to
copy the saved values back bit for bit, bumps that tensor's version counter; a kept graph
is then refused by autograd ("modified by an inplace operation"), and a kept value would
be read stale. So that code that perturbs the model need not know which caches exist,
every cache registers with a `ModelState` and calls `check()` before reusing anything;
`check()` drops every registered cache when a tensor moved.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Callable, Hashable

from torch import nn


def fingerprint(model: nn.Module) -> tuple[Hashable, ...]:
    """Per parameter and buffer: which tensor it is, where its storage lies, how often it
    was written in place and whether it takes gradients. Version counters catch writes
    through the tensor or any view of it (copy_, mul_, an optimiser step); the storage
    address and identity catch a tensor replaced or moved (`module.weight = …`, `.to()`,
    `p.data = …`). A write through `p.data` (a detached alias with its own counter) is
    invisible here, as it is to autograd itself.
    """
    tensors = itertools.chain(model.named_parameters(), model.named_buffers())
    return tuple((name, id(t), t.data_ptr(), t._version, t.requires_grad) for name, t in tensors)


class ModelState:
    """Drops the registered caches whenever the model's tensors differ from those the
    caches were built on."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._drops: list[Callable[[], Callable[[], None] | None]] = []
        self._seen: tuple[Hashable, ...] | None = None

    def register(self, drop: Callable[[], None]) -> None:
        """`drop()` empties one cache; it runs on every change `check()` finds. A bound method
        is held weakly: its owner (a backend, a kept prefix) holds this state, and a strong
        reference back would make a cycle that only the garbage collector frees, keeping the
        owner's graphs and vectors alive after the last reference to it is gone."""
        self._drops.append(weakref.WeakMethod(drop) if hasattr(drop, "__self__") else (lambda: drop))

    def check(self) -> None:
        """Call before reading any cached item and before building new ones; empties the
        caches when the model moved since the last call."""
        now = fingerprint(self.model)
        if now == self._seen:
            return
        changed = self._seen is not None
        self._seen = now
        if changed:
            for ref in self._drops:
                drop = ref()
                if drop is not None:
                    drop()
