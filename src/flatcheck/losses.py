"""Per-sample losses and their Hessians in output space.

Conventions, with f the logits and e_y the one-hot target:
- cross_entropy:   ℓ = −log softmax(f)_y
- label_smoothing: cross entropy against (1 − α)·e_y + α/C (torch's definition)
- mse:             ℓ = ½‖f − e_y‖²            (the ½ makes A = I)
- sigmoid_mse:     ℓ = ½‖σ(f) − e_y‖²         (Chen et al. 2023 App. F)

A = ∇²_f ℓ is what the GGN G = (1/N) Σ Jᵀ A J uses. It is written as
A = Σ_k λ_k u_k u_kᵀ so that Tr(Jᵀ A J) = Σ_k λ_k ‖Jᵀ u_k‖² needs only VJPs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .models.spec import LossSpec


def per_sample_loss(logits: Tensor, y: Tensor, loss: LossSpec) -> Tensor:
    """Loss of each sample, shape (B,)."""
    if loss.name in ("cross_entropy", "label_smoothing"):
        return _pivoted_cross_entropy(logits, y, loss.alpha if loss.name == "label_smoothing" else 0.0)
    target = one_hot(y, logits)
    if loss.name == "mse":
        return 0.5 * (logits - target).pow(2).sum(-1)
    if loss.name == "sigmoid_mse":
        return 0.5 * (torch.sigmoid(logits) - target).pow(2).sum(-1)
    raise ValueError(f"unknown loss {loss.name!r}")  # spec validation makes this unreachable


def one_hot(y: Tensor, logits: Tensor) -> Tensor:
    """e_y in the logits' shape and dtype. A comparison rather than F.one_hot, which reads
    the labels' range back to Python and so cannot be traced (flatcheck.backends.quadform)."""
    classes = torch.arange(logits.shape[-1], device=y.device)
    return (y.unsqueeze(-1) == classes).to(logits.dtype)


def _pivoted_cross_entropy(z: Tensor, y: Tensor, alpha: float) -> Tensor:
    """−Σ_j t_j log softmax(z)_j, t = (1 − α)·e_y + α/C, pivoted on m = argmax z:

        ℓ = log1p(S) + Σ_j c_j z_j,   S = Σ_{j≠m} exp(z_j − z_m),   c = (e_m − e_y) + α·(e_y − 1/C),

    equal in real arithmetic since Σ_j t_j = 1 and log Σ_j exp(z_j) = z_m + log1p(S).
    Why not F.cross_entropy: its gradient at the target is exp(log p_y) − 1 and its second
    derivatives p⊙v − p(pᵀv), differences of nearly equal numbers once 1 − p_y falls below
    the dtype's eps (a float32 model at training accuracy 1 and loss ~1e-8), where they keep
    only round-off. Here every derivative of log1p(S) is a sum of small terms of one sign,
    and c is constant (zero for a correct hard-label sample: no +g − g at one index), in
    reverse mode, double backward and forward over reverse alike. m is an index: no Python
    branch, so the loss still traces (flatcheck.engines.quadform)."""
    e_m, s = _rest_over_top(z)
    c = e_m - one_hot(y, z)
    if alpha:
        c = c + alpha * (one_hot(y, z) - 1.0 / z.shape[-1])
    return torch.log1p(s) + (c * z).sum(-1)


def _rest_over_top(z: Tensor) -> tuple[Tensor, Tensor]:
    """(e_m, S): the one-hot of m = argmax z and S = Σ_{j≠m} exp(z_j − z_m) = Σ_{j≠m} p_j / p_m,
    a sum of terms ≤ 1 (no overflow) that keeps its relative accuracy where p_m rounds to 1."""
    m = z.argmax(-1, keepdim=True)
    e_m = one_hot(m.squeeze(-1), z)
    return e_m, (torch.exp(z - z.gather(-1, m)) * (1 - e_m)).sum(-1)


def below_top(logits: Tensor) -> Tensor:
    """1 − max softmax(logits) per sample, as S/(1 + S): no cancellation where the top
    probability rounds to 1 (the report's data.softmax_saturation reads it)."""
    s = _rest_over_top(logits)[1]
    return s / (1 + s)


def output_hessian_factors(logits: Tensor, y: Tensor, loss: LossSpec) -> tuple[Tensor, Tensor]:
    """Factors (U, lam) with A_n = Σ_k lam[n,k] · U[n,:,k] U[n,:,k]ᵀ; U is (B, C, K), lam (B, K).

    Cross entropy (with or without smoothing, since the soft target sums to one):
    A = diag(p) − ppᵀ = Σ_c p_c (e_c − p)(e_c − p)ᵀ, i.e. U[:, :, c] = e_c − p, lam = p.
    The entry (m, m), m = argmax p, is 1 − p_m, written Σ_{j≠m} p_j: on a saturated softmax
    1 − p_m rounds to nothing in float32 while the sum keeps its relative accuracy.
    """
    logits = logits.detach()
    b, c = logits.shape
    eye = torch.eye(c, dtype=logits.dtype, device=logits.device).expand(b, c, c)
    if loss.name in ("cross_entropy", "label_smoothing"):
        p = logits.softmax(-1)
        m = logits.argmax(-1)
        rows = torch.arange(b, device=logits.device)
        U = eye - p.unsqueeze(-1)
        U[rows, m, m] = below_top(logits)  # Σ_{j≠m} p_j
        return U, p
    if loss.name == "mse":
        return eye, torch.ones_like(logits)
    if loss.name == "sigmoid_mse":
        return eye, _sigmoid_mse_curvature(logits, y)
    raise ValueError(f"unknown loss {loss.name!r}")


def apply_output_hessian(logits: Tensor, y: Tensor, loss: LossSpec, u: Tensor) -> Tensor:
    """A_n u_n for a batch: logits (B, C), u (..., B, C) → same shape as u."""
    logits = logits.detach()
    if loss.name in ("cross_entropy", "label_smoothing"):
        # p ⊙ (u − pᵀu) = p ⊙ (d − pᵀd), d = u − u_m, m = argmax p: pᵀu ≈ u_m on a saturated
        # softmax and the difference loses everything; d_m = 0, so pᵀd sums only small terms
        p = logits.softmax(-1)
        m = logits.argmax(-1, keepdim=True)
        d = u - u.gather(-1, m.expand(*u.shape[:-1], 1))
        return p * (d - (p * d).sum(-1, keepdim=True))
    if loss.name == "mse":
        return u
    if loss.name == "sigmoid_mse":
        return _sigmoid_mse_curvature(logits, y) * u
    raise ValueError(f"unknown loss {loss.name!r}")


def _sigmoid_mse_curvature(logits: Tensor, y: Tensor) -> Tensor:
    # d²/df² ½(σ(f) − t)² = σ'² + (σ − t)·σ'', with σ' = σ(1−σ), σ'' = σ'(1 − 2σ).
    # The second term makes A indefinite away from interpolation; we keep it because
    # A is defined as the exact loss Hessian in logit space, whatever its sign.
    s = torch.sigmoid(logits)
    t = one_hot(y, logits)
    ds = s * (1 - s)
    return ds * ds + (s - t) * ds * (1 - 2 * s)


def sample_columns(U: Tensor, lam: Tensor, k: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Draw k of the C factor columns per sample, with replacement, with probability q and
    reweight by λ/(k·q), so Σ_k λ' ‖Jᵀu'‖² is unbiased for Σ_c λ ‖Jᵀu‖² whatever q is.

    q ∝ |λ_c|·‖u_c‖² — each column's share if J were isotropic; for cross entropy
    q_c ∝ p_c·‖e_c − p‖². Not q ∝ p: that keeps drawing the predicted class, whose column
    e_c − p ≈ 0 adds almost nothing on a confident model, so the estimate is far noisier
    (on the demo with k=2, ∝ p gave 27.1 ± 7.4 for a true 22.41). Draws are made on the
    CPU from `generator`, so a seed gives the same classes on every device.
    """
    b, c, _ = U.shape
    q = (lam.abs() * U.pow(2).sum(1)).to(torch.float64).cpu()
    q = q / q.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    idx = torch.multinomial(q, k, replacement=True, generator=generator)  # (B, k)
    w = lam.to(torch.float64).cpu().gather(1, idx) / (k * q.gather(1, idx))
    idx_dev = idx.to(U.device)
    U_k = U.gather(2, idx_dev.unsqueeze(1).expand(b, c, k))
    return U_k, w.to(device=lam.device, dtype=lam.dtype)
