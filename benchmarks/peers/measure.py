"""Time, peak memory and HVP count of the timed work of a row."""

from __future__ import annotations

import resource
import time
from typing import Any, Callable

import torch

from peers.problem import Setup
from peers.rows import Row


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak memory of the timed work only.

    CUDA: max_memory_allocated over the allocation before. CPU: the resident-set high-water mark
    is reset to the current RSS (/proc/self/clear_refs, "5") and its rise read from VmHWM; where
    that is refused, getrusage's ru_maxrss rise (which misses peaks below earlier ones).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.how = ""

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            self.how = "cuda max_memory_allocated"
            return self
        self.base = _status_kib("VmRSS")
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.how = "VmHWM − VmRSS"
        except OSError:
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.how = "ru_maxrss rise"
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.mib = (torch.cuda.max_memory_allocated(self.device) - self.base) / 2**20
        elif self.how == "VmHWM − VmRSS":
            self.mib = ((_status_kib("VmHWM") or 0) - (self.base or 0)) / 1024
        else:
            self.mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.base) / 1024
        return False


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Budget(Exception):
    pass


class Counter:
    def __init__(self, cap: int | None = None):
        self.n, self.cap = 0, cap

    def add(self, k: int = 1) -> None:
        self.n += k
        if self.cap is not None and self.n > self.cap:
            raise Budget(f"stopped after {self.cap} HVPs without converging")


def timed(row: Row, setup: Setup, counter: Counter | Callable[[], int], fn: Callable[[], Any]) -> Any:
    """Run fn under timing and peak memory; on failure keep time and HVPs until it, then raise."""
    get = counter if callable(counter) else (lambda: counter.n)
    mem = PeakMemory(setup.device)
    t0 = time.perf_counter()
    try:
        with mem:
            out = fn()
            sync(setup.device)
    finally:
        row.seconds = time.perf_counter() - t0
        row.hvps = get()
        row.peak_mib = getattr(mem, "mib", None)
    return out
