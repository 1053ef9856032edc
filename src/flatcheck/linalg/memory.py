"""How much memory an estimator may allocate on a device, so that a request that cannot fit is
refused before it allocates instead of being killed by the kernel (or by CUDA) midway."""

from __future__ import annotations

import os

import torch


def available_bytes(device: torch.device) -> int | None:
    """Free memory on `device` now: CUDA's free VRAM, or the host's MemAvailable (Linux), or
    None where neither can be read (then nothing is refused)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: int | float) -> str:
    return f"{n / 2**30:.3g} GiB"
