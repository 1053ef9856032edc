"""Whether `--backend func --compile` pays for itself: a pure decision from the planned
products and the per-product costs eager and compiled, with the compile time, so that it is
tested without a GPU and says why (a probe's details.route_reason).

A compiled HVP fuses the many small kernels of a forward-over-reverse pass; where products are
launch-bound (small models on a GPU) that is most of their time, where they are compute-bound it
is little, and compiling costs seconds to minutes once per shape. On a CPU the gain is small and
the compile long, so it is never chosen there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompileChoice:
    """Whether the HVP is compiled, and why (a probe's details.route_reason)."""

    compile: bool
    reason: str


def compile_pays(*, device_type: str, planned_products: int, eager_seconds: float | None,
                 compiled_seconds: float | None, compile_seconds: float | None,
                 eager_route: str = "eager") -> CompileChoice:
    """Whether compiling the HVP pays for itself: on a CUDA device only (on a CPU the compiled
    code's gain is small and its compile time large), and only when the time the planned
    products save, planned × (eager − compiled) per product, exceeds the compile time. Costs
    not known (None) decide for eager: compiling is never chosen on a guess.

    `eager_seconds` is the product that would run otherwise, the fastest eager route
    (`eager_route` names it): on a compute-bound model the compiled func product can be slower
    than the autograd one (ViT-B/16 on an H200: 0.83 s against 0.77 s), so comparing with eager
    func alone would compile for a loss."""
    if device_type != "cuda":
        return CompileChoice(False, f"eager: products are compiled on a CUDA device only, not {device_type}")
    if planned_products < 1:
        return CompileChoice(False, "eager: no products planned")
    if eager_seconds is None or compiled_seconds is None or compile_seconds is None:
        return CompileChoice(False, "eager: the compiled product's cost is not known for this model")
    saved = planned_products * (eager_seconds - compiled_seconds)
    words = (f"{planned_products} planned products at {eager_seconds:.3g} s eager ({eager_route}) and "
             f"{compiled_seconds:.3g} s compiled save {saved:.3g} s against {compile_seconds:.3g} s of compiling")
    if saved > compile_seconds:
        return CompileChoice(True, f"compiled: {words}")
    return CompileChoice(False, f"eager: {words}")
