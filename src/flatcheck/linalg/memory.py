"""How much memory an estimator may allocate on a device, so that a request that cannot fit is
refused before it allocates instead of being killed by the kernel (or by CUDA) midway."""

from __future__ import annotations

import os

import torch


def limit_words() -> str:
    """How every refusal names the limit it was held to; under `ulimit -v` also what that
    leaves, which a larger max_memory cannot raise."""
    from ..errors import setting

    left = address_space_left()
    words = f"{setting('max_memory')} less what the process holds; without it, half the free memory"
    return words if left is None else f"{words}; ulimit -v leaves this process {left:,} bytes ({gib(left)})"


def address_space_left() -> int | None:
    """What an address-space limit (`ulimit -v`, RLIMIT_AS) leaves this process to map: an
    allocation past it fails however much memory is free. None without such a limit."""
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    except ImportError:
        return None
    mapped = _statm(0)
    if soft == resource.RLIM_INFINITY or mapped is None:
        return None
    return max(0, soft - mapped)


def _statm(field: int) -> int | None:
    """Bytes of /proc/self/statm's `field` (0: mapped, 1: resident); None where it cannot be read."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[field]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def available_bytes(device: torch.device) -> int | None:
    """Free memory on `device` now: CUDA's free VRAM plus what torch's allocator holds unused,
    or the host's MemAvailable (Linux), or None where neither can be read (then nothing is
    refused); on the host, no more than an address-space limit leaves."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        # blocks torch's caching allocator reserved and no tensor uses (an earlier probe's) are
        # this process's to reuse, though the driver counts them as taken
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free) + max(int(cached), 0)
    free = _host_available()
    left = address_space_left()
    return left if free is None else free if left is None else min(free, left)


def _host_available() -> int | None:
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


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text: "str | int | float", name: str = "max_memory") -> int:
    """"8G", "512MiB", "1.5GB", "4096" (bytes) → bytes. K/M/G/T alone are binary (GiB), as in
    `free -g`; KB/MB/GB decimal. Anything else is one error line naming the setting `name`."""
    from ..errors import ConfigError, setting

    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        import re

        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
        if match is None or match.group(2).lower() not in _UNITS:
            raise ConfigError(f"{setting(name)} expects a size such as 8G, 512M or 1.5GiB (bytes without a unit), got {text!r}")
        value, unit = float(match.group(1)), match.group(2).lower()
    if not value * _UNITS[unit] < 2**63:  # 1e400 reads as inf, NaN compares false: no size
        raise ConfigError(f"{setting(name)} must be a finite size below 8 EiB, got {text!r}")
    size = int(value * _UNITS[unit])
    if size < 1:
        raise ConfigError(f"{setting(name)} must be a positive size, got {text!r}")
    return size


def resident_bytes(device: torch.device) -> int:
    """What this process holds now on `device`: its resident set on the host (/proc/self/statm),
    or the tensors torch has allocated on a CUDA device; 0 where it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return _statm(1) or 0


def process_allowance(device: torch.device, cap: int, held: int) -> int:
    """The bytes the probes' working sets may take when the whole process may hold `cap`
    (the max_memory setting) and holds `held` already — torch itself, the model and the samples (about
    1.25 GB for a ViT-B/16 at batch 8) count against the cap, as a user who sizes the flag to
    the machine expects; on the host no more than an address-space limit (`ulimit -v`) leaves,
    as for the default. Refuses (exit 2) a cap the process is already over."""
    from ..errors import ConfigError, setting

    if held >= cap:
        raise ConfigError(f"{setting('max_memory')} {cap:,} bytes ({gib(cap)}) leaves no room: with the model and samples "
                          f"loaded this process already holds {held:,} bytes ({gib(held)}), a floor the cap "
                          "cannot cut (torch alone holds about 0.5 GiB once imported); give that much more "
                          "than the probes need")
    left = address_space_left() if device.type == "cpu" else None
    return cap - held if left is None else min(cap - held, left)


def memory_limit(device: torch.device, requested: int | None) -> int | None:
    """The bytes a probe's working set may take: max_memory's allowance when given, else half of what is
    free now (MemAvailable, or CUDA's free VRAM) — the other half is left to the model's own
    forward/backward buffers, the allocator's slack and other processes. None: unknown."""
    if requested is not None:
        return requested
    have = available_bytes(device)
    return None if have is None else have // 2


def chunk_size(per_item: int, limit: int | None, what: str, total: int | None = None) -> int:
    """How many items of `per_item` bytes fit in `limit`; refuses (ConfigError, exit 2) up front
    when even one does not, with the size it would need."""
    from ..errors import ConfigError, setting

    if limit is None:
        return total or 1 << 30
    if per_item > limit:
        raise ConfigError(f"{what} needs about {gib(per_item)} even one at a time, more than the "
                          f"{gib(limit)} allowed ({limit_words()}); "
                          f"raise {setting('max_memory')} or free memory")
    n = max(1, limit // max(1, per_item))
    return n if total is None else min(n, total)


def most_that_fit(per_item: int, fixed: int, limit: int | None) -> int | None:
    """How many items of `per_item` bytes fit in `limit` beside `fixed` bytes (None: no limit)."""
    if limit is None:
        return None
    return max(0, (limit - fixed) // max(1, per_item))


def refuse_count(count: int, per_item: int, fixed: int, limit: int | None, what: str, flag: str,
                 least: int = 1) -> None:
    """Refuse (ConfigError, exit 2) up front a request for `count` stored vectors of `per_item`
    bytes (plus `fixed`) that does not fit `limit`, naming the bytes it needs, the limit and
    the largest `flag` that fits (or that none ≥ `least` does). Fewer vectors would change
    the quantity, which is the user's decision, so it is never done silently."""
    from ..errors import ConfigError, setting

    need = count * per_item + fixed
    if limit is None or need <= limit:
        return
    most = most_that_fit(per_item, fixed, limit)
    fix = (f"{flag} {most} fits" if most >= least else f"no {flag} ≥ {least} fits")
    working = f" and {fixed:,} bytes of working vectors" if fixed else ""
    raise ConfigError(f"{what} would hold {count} vectors of {per_item:,} bytes{working}, {need:,} bytes "
                      f"({gib(need)}) in all, more than the {limit:,} bytes ({gib(limit)}) allowed ({limit_words()}); "
                      f"{fix}, or raise {setting('max_memory')}")
