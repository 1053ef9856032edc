"""The problem every tool sees: one model, one list of batches, one loss, one dtype and device."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from peers.tasks import DataCfg, ModelCfg

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Setup:
    model: torch.nn.Module
    problem: Any  # flatcheck Problem
    batches: list  # [(x, y)] the same tensors flatcheck iterates
    criterion: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    n: int


def build_setup(model: ModelCfg, data: DataCfg, device: str) -> Setup:
    from flatcheck.api import resolve_device
    from flatcheck.backends import ParamLayout
    from flatcheck.problem import Problem
    from flatcheck.data.batches import SampleSet
    from flatcheck.data.registry import create_dataset
    from flatcheck.models.checkpoint import apply_state_dict, load_checkpoint
    from flatcheck.models.sources import build_model, resolve_preprocess
    from flatcheck.models.spec import load_spec

    spec = load_spec(ROOT / "model_specs" / model.spec)
    if spec.loss.name != "cross_entropy":
        raise ValueError(f"{model.spec}: the peers are given torch's CrossEntropyLoss, but the spec's loss is {spec.loss.name}")
    torch.manual_seed(0)
    net = build_model(spec)  # timm models: flatcheck calls timm.layers.set_fused_attn(False) first
    if model.checkpoint is not None:
        apply_state_dict(net, load_checkpoint(ROOT / model.checkpoint).state_dict)
    pre = resolve_preprocess(spec, net)
    ds = create_dataset(model.data, split="train", preprocess=pre, num_classes=spec.num_classes, seed=0)
    dev = resolve_device(device)
    if dev.type == "cuda":
        # flatcheck's default (TF32 rounds to 10 mantissa bits); torch leaves cuDNN's TF32 on,
        # so without this the peers' convolutions would run in TF32 and flatcheck's would not
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, data.dtype)
    net.to(device=dev, dtype=dtype).eval()
    samples = SampleSet(ds, samples=data.samples, batch_size=data.batch, device=dev, dtype=dtype)
    batches = [(b.x, b.y) for b in samples]
    problem = Problem(net, spec.loss, samples, ParamLayout.from_model(net), bn_mode="eval")
    return Setup(net, problem, batches, torch.nn.CrossEntropyLoss(), dev, dtype, samples.n)


def flat_params(setup: Setup) -> list[torch.Tensor]:
    return setup.problem.layout.params(setup.model)


def reference_hvp(setup: Setup, v: torch.Tensor) -> torch.Tensor:
    """H v with the reference backend: checks a peer's eigenvector, outside its timing and count."""
    from flatcheck.backends import create_backend

    return create_backend("autograd", setup.problem).hvp(v.reshape(1, -1).to(setup.dtype))[0]


def relative_residual(setup: Setup, lam: float, vec) -> float:
    v = vec if isinstance(vec, torch.Tensor) else torch.cat([t.reshape(-1) for t in vec])
    v = v.detach().reshape(-1).to(device=setup.device, dtype=setup.dtype)
    v = v / torch.linalg.vector_norm(v)
    hv = reference_hvp(setup, v)
    rq = torch.dot(v, hv).item()
    return torch.linalg.vector_norm(hv - rq * v).item() / abs(rq if rq != 0 else lam)
