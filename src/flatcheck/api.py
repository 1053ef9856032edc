"""run(config) -> Report: the library entry point the CLI, notebooks, gate and scan share.

Nothing here prints; progress goes to an optional callback.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from . import __version__
from .backends import Backend, ParamLayout, Problem, create_backend
from .backends.base import missing_capabilities, model_mode
from .config import DEFAULT_SAMPLES, RunConfig
from .data.batches import SampleSet
from .backends._dist import launched, local_cuda_device
from .data.preprocess import Preprocess
from .data.registry import create_dataset
from .errors import ConfigError, DataError, InputError, ModelError, first_line
from .losses import per_sample_loss
from .models.checkpoint import LoadedCheckpoint
from .models.load import build_with_weights
from .models.sources import resolve_preprocess
from .models.spec import ModelSpec, load_spec
from .probes.registry import ProbeContext, create_probe, requirements
from .report.result import ProbeResult, Report

ProgressFn = Callable[[str, int, int], None]


@dataclass
class Session:
    """A loaded model, its data and a backend: what probes run against."""

    config: RunConfig
    spec: ModelSpec
    checkpoint: LoadedCheckpoint | None  # None: the weights the model source built
    model: nn.Module
    samples: SampleSet
    backend: Backend
    device: torch.device
    num_classes: int
    preprocess: Preprocess

    def split_samples(self, split: str) -> SampleSet:
        """The configured data's `split`, capped at the same --samples, batched the same way."""
        if split == self.config.split:
            return self.samples
        c = self.config
        dataset = create_dataset(c.data, root=c.data_root, split=split, preprocess=self.preprocess,
                                 num_classes=self.spec.num_classes, seed=c.seed)
        n = min(self.samples.n, len(dataset))
        samples = SampleSet(dataset, samples=n, batch_size=c.batch_size, device=self.device, dtype=c.torch_dtype)
        _check_batches(self.model, samples, self.spec, c, self.num_classes)
        return samples


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # under torchrun each process takes its own GPU
        return local_cuda_device() if launched() else torch.device("cuda")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: CUDA is not available on this machine (torch {torch.__version__})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) present")
    return device


def open_session(config: RunConfig) -> Session:
    """Load spec, model, checkpoint and data, and check that they fit together."""
    spec = config.spec if isinstance(config.spec, ModelSpec) else load_spec(config.spec)
    # spec becomes the fully resolved one: library metadata filled in, every field's origin
    model, spec, checkpoint = build_with_weights(spec, config.checkpoint, config.trust_packages)
    preprocess = resolve_preprocess(spec, model)
    dataset = create_dataset(
        config.data,
        root=config.data_root,
        split=config.split,
        preprocess=preprocess,
        num_classes=spec.num_classes,
        seed=config.seed,
    )
    n = config.samples if config.samples is not None else min(DEFAULT_SAMPLES, len(dataset))
    device = resolve_device(config.device)
    if device.type == "cuda":
        # TF32 rounds products to 10 mantissa bits; curvature estimates are not worth that.
        torch.backends.cuda.matmul.allow_tf32 = config.allow_tf32
        torch.backends.cudnn.allow_tf32 = config.allow_tf32
    model.to(device=device, dtype=config.torch_dtype)
    samples = SampleSet(dataset, samples=n, batch_size=config.batch_size, device=device, dtype=config.torch_dtype)
    num_classes = _check_fit(model, samples, spec, config)
    layout = ParamLayout.from_model(model, config.params)
    problem = Problem(model=model, loss=spec.loss, samples=samples, layout=layout, bn_mode=config.bn_mode)
    backend = create_backend(config.backend, problem, compile=config.compile)
    return Session(config, spec, checkpoint, model, samples, backend, device, num_classes, preprocess)


def _check_fit(model: nn.Module, samples: SampleSet, spec: ModelSpec, config: RunConfig) -> int:
    """The model's class count, read from a forward of the first batch that checks shapes,
    with clear errors; then every batch is checked (`_check_batches`)."""
    batch = next(iter(samples))
    try:
        with model_mode(model, config.bn_mode), torch.no_grad():
            out = model(batch.x)
    except (RuntimeError, ValueError) as exc:
        first = first_line(exc) or type(exc).__name__
        raise InputError(
            f"{spec.where}: model {spec.arch} cannot take data '{config.data}' samples of shape "
            f"{tuple(batch.x.shape[1:])} (check input_size in the spec): {first}"
        ) from None
    if out.ndim != 2:
        raise InputError(f"{spec.where}: model {spec.arch} returns shape {tuple(out.shape)}; flatcheck needs logits (batch, classes)")
    c = out.shape[1]
    if spec.num_classes is not None and c != spec.num_classes:
        raise InputError(f"{spec.where}: num_classes is {spec.num_classes} but the model returns {c} logits")
    _check_batches(model, samples, spec, config, c)
    return c


def _check_batches(model: nn.Module, samples: SampleSet, spec: ModelSpec, config: RunConfig, classes: int) -> None:
    """One no-grad forward over every batch: labels in range, outputs and loss finite.

    Every estimator averages over all samples, so one bad sample anywhere turns every
    result into NaN; found here, it is named. The inputs were checked by the SampleSet.
    """
    with model_mode(model, config.bn_mode), torch.no_grad():
        for batch in samples:
            top, low = int(batch.y.max()), int(batch.y.min())
            if top >= classes or low < 0:
                raise DataError(f"data '{samples.name}' has label {top if top >= classes else low} but the model "
                                f"has {classes} outputs (labels must be 0..{classes - 1})")
            out = model(batch.x)
            _check_finite_outputs(out, per_sample_loss(out, batch.y, spec.loss), batch.first, samples, spec, config)


def _check_finite_outputs(out: torch.Tensor, loss: torch.Tensor, first: int, samples: SampleSet,
                          spec: ModelSpec, config: RunConfig) -> None:
    bad_out = ~torch.isfinite(out.flatten(1)).all(1)
    bad = bad_out | ~torch.isfinite(loss)
    if not bool(bad.any()):
        return
    row = int(bad.nonzero()[0])
    what = "outputs are" if bool(bad_out[row]) else f"loss ({spec.loss.name}) is"
    raise ModelError(
        f"{config.checkpoint or spec.arch}: the model's {what} not finite on data '{samples.name}' split "
        f"'{samples.split}' sample {first + row}, whose inputs are finite: the model overflows "
        f"{_in_dtype(config)} or its weights are broken"
    )


def _in_dtype(config: RunConfig) -> str:
    if config.dtype == "float64":
        return "even in float64"
    return f"in {config.dtype} (try --dtype float64)"


def _check_result(result: ProbeResult, config: RunConfig) -> None:
    """A NaN or Inf is never a value: the data and the model's outputs passed the finiteness
    checks, so what overflowed is the probe's curvature in this dtype."""
    for field in ("value", "stderr"):
        x = getattr(result, field)
        if x is not None and not math.isfinite(x):
            raise ModelError(f"probe {result.probe} gave a non-finite {field} ({x}) though the data, outputs "
                             f"and loss are finite: its curvature overflows {_in_dtype(config)}")


def run(config: RunConfig, progress: ProgressFn | None = None, session: Session | None = None) -> Report:
    """Run every requested probe on one model and return the Report."""
    started = _dt.datetime.now(_dt.timezone.utc)
    t0 = time.perf_counter()
    session = session or open_session(config)
    ctx = ProbeContext(backend=session.backend, seed=config.seed, progress=progress, spec=session.spec,
                       split_samples=session.split_samples)
    results = {}
    for request in config.probes:
        probe = create_probe(request.name)
        missing = missing_capabilities(session.backend, requirements(probe, request.options))
        if missing:
            raise ConfigError(
                f"probe {request.name} needs {', '.join(missing)}, which backend {config.backend} lacks"
            )
        results[request.name] = probe.run(ctx, request.options)
        _check_result(results[request.name], config)
    return Report(meta=_meta(session, started, time.perf_counter() - t0), results=results)


def _meta(s: Session, started: _dt.datetime, seconds: float) -> dict:
    from .models.spec import spec_to_dict

    c = s.config
    return {
        "flatcheck_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "created": started.isoformat(timespec="seconds"),
        "seconds": round(seconds, 6),
        "device": str(s.device) + (f" ({torch.cuda.get_device_name(s.device)})" if s.device.type == "cuda" else ""),
        "dtype": c.dtype,
        "backend": c.backend,
        "compile": c.compile,
        "seed": c.seed,
        "bn_mode": c.bn_mode,
        "model": {
            "spec": str(s.spec.path) if s.spec.path is not None else None,
            "spec_sha256": s.spec.sha256,
            "source": s.spec.source,
            "arch": s.spec.arch,
            "loss": s.spec.loss.name,
            "label_smoothing": s.spec.loss.alpha if s.spec.loss.name == "label_smoothing" else None,
            "num_classes": s.num_classes,
            "parameters": sum(p.numel() for p in s.model.parameters()),
            "probed_parameters": s.backend.problem.layout.dim,
            "params_filter": list(c.params) or None,
            # what was measured, as `flatcheck spec` writes it, and where each field came from
            "resolved_spec": spec_to_dict(s.spec),
            "spec_origins": dict(s.spec.origins),
        },
        "checkpoint": None if s.checkpoint is None else {
            "path": str(s.checkpoint.path),
            "sha256": s.checkpoint.sha256,
            "format": s.checkpoint.format,
        },
        "data": s.samples.describe(),
        **c.extra_meta,
    }
