"""--max-memory for the curvature probes: the limit split between the vectors an
estimator stores (planned in flatcheck.linalg) and the graphs of the batches the backend's
products run over (cut into micro-batches by the backend, flatcheck.engines.microbatch)."""

from __future__ import annotations

from ..backends.base import LimitMemory
from ..linalg.memory import memory_limit
from .registry import ProbeContext


def probe_limit(ctx: ProbeContext) -> int | None:
    """The bytes this probe's working set may take: --max-memory, or half of what is free."""
    return memory_limit(ctx.backend.problem.device, ctx.memory_allowance)


def limit_products(ctx: ProbeContext, limit: int | None, stored: int, what: str) -> dict:
    """Leave the backend what the stored vectors leave of `limit` for its graphs (a backend
    without micro-batches runs its batches whole); the plan, for the result's details."""
    plan = None
    if isinstance(ctx.backend, LimitMemory):
        plan = ctx.backend.limit_memory(None if limit is None else limit - stored, f"probe {what}")
    return {"limit_bytes": limit, "stored_vector_bytes": stored, **cap_details(ctx),
            **(plan.details() if plan is not None else {})}


# what --max-memory holds and what it cannot, for the details and a capped run's note
CAP_COVERS = ("the process's whole footprint from the probes' start: what it held then (Python, torch, the model "
              "and the samples; about 0.5 GiB resident for torch alone on the host) counts against the cap and "
              "cannot be cut by it, and the probes' planned vectors and batch graphs are held to the rest. Not "
              "planned: small temporaries of the products, and, on the host, torch's library pages read in at "
              "interpreter exit after the results are written (about 125 MiB more in /usr/bin/time's maximum "
              "resident set than the process measures at its end)")


def cap_details(ctx: ProbeContext) -> dict:
    """--max-memory as given and what the process held when the probes started, which
    `limit_bytes` is the difference of, and what the cap covers (empty without --max-memory)."""
    if ctx.memory_cap is None:
        return {}
    return {"max_memory_bytes": ctx.memory_cap, "process_held_bytes": ctx.memory_held,
            "device": ctx.backend.problem.device.type, "max_memory_covers": CAP_COVERS}


def peak_bytes(device: str) -> int | None:
    """The process's peak so far: the host's maximum resident set (getrusage), or the most torch
    has allocated on a CUDA device; None where it cannot be read."""
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    try:
        import resource
        import sys

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


def memory_note(memory: dict) -> str:
    """A note's clause when batches were cut to fit, and under --max-memory the peak so far
    beside the cap and what the process held before the probes (recorded in `memory` as
    peak_bytes, taken when the probe ends); empty otherwise."""
    size = memory.get("microbatch_samples")
    note = "" if size is None else (f"; batches cut into micro-batches of {size} sample{'' if size == 1 else 's'} "
                                    f"({memory['chunks_per_batch']} per batch) to fit --max-memory")
    cap = memory.get("max_memory_bytes")
    if cap is None:
        return note
    peak = memory["peak_bytes"] = peak_bytes(memory.get("device", "cpu"))
    held = memory.get("process_held_bytes") or 0
    if peak is None:
        return note
    over = " (over it: see details.memory.max_memory_covers)" if peak > cap else ""
    return (note + f"; --max-memory {_mib(cap)}: peak {_mib(peak)} so far{over}, {_mib(held)} of it held before "
            "the probes (torch, model, samples)")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"
