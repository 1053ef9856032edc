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


def cap_details(ctx: ProbeContext) -> dict:
    """--max-memory as given and what the process held when the probes started, which
    `limit_bytes` is the difference of (empty without --max-memory)."""
    if ctx.memory_cap is None:
        return {}
    return {"max_memory_bytes": ctx.memory_cap, "process_held_bytes": ctx.memory_held}


def memory_note(memory: dict) -> str:
    """A note's clause when batches were cut to fit (empty otherwise)."""
    size = memory.get("microbatch_samples")
    if size is None:
        return ""
    return (f"; batches cut into micro-batches of {size} sample{'' if size == 1 else 's'} "
            f"({memory['chunks_per_batch']} per batch) "
            "to fit --max-memory")
