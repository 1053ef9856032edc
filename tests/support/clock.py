"""A clock the tests set by hand, and the lines a progress display wrote: the progress tests
assert what is written when, with no real time passing."""

from __future__ import annotations

import io


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines_of(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()
