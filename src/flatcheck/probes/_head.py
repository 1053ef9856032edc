"""The final linear layer z = W·φ + b: its features φ, captured in the forward the logits need.

Everything closed-form about the head (its Hessian trace, relative flatness) rests on one
fact: the logits are affine in one feature vector per sample. That holds for a Linear
head on pooled features and for a 1×1-conv head followed by global average pooling, where
φ is the spatial average of the head's input (the same algebra holds for a K×K conv with φ
the average patch, which `_features` handles should a spec name one). It fails
when the model post-processes the head's output (an activation after a conv head, a logit
scale, a second distillation head), so every batch is checked: W·φ + b must reproduce the
model's own logits to within the rounding the head's arithmetic can produce.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..backends.base import Backend
from ..errors import ConfigError, InputError, SpecError, setting
from ..models.sources import find_head
from ..models.spec import LossSpec, ModelSpec

# the help of the probes' `head` option (head-trace, relative-flatness): how resolve_head picks it
HEAD_HELP = "module name of the final linear layer [default: the spec's head, else the last Linear / 1x1 Conv2d]"


class HeadError(InputError):
    """The model's logits are not an affine function of one head-feature vector per sample."""


@dataclass(frozen=True)
class Head:
    name: str
    module: nn.Module

    @property
    def is_conv(self) -> bool:
        return isinstance(self.module, nn.Conv2d)

    def matrix(self) -> Tensor:
        """W as (C, D); a conv's filters flattened in F.unfold's (channel, kh, kw) order."""
        w = self.module.weight.detach()
        return w.reshape(w.shape[0], -1)

    def bias(self) -> Tensor | None:
        b = self.module.bias
        return None if b is None else b.detach()

    def param_names(self) -> tuple[str, ...]:
        names = [f"{self.name}.weight"]
        if self.module.bias is not None:
            names.append(f"{self.name}.bias")
        return tuple(names)


def resolve_head(model: nn.Module, spec: ModelSpec | None, name: str | None = None) -> Head:
    """The head named by `name`, else by the spec, else auto-detected (last Linear / 1×1 conv)."""
    if spec is None:
        # library use without a spec: a python-source spec auto-detects in module order
        spec = ModelSpec(source="python", arch=type(model).__name__)
    if name is not None:
        try:
            head = find_head(model, dataclasses.replace(spec, head=name), named=setting("head"))
        except SpecError as exc:  # the user gave head (--head), not the spec's field: a setting's error
            raise ConfigError(exc.args[0]) from None
    else:
        head = find_head(model, spec)
    module = dict(model.named_modules())[head]
    if isinstance(module, nn.Conv2d) and module.groups != 1:
        raise ConfigError(f"head {head!r} is a grouped convolution (groups={module.groups}); "
                          "the closed forms need one dense weight matrix")
    return Head(head, module)


@dataclass(frozen=True)
class HeadBatch:
    phi: Tensor  # (B, D) features, in the model's dtype
    logits: Tensor  # (B, C), the model's own output
    y: Tensor
    weight: float  # |batch| / N


@contextlib.contextmanager
def _capture_input(module: nn.Module) -> Iterator[list[Tensor]]:
    seen: list[Tensor] = []

    def hook(_module, args, _output):
        seen.append(args[0].detach())

    handle = module.register_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()


def head_batches(backend: Backend, head: Head) -> Iterator[HeadBatch]:
    """(φ, logits, y, weight) per batch of the backend's sample set, one forward each.

    The forwards are the backend's own `outputs()`, so model mode (dropout off, BatchNorm
    statistics) is exactly the one every other probe sees.
    """
    outputs = iter(backend.outputs())
    while True:
        # hooked for one forward at a time: no hook outlives a caller that stops early
        with _capture_input(head.module) as seen:
            item = next(outputs, None)
        if item is None:
            return
        logits, y, weight = item
        if len(seen) != 1:
            raise HeadError(f"head {head.name!r} ran {len(seen)} times in one forward; the closed forms "
                            "need it applied once per sample (set 'head' in the spec to the final layer)")
        phi, spread, positions = _features(head, seen[0])
        check_affine(head, phi, spread, positions, logits)
        yield HeadBatch(phi, logits, y, weight)


def _features(head: Head, raw: Tensor) -> tuple[Tensor, Tensor, int]:
    """φ (B, D), mean |φ_t| over positions (B, D) and the number of positions averaged;
    the last two bound the rounding of the head.

    Positions (pixels for a conv, tokens for a Linear on (B, T, D)) are averaged: logits
    are affine in that average exactly when the model averages after the head, which is
    what `check_affine` then verifies rather than assumes.
    """
    m = head.module
    if head.is_conv:
        patches = F.unfold(raw, m.kernel_size, dilation=m.dilation, padding=m.padding, stride=m.stride)
        return patches.mean(-1), patches.abs().mean(-1), patches.shape[-1]  # (B, D·kh·kw, T)
    if raw.ndim == 2:
        return raw, raw.abs(), 1
    flat = raw.reshape(raw.shape[0], -1, raw.shape[-1])  # (B, T, D): a per-token head
    return flat.mean(1), flat.abs().mean(1), flat.shape[1]


def check_affine(head: Head, phi: Tensor, spread: Tensor, positions: int, logits: Tensor) -> None:
    """Raise unless logits = W·φ + b up to the head's own floating-point rounding.

    The bound is the classical one for a length-n sum, γ_n = n·u/(1 − n·u) times the sum
    of magnitudes, with n = D (the dot product) + positions averaged + a few more for the
    bias and the pooling division; u is the unit roundoff of the arithmetic the head ran in
    (TF32 when CUDA allows it). Anything larger cannot be rounding.
    """
    W, b = head.matrix().to(torch.float64), head.bias()
    phi64 = phi.to(torch.float64)
    recon = phi64 @ W.T
    magnitude = spread.to(torch.float64) @ W.abs().T
    if b is not None:
        recon = recon + b.to(torch.float64)
        magnitude = magnitude + b.to(torch.float64).abs()
    if logits.shape != recon.shape:
        raise HeadError(f"head-trace needs logits = W·φ + b for head {head.name!r}: the model returns "
                        f"{tuple(logits.shape)} but the head gives {tuple(recon.shape)}")
    n = phi.shape[1] + positions + 4
    u = _unit_roundoff(logits)
    gamma = n * u / (1 - n * u)
    deviation = (logits.to(torch.float64) - recon).abs()
    excess = deviation - gamma * (magnitude + logits.to(torch.float64).abs())
    if (excess > 0).any() or not torch.isfinite(deviation).all():
        worst = deviation.max().item()
        raise HeadError(
            f"head-trace needs logits = W·φ + b for head {head.name!r}, but the model's logits differ from it "
            f"by up to {worst:.3g} (more than float rounding): the model transforms the head's output "
            "(an activation or pooling other than an average after the head, a logit scale, a second head)"
        )


def _unit_roundoff(t: Tensor) -> float:
    if t.dtype == torch.float32 and t.is_cuda and (torch.backends.cuda.matmul.allow_tf32
                                                   or torch.backends.cudnn.allow_tf32):
        return 2.0**-11
    return torch.finfo(t.dtype).eps / 2


def logit_curvature(logits: Tensor, y: Tensor, loss: LossSpec) -> tuple[Tensor, Tensor | None]:
    """A_n = ∇²_z ℓ as diag(a_n) − q_n q_nᵀ, in float64: (a, q), q None when A is diagonal.

    Every flatcheck loss has this shape (see flatcheck.losses): softmax cross entropy,
    with or without label smoothing, has a = q = p; mse and sigmoid-mse are diagonal.
    It keeps Tr(A) and Tr(A·M) at O(C) and O(C²) per sample where the generic factors
    (B, C, C) of losses.output_hessian_factors would cost C² memory per sample.
    """
    from ..losses import apply_output_hessian

    z = logits.detach().to(torch.float64)
    if loss.name in ("cross_entropy", "label_smoothing"):
        p = z.softmax(-1)
        return p, p
    if loss.name in ("mse", "sigmoid_mse"):
        return apply_output_hessian(z, y, loss, torch.ones_like(z)), None
    raise ConfigError(f"loss {loss.name!r} has no closed-form head curvature in flatcheck")


@dataclass(frozen=True)
class HeadStatistics:
    """Closed forms for the whole-sample-set loss L = (1/N) Σ_n ℓ(W·φ_n + b, y_n).

    Since z is linear in (W, b), ∇²_{W} L = (1/N) Σ_n A_n ⊗ φ_n φ_nᵀ and ∇²_b L = (1/N) Σ_n A_n
    for every loss, with A_n = ∇²_z ℓ; the traces and κ below are sums of those blocks.
    All in float64.
    """

    head: Head
    samples: int
    weight_trace: float  # (1/N) Σ_n Tr(A_n) ‖φ_n‖²
    bias_trace: float | None  # (1/N) Σ_n Tr(A_n); None without a bias
    class_trace: Tensor  # (C,) Tr of the Hessian block of row w_s: (1/N) Σ_n A_n[s,s] ‖φ_n‖²
    kappa: float  # Σ_{s,s'} ⟨w_s, w_s'⟩ Tr(H_{s,s'}) = (1/N) Σ_n ‖φ_n‖² Tr(A_n W Wᵀ)
    class_kappa: Tensor  # (C,) Σ_{s'} ⟨w_s, w_s'⟩ Tr(H_{s,s'}); sums to kappa
    weight_diagonal: Tensor | None  # (C, D) diag of ∇²_W L when asked for
    bias_diagonal: Tensor | None  # (C,) diag of ∇²_b L
    feature_sqnorm: float  # (1/N) Σ_n ‖φ_n‖²

    @property
    def trace(self) -> float:
        return self.weight_trace + (self.bias_trace or 0.0)


def head_statistics(backend: Backend, head: Head, *, diagonal: bool = False) -> HeadStatistics:
    """One forward per batch; `diagonal` also keeps the exact Hessian diagonal (for checks)."""
    loss = backend.problem.loss
    W = head.matrix().to(torch.float64)
    gram = W @ W.T  # ⟨w_s, w_s'⟩
    C, D = W.shape
    zeros = dict(dtype=torch.float64, device=W.device)
    tr_w = tr_b = sq = kappa = 0.0
    class_trace, class_kappa = torch.zeros(C, **zeros), torch.zeros(C, **zeros)
    diag_w = torch.zeros(C, D, **zeros) if diagonal else None
    diag_b = torch.zeros(C, **zeros)
    n = 0
    for batch in head_batches(backend, head):
        a, q = logit_curvature(batch.logits, batch.y, loss)
        phi = batch.phi.to(torch.float64)
        scale = batch.weight / phi.shape[0]  # = 1/N
        phi_sq = phi.pow(2).sum(1)
        diag_a = a if q is None else a - q * q  # A_n[s, s]
        # diag(A_n G) = a ⊙ diag(G) − q ⊙ (G q): per-class terms of Tr(A_n W Wᵀ)
        a_gram = a * gram.diagonal() if q is None else a * gram.diagonal() - q * (q @ gram)
        tr_a = diag_a.sum(1)
        tr_w += (tr_a * phi_sq).sum().item() * scale
        tr_b += tr_a.sum().item() * scale
        sq += phi_sq.sum().item() * scale
        class_trace += (diag_a * phi_sq[:, None]).sum(0) * scale
        class_kappa += (a_gram * phi_sq[:, None]).sum(0) * scale
        diag_b += diag_a.sum(0) * scale
        if diag_w is not None:
            diag_w += diag_a.T @ phi.pow(2) * scale
        n += phi.shape[0]
    kappa = class_kappa.sum().item()
    has_bias = head.module.bias is not None
    return HeadStatistics(
        head=head, samples=n, weight_trace=tr_w, bias_trace=tr_b if has_bias else None,
        class_trace=class_trace.cpu(), kappa=kappa, class_kappa=class_kappa.cpu(),
        weight_diagonal=None if diag_w is None else diag_w.cpu(),
        bias_diagonal=diag_b.cpu() if has_bias and diagonal else None, feature_sqnorm=sq,
    )
