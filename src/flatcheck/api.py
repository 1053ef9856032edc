"""The library entry point: run(config) -> Report for a checkpoint and spec; the CLI, gate,
scan, and measure() and the Tracker on live objects (flatcheck.live) share it.

Both build one Session (`attach`: a model, its samples, a backend) and run the probes through
the same `run`: loading a checkpoint and a spec only produces the model and the data source.
Nothing here prints; progress goes to an optional callback.
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import platform
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.utils.data import Dataset

from . import __version__
from .backends import Backend, ParamLayout, create_backend
from .backends.base import missing_capabilities
from .backends.ranks import launched, local_cuda_device
from .config import DEFAULT_SAMPLES, RunConfig
from .settings import DEFAULT_BATCH_SIZE
from .data.batches import SampleSet
from .data.catalogue import MissingSplitError
from .data.preprocess import Preprocess
from .data.registry import create_dataset
from .data.roots import refuse_missing
from .engines import batchfill
from .errors import ConfigError, DataError, InputError, ModelError, first_line, setting
from .linalg.memory import process_allowance, resident_bytes
from .losses import below_top, per_sample_loss
from .models.checkpoint import LoadedCheckpoint
from .models.load import build_with_weights
from .models.sources import find_head, resolve_preprocess
from .models.spec import LIVE_CALLS, ModelSpec, field_words, load_spec
from .problem import Problem, model_mode
from .probes.registry import ProbeContext, create_probe, requirements
from .report.progress_hooks import report_probe
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
    preprocess: Preprocess | None  # None: the caller's data, taken as it is (measure)
    # another split of the same source as a map-style data set; raises MissingSplitError
    # when there is none. None: the run has one split only
    split_source: Callable[[str], Dataset] | None = None
    data_info: dict[str, Any] = field(default_factory=dict)  # added to the report's "data"
    # state probes keep from one run to the next on this session (lmax's Ritz vectors): a
    # Tracker's warm starts. None, as for every CLI run and gate rerun: each run starts cold
    warm: dict[Any, Any] | None = None
    # runs made on this session so far: a later one (a Tracker's next step) measures again what
    # the weights decide, the logits' and products' round-off (_remeasure_logits)
    runs: int = 0

    def split_samples(self, split: str) -> SampleSet:
        """The data's `split`, capped at the same sample count, batched the same way."""
        if split == self.config.split:
            return self.samples
        if self.split_source is None:
            raise MissingSplitError(f"data '{self.samples.name}' has no {split} split (pass test_data=)")
        c = self.config
        dataset = self.split_source(split)
        n = min(self.samples.n, len(dataset))  # type: ignore[arg-type]
        samples = SampleSet(dataset, samples=n, batch_size=self.samples.batch_size, device=self.device,
                            dtype=c.torch_dtype)
        _check_batches(self.model, samples, self.spec, c, self.num_classes)
        return samples


def resolve_device(name: str) -> torch.device:
    """`name` (auto, cpu, cuda, cuda:N: the device setting) as a device this machine has."""
    what = setting("device")
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # under torchrun each process takes its own GPU
        return local_cuda_device() if launched() else torch.device("cuda")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"{what} must be auto, cpu, cuda or cuda:N, got {name!r}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{what} {name}: CUDA is not available on this machine (torch {torch.__version__})")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{what} {name}: only {torch.cuda.device_count()} CUDA device(s) present")
    return device


def open_session(config: RunConfig) -> Session:
    """Load spec, model, checkpoint and data, and check that they fit together."""
    refuse_missing(config.data, config.data_root, config.split)  # before the seconds of building the model
    spec = config.spec if isinstance(config.spec, ModelSpec) else load_spec(config.spec)
    # spec becomes the fully resolved one: library metadata filled in, every field's origin
    model, spec, checkpoint = build_with_weights(spec, config.checkpoint, config.trust_packages, config.seed,
                                                 config.torch_dtype)
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

    def split_source(split: str) -> Dataset:
        return create_dataset(config.data, root=config.data_root, split=split, preprocess=preprocess,
                              num_classes=spec.num_classes, seed=config.seed)

    return attach(config, spec, model, samples, device, checkpoint=checkpoint, preprocess=preprocess,
                  split_source=split_source)


def attach(config: RunConfig, spec: ModelSpec, model: nn.Module, samples: SampleSet, device: torch.device, *,
           checkpoint: LoadedCheckpoint | None = None, preprocess: Preprocess | None = None,
           split_source: Callable[[str], Dataset] | None = None,
           data_info: dict[str, Any] | None = None) -> Session:
    """A model already on its device and dtype, and its samples: check that they fit
    together, and build the backend every probe of the run goes through."""
    if spec.head is not None:
        # a head the spec (or head=) names is a claim about the model: one it does not hold is a
        # wrong spec whatever the probes, refused now rather than by the probes that read it
        # (head-trace, relative-flatness) or never (trace), with a report recording it as measured
        find_head(model, spec)
    num_classes, saturation = _check_fit(model, samples, spec, config)
    layout = ParamLayout.from_model(model, config.params)
    products = _check_products(model, samples, spec, config, layout)
    problem = Problem(model=model, loss=spec.loss, samples=samples, layout=layout, bn_mode=config.bn_mode,
                      max_abs_logit=saturation["max_abs_logit"] if saturation is not None else 0.0,
                      product_error=products["eps_units"] if products is not None else 0.0)
    backend = create_backend(config.backend, problem, compile=config.compile)
    # on a GPU, a default batch grows to what a probe's memory holds (engines.batchfill)
    problem, backend, growth = batchfill.filled(
        problem, backend, lambda p: create_backend(config.backend, p, compile=config.compile),
        default=config.batch_size, chosen=config.batch_size != DEFAULT_BATCH_SIZE, max_memory=config.max_memory)
    info = dict(data_info or {})
    if saturation is not None:
        info["softmax_saturation"] = saturation
    if products is not None:
        info["float32_products"] = products
    if device.type == "cuda" or growth.grown:
        info["batch_size_reason"] = growth.reason
    return Session(config, spec, checkpoint, model, problem.samples, backend, device, num_classes, preprocess,
                   split_source, info)


def _remeasure_logits(session: Session) -> None:
    """Problem.max_abs_logit (one no-grad forward) and product_error (_check_products) again, for
    a session run once more (a Tracker's later steps, whose logits grow): the eigen-solvers'
    round-off floor must be the current weights'. Every time, not only where the parameters'
    in-place versions moved: an update through `.data` leaves those as they were."""
    problem = session.backend.problem
    if problem.loss.name in SOFTMAX_LOSSES:
        problem.max_abs_logit = max(float(z.abs().max()) for z, _, _ in problem.outputs())
    products = _check_products(session.model, problem.samples, session.spec, session.config, problem.layout,
                                say=False)
    problem.product_error = products["eps_units"] if products is not None else 0.0


def _input_hint(spec: ModelSpec) -> str:
    """Where the expected input shape comes from: a spec file's input_size, or for a live model
    (measure, Tracker) the data given with it."""
    if spec.path is not None:
        return "check input_size in the spec"
    return "check the data's shape against the model" if spec.label in (None, *LIVE_CALLS) else "check --input-size"


def _check_fit(model: nn.Module, samples: SampleSet, spec: ModelSpec,
               config: RunConfig) -> tuple[int, dict[str, Any] | None]:
    """The model's class count, read from a forward of the first batch that checks shapes,
    with clear errors; then every batch is checked (`_check_batches`, whose saturation count
    comes back with it)."""
    batch = next(iter(samples))
    try:
        with model_mode(model, config.bn_mode), torch.no_grad():
            out = model(batch.x)
    except (RuntimeError, ValueError) as exc:
        first = first_line(exc) or type(exc).__name__
        raise InputError(
            f"{spec.where}: model {spec.arch} cannot take data '{config.data}' samples of shape "
            f"{tuple(batch.x.shape[1:])} ({_input_hint(spec)}): {first}"
        ) from None
    if out.ndim != 2:
        raise InputError(f"{spec.where}: model {spec.arch} returns shape {tuple(out.shape)}; flatcheck needs logits (batch, classes)")
    c = out.shape[1]
    if spec.num_classes is not None and c != spec.num_classes:
        raise InputError(f"{spec.where}: {field_words(spec.where, 'num_classes')} is {spec.num_classes} but the "
                         f"model returns {c} logits")
    return c, _check_batches(model, samples, spec, config, c)


# A sample whose softmax leaves less than this to the classes below its top one is counted
# as saturated in the report (data.softmax_saturation). Before schema 2.7 float32 curvature
# products lost about float32's eps of absolute precision in each sample's output Hessian,
# whose size is that share (losses.py): the mean share is what a gate reads to tell whether
# an older float32 baseline's values are still those of its model (workflows/gate/checks.py).
SATURATED = 1e-3
SOFTMAX_LOSSES = ("cross_entropy", "label_smoothing")


def _check_batches(model: nn.Module, samples: SampleSet, spec: ModelSpec, config: RunConfig,
                   classes: int) -> dict[str, Any] | None:
    """One no-grad forward over every batch: labels in range, outputs and loss finite.

    Every estimator averages over all samples, so one bad sample anywhere turns every
    result into NaN; found here, it is named. The inputs were checked by the SampleSet.
    Returns, for a softmax loss, how many samples leave less than SATURATED to the classes
    below their top one, the least such share and their mean, and the largest |logit|
    (data.softmax_saturation). That last is the logits' own rounding, eps·|z| each, which moves
    the curvature's shares exp(z_j − z_m) and so every eigenvalue; the eigen-solvers' floor
    takes it (Problem.max_abs_logit, linalg/certify.py). Not for other losses: an MSE's output
    Hessian does not depend on the outputs; sigmoid_mse's does (σ'(z) ≈ e^{−|z|}), not measured.
    """
    softmax = spec.loss.name in SOFTMAX_LOSSES
    count, least, total, largest = 0, math.inf, 0.0, 0.0
    with model_mode(model, config.bn_mode), torch.no_grad():
        for batch in samples:
            top, low = int(batch.y.max()), int(batch.y.min())
            if top >= classes or low < 0:
                raise DataError(f"data '{samples.name}' has label {top if top >= classes else low} but the model "
                                f"has {classes} outputs (labels must be 0..{classes - 1})")
            out = model(batch.x)
            _check_finite_outputs(out, per_sample_loss(out, batch.y, spec.loss), batch.first, samples, spec, config)
            if softmax:
                share = below_top(out)
                count += int((share < SATURATED).sum())
                least = min(least, float(share.min()))
                total += float(share.double().sum())
                largest = max(largest, float(out.abs().max()))
    if not softmax:
        return None
    return {"threshold": SATURATED, "samples": count, "least": least, "mean": total / samples.n,
            "max_abs_logit": largest}


# how many samples of the first batch the float32 products are checked on against float64
CHECK_SAMPLES = 8


def _check_products(model: nn.Module, samples: SampleSet, spec: ModelSpec, config: RunConfig,
                    layout: ParamLayout, say: bool = True) -> dict[str, Any] | None:
    """A float32 run's Hessian-vector product, on one fixed random vector and the first
    CHECK_SAMPLES samples, against the same product of a float64 copy: where its relative error
    ρ (in units of eps) is past linalg.certify.PRODUCT_TRUSTED, the products cancel inside
    themselves (a saturated tanh's 1 − y², linalg/certify.py), which no other figure of the run
    shows. Then the eigen-solvers' floor takes ρ (Problem.product_error), a warning says so, and
    the report's data.float32_products records it; None otherwise, as in float64, or where the
    check cannot run (a model that does not copy or take a second derivative this way). `say`:
    warn (a Tracker's later steps take the new figure without repeating the warning)."""
    from .linalg.certify import PRODUCT_TRUSTED

    if config.torch_dtype != torch.float32 or not _output_derivatives(model, spec):
        return None
    g = torch.Generator().manual_seed(0)
    v = [torch.randn(p.shape, generator=g).to(p.device) for p in layout.params(model)]
    # the check is a second opinion, never a reason to fail a run whose own products can run
    # (inputs that do not slice, a copy or double backward the model does not take, no memory)
    try:
        batch = next(iter(samples))
        x, y = batch.x[:CHECK_SAMPLES], batch.y[:CHECK_SAMPLES]
        wide = copy.deepcopy(model).double()
        narrow = _hvp(model, layout, x, y, v, spec, config)
        exact = _hvp(wide, layout, x.double() if x.is_floating_point() else x, y, [t.double() for t in v],
                     spec, config)
    except (RuntimeError, TypeError, ValueError, IndexError, KeyError, AttributeError, NotImplementedError,
            copy.Error, MemoryError):
        return None
    size = float(exact.norm())
    if not size or not math.isfinite(size):
        return None
    units = float((narrow.double() - exact).norm()) / size / torch.finfo(torch.float32).eps
    if not units > PRODUCT_TRUSTED:
        return None
    note = (f"float32 curvature products lose precision on this model: one product was {units:.0f}·eps off its "
            f"float64 value (relative {units * torch.finfo(torch.float32).eps:.1e}; derivatives cancel inside "
            f"the model, e.g. saturated tanh or sigmoid units). Eigenvalue bounds take that as their floor; "
            f"trace and other estimators' errors do not include it. Use --dtype float64 (dtype='float64').")
    if say:
        warnings.warn(note, stacklevel=3)
    return {"samples": int(x.shape[0]), "eps_units": units, "warning": note}


# activations whose backward torch takes from the rounded output (1 − y², y(1 − y)), which is
# where a float32 product cancels inside the model (a saturated unit's derivative carries eps
# absolute): only models that hold one pay for the float64 check (ReLU, GELU, SiLU, ELU take
# theirs from the input). A tanh called as a function in forward is not seen.
OUTPUT_DERIVATIVE_MODULES = (nn.Tanh, nn.Sigmoid)


def _output_derivatives(model: nn.Module, spec: ModelSpec) -> bool:
    return spec.loss.name == "sigmoid_mse" or any(isinstance(m, OUTPUT_DERIVATIVE_MODULES) for m in model.modules())


def _hvp(model: nn.Module, layout: ParamLayout, x: torch.Tensor, y: torch.Tensor, v: list[torch.Tensor],
         spec: ModelSpec, config: RunConfig) -> torch.Tensor:
    """H v of the mean loss over (x, y), by double backward, flat."""
    params = layout.params(model)
    with model_mode(model, config.bn_mode), torch.enable_grad():
        loss = per_sample_loss(model(x), y, spec.loss).mean()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        hv = torch.autograd.grad(grads, params, grad_outputs=v)
    return torch.cat([h.detach().reshape(-1) for h in hv])


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
    return f"in {config.dtype} (try {setting('dtype')} float64)"


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
    if session.runs:  # the first run's weights are the ones the session measured as it opened
        _remeasure_logits(session)
    session.runs += 1
    ctx = ProbeContext(backend=session.backend, seed=config.seed, progress=progress, spec=session.spec,
                       split_samples=session.split_samples, warm=session.warm)
    results = {}
    if config.max_memory is not None:
        # the cap is the process's: what it holds with the model and samples loaded is taken off
        # once, so every probe is left the same and its plan (micro-batches, a restarted basis)
        # does not depend on which probes ran before it
        device = session.backend.problem.device
        ctx.memory_held = resident_bytes(device)
        ctx.memory_allowance = process_allowance(device, config.max_memory, ctx.memory_held)
        ctx.memory_cap = config.max_memory
    end = None if config.budget is None else time.monotonic() + config.budget
    for i, request in enumerate(config.probes):
        if end is not None:  # an equal share of what is left, so one probe's overrun is not the next's loss
            now = time.monotonic()
            ctx.deadline = now + max(end - now, 0.0) / (len(config.probes) - i)
        probe = create_probe(request.name)
        missing = missing_capabilities(session.backend, requirements(probe, request.options))
        if missing:
            raise ConfigError(
                f"probe {request.name} needs {', '.join(missing)}, which backend {config.backend} lacks"
            )
        report_probe(progress, request.name)
        results[request.name] = probe.run(ctx, request.options)
        _check_result(results[request.name], config)
        report_probe(progress, request.name, results[request.name])  # every probe's end line
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
        # TF32 moves some probes' values past their own error bars (docs/performance.md): a
        # report says whether its products ran with it, which they do only in float32 on CUDA
        "allow_tf32": bool(c.allow_tf32 and s.device.type == "cuda" and c.dtype == "float32"),
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
            # the stored dtype and what casting to --dtype rounded: stderr says it, --quiet drops that
            "cast": s.checkpoint.cast,
        },
        "data": {**s.samples.describe(), **s.data_info},
        **c.extra_meta,
    }
