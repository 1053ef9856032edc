"""A caller's live model, left exactly as it was: what flatcheck.measure and the Tracker
promise a training script or a notebook.

Probes run on the caller's own module (or on a copy when another device or dtype is asked
for). They are written not to change it — products go through torch.autograd.grad, never
.backward(); model_mode restores every training flag; perturbing probes write the weights
back — but a training loop that goes on afterwards must not depend on that being true of
every probe and every backend, so the state a loop reads is saved before and restored after.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor, nn


def _bits(t: Tensor) -> Tensor:
    # bitwise: NaN equals the same NaN, and -0.0 differs from 0.0
    flat = t.detach().reshape(-1)
    return flat.view(torch.uint8) if flat.element_size() > 0 else flat


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


class _Snapshot:
    """Values of every parameter, buffer and .grad; requires_grad flags; training and
    track_running_stats flags; the TF32 switches (a CUDA run sets them)."""

    def __init__(self, model: nn.Module):
        self.tensors = [(t, t.detach().clone()) for t in _tensors(model)]
        self.grads = [(p, p.grad, None if p.grad is None else p.grad.detach().clone()) for p in model.parameters()]
        self.requires_grad = [(p, p.requires_grad) for p in model.parameters()]
        self.training = [(m, m.training) for m in model.modules()]
        self.tracking = [(m, m.track_running_stats) for m in model.modules()
                         if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)

    def restore(self) -> None:
        with torch.no_grad():
            for t, saved in self.tensors:
                if not _same(t, saved):  # an unchanged tensor keeps its version counter
                    t.copy_(saved)
            for p, grad, saved in self.grads:
                if grad is not None and not _same(grad, saved):
                    grad.copy_(saved)
                if p.grad is not grad:
                    p.grad = grad
        for p, flag in self.requires_grad:
            if p.requires_grad != flag:
                p.requires_grad_(flag)
        for m, flag in self.training:
            m.training = flag
        for m, flag in self.tracking:
            m.track_running_stats = flag
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.tf32


def _tensors(model: nn.Module) -> Iterator[Tensor]:
    seen: set[int] = set()
    for t in (*model.parameters(), *model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            yield t


def cuda_indices(model: nn.Module, *devices: torch.device) -> list[int]:
    """The CUDA devices whose RNG state a run on this model could draw from."""
    found = {t.device for t in _tensors(model)} | set(devices)
    return sorted({d.index if d.index is not None else torch.cuda.current_device()
                   for d in found if d.type == "cuda"})


@contextlib.contextmanager
def preserved(model: nn.Module, *devices: torch.device) -> Iterator[None]:
    """Whatever runs inside leaves `model` bitwise as it was (values of weights, buffers and
    .grad, the .grad tensors themselves, requires_grad, train/eval and BatchNorm flags) and
    the global CPU and CUDA random states as they were."""
    snapshot = _Snapshot(model)
    try:
        with torch.random.fork_rng(devices=cuda_indices(model, *devices)):
            yield
    finally:
        snapshot.restore()


def is_finite(model: nn.Module) -> bool:
    """Every parameter finite: a diverged training step is named before any product is made."""
    with torch.no_grad():
        return all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.dtype.is_floating_point)
