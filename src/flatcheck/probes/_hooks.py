"""Forward hooks that capture what flows into Linear/Conv layers and out of ReLU-like layers.

Both captures are keyed by *call*, not by module: a module applied twice in one forward
(weight sharing, a reused activation object) gives two entries, "name" and "name#2",
because each call sees a different tensor.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

from torch import Tensor, nn

# Matched by class name as well as by type, so that timm's own activation classes
# (timm.layers.activations.GELU, Swish, …, plain nn.Module subclasses) are picked up too.
RELU_LIKE_NAMES = frozenset({
    "ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "GELU", "GELUTanh", "QuickGELU", "ELU", "CELU",
    "SELU", "SiLU", "Swish", "Mish", "Hardswish", "HardSwish",
})
_LINEAR_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def is_relu_like(module: nn.Module) -> bool:
    return type(module).__name__ in RELU_LIKE_NAMES


def is_linear_like(module: nn.Module) -> bool:
    """Layers z = W h + b (dense or convolutional) whose input h the MLS family perturbs."""
    return isinstance(module, _LINEAR_TYPES)


def named_matching(model: nn.Module, predicate: Callable[[nn.Module], bool]) -> list[tuple[str, nn.Module]]:
    return [(name or "<root>", m) for name, m in model.named_modules() if predicate(m)]


@dataclass
class Call:
    key: str  # module name, "#k" appended for the k-th call (k ≥ 2) within one forward
    module: nn.Module
    input: Tensor
    output: Tensor


@dataclass
class Recorder:
    """Calls of the watched modules during the forwards run inside `record`, in call order."""

    calls: list[Call] = field(default_factory=list)
    _counts: dict[str, int] = field(default_factory=dict)

    def reset(self) -> None:
        """Forget the calls of the previous forward; call before each new forward."""
        self.calls.clear()
        self._counts.clear()

    def _key(self, name: str) -> str:
        k = self._counts.get(name, 0) + 1
        self._counts[name] = k
        return name if k == 1 else f"{name}#{k}"


@contextlib.contextmanager
def record(modules: list[tuple[str, nn.Module]],
           on_call: Callable[[str, nn.Module, Tensor, Tensor], None] | None = None) -> Iterator[Recorder]:
    """Hook `modules` for the duration of the block.

    Without `on_call` every call's (input, output) is kept, graph included, so gradients
    with respect to layer inputs can be taken afterwards. With `on_call` nothing is kept:
    the callback sees the output at the moment the module returns, before any later
    in-place operation (e.g. a residual `+=`) can overwrite it.
    """
    rec = Recorder()

    def make_hook(name: str):
        def hook(module, args, output):
            inp = args[0] if args else None
            key = rec._key(name)
            if on_call is not None:
                on_call(key, module, inp, output)
            else:
                rec.calls.append(Call(key, module, inp, output))

        return hook

    handles = [m.register_forward_hook(make_hook(name)) for name, m in modules]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()
