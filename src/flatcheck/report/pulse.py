"""Progress within one call into a backend.

A product over the whole sample set, or a block of products, is one call into a backend, and
on a large model one call can take a minute: a progress line that counts finished calls says
nothing meanwhile. A backend counts the passes it finishes (`Passes.add`: a vector's pass over
a batch), and whoever listens (`listening`: the progress display) hears the count of sample
passes done and in all. It also says how long it spent building what later calls reuse
(`Passes.built`: a batch's forward and first-order graph, kept), so that the display can time
a product as a later one will run, without the build the first one carries. Nothing is
computed for it: without a listener `add` is a lookup.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

# (sample passes done, sample passes in the call, vectors in the call): a call over N samples
# with k vectors makes N·k sample passes; with `built=seconds` (a keyword), a build that later
# calls reuse has just ended, and took that long; with `anew=True`, the units that follow cost
# otherwise, and with `ahead=(unit, cost)`, the units from `unit` on will (pace_changes)
Listener = Callable[..., None]

_listener: ContextVar[Listener | None] = ContextVar("flatcheck_pulse", default=None)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Calls into backends made within the block report their passes to `listener`."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def listened() -> bool:
    """Whether anyone listens: a backend skips what only the count needs (its batches' sizes)."""
    return _listener.get() is not None


def pace_changes(ahead: tuple[int, float] | None = None) -> None:
    """The units that follow cost otherwise than those before (Hutch++'s quadratic forms after
    its sketch's products): whoever listens times them afresh. With `ahead=(unit, cost)`, said
    before: the units from `unit` on are expected to cost `cost` of one before it, so that an
    ETA taken before then prices them so (a prior, until they are timed)."""
    listener = _listener.get()
    if listener is not None:
        if ahead is None:
            listener(0, 0, 0, anew=True)
        else:
            listener(0, 0, 0, ahead=ahead)


class Passes:
    """The passes of one call: `vectors` vectors, each over `samples` samples in all; `sizes`,
    the batches' sizes where the caller counts by batch (`batch`)."""

    def __init__(self, samples: int, vectors: int, sizes: list[int] | None = None):
        self.total = samples * vectors
        self.vectors = vectors
        self.sizes = sizes or []
        self.done = 0
        self.listener = _listener.get()

    def batch(self, index: int, vectors: int = 1) -> None:
        """`vectors` vectors have passed over batch `index` of `sizes` (a batch past them counts
        nothing: only a count, which the call's own report follows)."""
        self.add(self.sizes[index] if index < len(self.sizes) else 0, vectors)

    def built(self, seconds: float) -> None:
        """Something later calls reuse (a kept graph) has just been built, in `seconds`: a rate
        taken from here on is a later call's."""
        if self.listener is not None:
            self.listener(self.done, self.total, self.vectors, built=seconds)

    def add(self, samples: int, vectors: int = 1) -> None:
        """`vectors` vectors have passed over a batch of `samples` samples."""
        self.done = min(self.total, self.done + samples * vectors)
        if self.listener is not None:  # the call's end too: it says how many samples a product runs over
            self.listener(self.done, self.total, self.vectors)
