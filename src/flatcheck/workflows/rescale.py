"""Function-preserving reparametrisations (Fig. 1 of Anonymous 2025, "Sharpness
can be manipulated and misleading for generalization").

- relu-pair: z_{l+1} = W_{l+1} φ(W_l x + b_l) with φ positively homogeneous (ReLU, pooling, …):
  W_l, b_l ×α and W_{l+1} ×1/α leave the function unchanged.
- before-bn: a Linear/Conv followed by BatchNorm: W, b ×α is undone by the normalisation.
  With batch statistics (--bn-mode train) exactly; with running statistics only after the
  running mean/variance are rescaled too (×α, ×α²), and then up to BN's eps.

Layers are paired in module-definition order, which is the execution order for chains;
every rescaling is checked on the data afterwards, so a wrong pairing cannot go unnoticed.
"""

from __future__ import annotations

import contextlib

from dataclasses import dataclass

import torch
from torch import nn

from ..errors import ConfigError

LINEAR = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
# maps with φ(αx) = αφ(x) for α > 0; dropout is off in every flatcheck forward
HOMOGENEOUS = (nn.ReLU, nn.LeakyReLU, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AvgPool1d, nn.AvgPool2d,
               nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d, nn.Flatten,
               nn.Identity, nn.Dropout)
BATCHNORM = nn.modules.batchnorm._BatchNorm


@dataclass(frozen=True)
class Rescaling:
    kind: str  # "relu-pair" | "before-bn"
    up: str  # module whose weight (and bias) is multiplied by alpha
    down: str  # the next Linear/Conv (relu-pair) or the BatchNorm (before-bn)
    alpha: float

    def describe(self) -> str:
        if self.kind == "relu-pair":
            return f"{self.up} ×{self.alpha:g}, {self.down} ×1/{self.alpha:g}"
        return f"{self.up} ×{self.alpha:g} before BatchNorm {self.down}"


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and not any(True for _ in m.children())]


def find_rescaling(model: nn.Module, alpha: float, layer: str | None = None) -> Rescaling:
    """The first rescalable layer (or `layer`): a relu-pair if there is one, else before-bn."""
    return candidate_rescalings(model, alpha, layer)[0]


def candidate_rescalings(model: nn.Module, alpha: float, layer: str | None = None) -> list[Rescaling]:
    """Every rescaling the modules' order suggests (or `layer`'s), relu-pairs first. The order
    of modules is not the order of the computation (an attention block's qkv and proj sit side
    by side with a softmax between them, which no module shows), so each must still be checked
    on the model's outputs (workflows.invariance)."""
    if not alpha > 0 or alpha == 1:
        raise ConfigError(f"--alpha must be positive and not 1, got {alpha}")
    leaves = _leaves(model)
    found: list[Rescaling] = []
    for i, (name, mod) in enumerate(leaves):
        if not isinstance(mod, LINEAR) or (layer is not None and name != layer):
            continue
        for nxt_name, nxt in leaves[i + 1 :]:
            if isinstance(nxt, LINEAR):
                found.append(Rescaling("relu-pair", name, nxt_name, alpha))
                break
            if isinstance(nxt, BATCHNORM):
                found.append(Rescaling("before-bn", name, nxt_name, alpha))
                break
            if not isinstance(nxt, HOMOGENEOUS):
                break
    if not found:
        where = f"layer {layer!r}" if layer else "the model"
        raise ConfigError(
            f"--layer: no function-preserving rescaling found for {where}: it needs a Linear/Conv followed "
            f"(through ReLU/pooling only) by another Linear/Conv, or by a BatchNorm"
        )
    return [r for r in found if r.kind == "relu-pair"] + [r for r in found if r.kind != "relu-pair"]


@contextlib.contextmanager
def trial(model: nn.Module, r: Rescaling):
    """`r` applied for the block, the touched tensors restored bit for bit after it."""
    modules = dict(model.named_modules())
    saved = [t for m in (modules[r.up], modules[r.down])
             for t in (getattr(m, "weight", None), getattr(m, "bias", None),
                       getattr(m, "running_mean", None), getattr(m, "running_var", None)) if t is not None]
    copies = [t.detach().clone() for t in saved]
    apply_rescaling(model, r)
    try:
        yield
    finally:
        with torch.no_grad():
            for t, c in zip(saved, copies):
                t.copy_(c)


@torch.no_grad()
def apply_rescaling(model: nn.Module, r: Rescaling) -> None:
    modules = dict(model.named_modules())
    up = modules[r.up]
    up.weight.mul_(r.alpha)
    if up.bias is not None:
        up.bias.mul_(r.alpha)
    down = modules[r.down]
    if r.kind == "relu-pair":
        down.weight.div_(r.alpha)
    elif down.running_mean is not None:
        down.running_mean.mul_(r.alpha)
        down.running_var.mul_(r.alpha**2)
