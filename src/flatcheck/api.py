"""The library entry points: measure(model, data) -> Report for live objects, run(config)
-> Report for a checkpoint and spec; the CLI, notebooks, gate, scan and the Tracker share them.

Both build one Session (`attach`: a model, its samples, a backend) and run the probes through
the same `run`: loading a checkpoint and a spec only produces the model and the data source.
Nothing here prints; progress goes to an optional callback.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn
from torch.utils.data import Dataset

from . import __version__
from .backends import Backend, ParamLayout, Problem, create_backend
from .backends.base import missing_capabilities, model_mode
from .config import DEFAULT_SAMPLES, DTYPES, RunConfig, probe_requests
from .data.batches import SampleSet
from .data.catalogue import MissingSplitError
from .data.memory import memory_data, default_batch_size
from .backends._dist import launched, local_cuda_device
from .data.preprocess import Preprocess
from .data.registry import create_dataset
from .errors import ConfigError, DataError, InputError, ModelError, SpecError, first_line
from .linalg.memory import process_allowance, resident_bytes
from .losses import per_sample_loss
from .models.checkpoint import LoadedCheckpoint
from .models.load import build_with_weights
from .models.outputs import attach_output_selector
from .models.sources import resolve_preprocess
from .models.spec import LossSpec, ModelSpec, load_spec, spec_from_dict
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
    preprocess: Preprocess | None  # None: the caller's data, taken as it is (measure)
    # another split of the same source as a map-style data set; raises MissingSplitError
    # when there is none. None: the run has one split only
    split_source: Callable[[str], Dataset] | None = None
    data_info: dict[str, Any] = field(default_factory=dict)  # added to the report's "data"
    # state probes keep from one run to the next on this session (lmax's Ritz vectors): a
    # Tracker's warm starts. None, as for every CLI run and gate rerun: each run starts cold
    warm: dict[Any, Any] | None = None

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


def resolve_device(name: str, what: str = "--device") -> torch.device:
    """`name` (auto, cpu, cuda, cuda:N) as a device this machine has; `what` names the
    argument in errors (the CLI's flag, measure's keyword)."""
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
    num_classes = _check_fit(model, samples, spec, config)
    layout = ParamLayout.from_model(model, config.params)
    problem = Problem(model=model, loss=spec.loss, samples=samples, layout=layout, bn_mode=config.bn_mode)
    backend = create_backend(config.backend, problem, compile=config.compile)
    return Session(config, spec, checkpoint, model, samples, backend, device, num_classes, preprocess,
                   split_source, dict(data_info or {}))


def _input_hint(spec: ModelSpec) -> str:
    """Where the expected input shape comes from: a spec file's input_size, or for a live model
    (measure, Tracker) the data given with it."""
    if spec.path is not None:
        return "check input_size in the spec"
    return "check --input-size" if spec.label is not None else "check the data's shape against the model"


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
            f"{tuple(batch.x.shape[1:])} ({_input_hint(spec)}): {first}"
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
                       split_samples=session.split_samples, warm=session.warm,
                       max_memory=config.max_memory)
    results = {}
    if config.max_memory is not None:
        # the cap is the process's: what it holds with the model and samples loaded is taken off
        # once, so every probe is left the same and its plan (micro-batches, a restarted basis)
        # does not depend on which probes ran before it
        device = session.backend.problem.device
        ctx.memory_held = resident_bytes(device)
        ctx.max_memory = process_allowance(device, config.max_memory, ctx.memory_held)
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
        "data": {**s.samples.describe(), **s.data_info},
        **c.extra_meta,
    }


# ---------------------------------------------------------------- live objects (measure, Tracker)

DEFAULT_BATCH_SIZE = 128


def measure(model: nn.Module, data: Any, *, loss: "str | Mapping[str, Any] | LossSpec" = "cross_entropy",
            probes: "str | Iterable[str] | Mapping[str, Mapping[str, Any] | None]" = ("trace",),
            options: Mapping[str, Mapping[str, Any]] | None = None,
            samples: int | None = None, batch_size: int | None = None, params: "str | Iterable[str] | None" = None,
            test_data: Any = None, head: str | None = None, num_classes: int | None = None,
            device: "str | torch.device | None" = None, dtype: "str | torch.dtype | None" = None,
            bn_mode: str | None = None, seed: int = 0, budget: float | None = None,
            max_memory: "int | str | None" = None, output_key: "str | int | None" = None,
            progress: ProgressFn | None = None) -> Report:
    """The probes on a model and data the caller holds: the Report the CLI prints.

    model: an nn.Module returning logits (batch, classes). data: a DataLoader, an (x, y) pair
    of tensors, or any re-iterable of (x, y) batches (x inputs: floats, or uint8 pixels 0..255,
    which are divided by 255 as the CLI's readers do, data.scaled in the report; y integer labels); the first
    `samples` of them (all when None), in `batch_size` batches (default: the loader's own,
    else 128). A source that is not the same on every pass (shuffling, augmentation) is read
    once and held when it fits 1 GiB (the report's data.cached); otherwise every pass is
    checked against the first and a difference is refused. loss: a name or a mapping as in a
    spec ({"name": "label_smoothing", "alpha": 0.1}). probes: a name, "a,b", a list of names, or
    a mapping {probe: {option: value}} (None: the defaults) whose values are that probe's
    options. options: {probe: {option: value}}, as `-o probe.option=value`. Options given either
    way are validated alike; one probe's options given both ways is an error. test_data: the test split, for `gap`. head: the final layer's
    module name (head-trace, relative-flatness; default: detected). device ('auto', 'cpu',
    'cuda', 'cuda:N' or a torch.device; checked as the CLI's --device) and dtype: default the
    model's; another one is measured on a copy. budget: seconds for all the probes. max_memory:
    bytes, or a size such as "8G", this process may hold while a probe runs (--max-memory; what
    it holds already — the caller's own tensors included — counts); None: each probe's working
    set takes at most half of what is free. bn_mode: "eval" (BatchNorm on its running
    statistics; the default, with a warning when the model is in train mode) or "train" (the
    batch's statistics). output_key: which part of a forward that returns a
    tuple, dict or ModelOutput is the logits, as the spec field (None: a `logits` key or
    attribute, else the first tensor); such a model is measured on a copy, so that the
    caller's own forward is not changed.

    The caller's model is left bitwise as it was — weights, buffers, .grad, requires_grad,
    train/eval mode, device and dtype — and so are the global CPU and CUDA random states.
    """
    from .workflows.live import preserved

    _check_module(model)
    # resolved before anything touches the device: a CUDA name on a machine without CUDA is
    # the CLI's ConfigError, not torch's RuntimeError from saving that device's RNG state
    target = _live_device(model, device)
    with preserved(model, target):
        session = open_live_session(model, data, loss=loss, probes=probes, options=options, samples=samples,
                                    batch_size=batch_size, params=params, test_data=test_data, head=head,
                                    num_classes=num_classes, device=target, dtype=dtype, bn_mode=bn_mode,
                                    seed=seed, budget=budget, max_memory=max_memory, output_key=output_key)
        with _call_words():  # a probe's refusal ("raise --max-memory") in the call's words
            return run(session.config, progress, session)


# RunConfig's checks are worded for the command line; a call names its keyword arguments
_CALL_NAMES = {"--seed": "seed", "--probes": "probes", "--max-memory": "max_memory", "--samples": "samples",
               "--batch-size": "batch_size", "--dtype": "dtype", "--bn-mode": "bn_mode", "--device": "device",
               "--budget": "budget", "--params": "params"}


@contextlib.contextmanager
def _call_words():
    """A ConfigError that names a flag (`--seed must be …`, a probe's "raise --max-memory")
    says the argument instead; a longer flag (--probes-max) is not one of them."""
    import re

    try:
        yield
    except ConfigError as exc:
        text = str(exc)
        said = re.sub(r"(?<![\w-])(--[a-z][a-z-]*)(?![\w-])", lambda m: _CALL_NAMES.get(m[1], m[1]), text)
        if said == text:
            raise
        raise ConfigError(said) from None


def open_live_session(model: nn.Module, data: Any, *, loss: Any = "cross_entropy", probes: Any = ("trace",),
                      options: Mapping[str, Mapping[str, Any]] | None = None, samples: int | None = None,
                      batch_size: int | None = None, params: Any = None, test_data: Any = None,
                      head: str | None = None, num_classes: int | None = None, device: Any = None,
                      dtype: Any = None, bn_mode: str | None = None, seed: int = 0, budget: float | None = None,
                      extra_meta: dict[str, Any] | None = None, max_memory: "int | str | None" = None,
                      output_key: "str | int | None" = None) -> Session:
    """measure's Session, for callers that run it more than once (the Tracker): the model
    itself when it is on `device` in `dtype` already, else a copy there (session.model)."""
    _check_module(model)
    first = next(iter(model.parameters()), None)
    if first is None:
        raise InputError(f"model: {type(model).__name__} has no parameters, so no curvature to measure")
    target_device = _live_device(model, device)
    target_dtype = _dtype_name(dtype, first.dtype)
    _say_what_changes(model, bn_mode, dtype, target_dtype)
    bn_mode = "eval" if bn_mode is None else bn_mode
    spec = _live_spec(model, loss, head, num_classes, output_key)
    for what, value in (("samples", samples), ("batch_size", batch_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{what} must be a positive integer or None, got {value!r}")
    source = memory_data(data, samples=samples, what="data")
    available = len(source.dataset)  # type: ignore[arg-type]
    if samples is not None and samples > available:  # said here in the call's words, not --samples
        raise InputError(f"samples={samples} is more than the {available} samples data gives")
    n = samples if samples is not None else available
    with _call_words():
        names, chosen = probe_options(probes, options)
        config = RunConfig(
            checkpoint=None, spec=spec, probes=probe_requests(names, chosen),
            data=source.source, samples=n, batch_size=batch_size or default_batch_size(data) or DEFAULT_BATCH_SIZE,
            device=str(target_device), dtype=target_dtype, bn_mode=bn_mode, seed=seed,
            params=tuple(_names(params, "params")) if params is not None else (), budget=budget,
            max_memory=max_memory, extra_meta=dict(extra_meta or {}),
        )
    work = model
    if any(t.device != target_device or t.dtype != config.torch_dtype
           for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()):
        work = _copy_to(model, target_device, config.torch_dtype)
    samples_set = SampleSet(source.dataset, samples=n, batch_size=config.batch_size, device=target_device,
                            dtype=config.torch_dtype)
    if spec.output_key is not None or not _returns_tensor(work, samples_set, bn_mode):
        # the logits are taken by a forward hook (models.outputs), on a copy: a hook on the
        # caller's model would change what its own forward returns, in the training loop too
        if work is model:
            work = _copy_to(model, target_device, config.torch_dtype)
        attach_output_selector(work, spec.output_key, "model")
    split_source = None
    if test_data is not None:
        test = memory_data(test_data, samples=n, what="test_data", split="test")

        def split_source(split: str) -> Dataset:
            if split == "test":
                return test.dataset
            raise MissingSplitError(f"no {split} split")  # pragma: no cover - train is the run's own split

    return attach(config, spec, work, samples_set, target_device, split_source=split_source,
                  data_info=source.describe())


def probe_options(probes: Any, options: Mapping[str, Mapping[str, Any]] | None) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """measure's `probes` and `options` as (names, {probe: {option: value}}). `probes` may map
    each name to its options: what a notebook user writes, and silently dropping those values
    would run the defaults under the caller's settings."""
    chosen: dict[str, dict[str, Any]] = {}
    if isinstance(probes, Mapping):
        names = _names(list(probes), "probes")
        for name, values in probes.items():
            if values is not None:
                chosen[name] = _option_map(values, f"probes[{name!r}]")
    else:
        names = _names(probes, "probes")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"options must be a mapping {{probe: {{option: value}}}}, got {options!r}")
    for name, values in (options or {}).items():
        values = _option_map(values, f"options[{name!r}]")
        if name not in names:
            raise ConfigError(f"options[{name!r}]: probe {name!r} is not among probes ({', '.join(names)})")
        if values and chosen.get(name):
            raise ConfigError(f"probe {name}: options given both in probes= and in options=; give them in one place")
        chosen[name] = {**chosen.get(name, {}), **values}
    return names, chosen


def _option_map(values: Any, what: str) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{what} must be a mapping {{option: value}}, got {values!r}")
    return dict(values)


def _check_module(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise InputError(f"model: expected a torch.nn.Module, got {type(model).__name__}")


def _live_device(model: nn.Module, device: Any) -> torch.device:
    """measure's device= (a name or a torch.device) checked as the CLI's --device; None: the
    model's own (the CPU for a model without parameters, which is refused later)."""
    if device is None:
        first = next(iter(model.parameters()), None)
        return torch.device("cpu") if first is None else first.device
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device must be auto, cpu, cuda, cuda:N or a torch.device, got {device!r}")
    return resolve_device(str(device), what="device")


def _dtype_name(dtype: Any, model_dtype: torch.dtype) -> str:
    if dtype is None:
        dtype = model_dtype
    if isinstance(dtype, torch.dtype):
        names = {v: k for k, v in DTYPES.items()}
        if dtype not in names:
            raise ConfigError(f"dtype: flatcheck measures in float32 or float64, and the model is {dtype}; "
                              "pass dtype='float32' or 'float64' (a copy is measured)")
        return names[dtype]
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return dtype


def _names(value: Any, what: str) -> list[str]:
    if isinstance(value, str):
        return [n.strip() for n in value.split(",") if n.strip()]
    try:
        names = list(value)
    except TypeError:
        raise ConfigError(f"{what} must be a name, a comma-separated string or a list of names, got {value!r}") from None
    if not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{what} must list names (strings), got {value!r}")
    return names


def _say_what_changes(model: nn.Module, bn_mode: str | None, dtype: Any, target_dtype: str) -> None:
    """Warnings for what a live model is measured as that its own forward would not do, unless
    the caller chose it: its BatchNorm on running statistics while it is in train mode
    (bn_mode None, "eval" by default), its parameters cast to one dtype (dtype None)."""
    import warnings

    if bn_mode is None and model.training and any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                                                    for m in model.modules()):
        warnings.warn("model: in train mode, but its BatchNorm layers are measured on their running statistics "
                      "(bn_mode='eval', the default); pass bn_mode='train' for the batch statistics training uses, or "
                      "bn_mode='eval' to say so",
                      stacklevel=3)
    kinds = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})
    if dtype is None and len(kinds) > 1:
        warnings.warn(f"model: parameters in {' and '.join(kinds)}; measured as a {target_dtype} copy (its first "
                      "parameter's dtype): pass dtype= to choose", stacklevel=3)


def _returns_tensor(model: nn.Module, samples: SampleSet, bn_mode: str) -> bool:
    """Whether the model's forward of the first batch is a tensor (not a tuple, dict, ModelOutput)."""
    batch = next(iter(samples))
    try:
        with model_mode(model, bn_mode), torch.no_grad():
            return isinstance(model(batch.x), torch.Tensor)
    except (RuntimeError, ValueError):  # said by _check_fit, with the shapes
        return True


def _live_spec(model: nn.Module, loss: Any, head: str | None, num_classes: int | None,
               output_key: Any = None) -> ModelSpec:
    """The spec a live model would have had: its class as a python source, the loss, the head."""
    cls = type(model)
    fields: dict[str, Any] = {"source": "python", "arch": f"{cls.__module__}:{cls.__qualname__}",
                              "head": head, "num_classes": num_classes, "output_key": output_key}
    if isinstance(loss, LossSpec):
        fields["loss"] = {"name": loss.name, **({"alpha": loss.alpha} if loss.name == "label_smoothing" else {})}
    else:
        fields["loss"] = dict(loss) if isinstance(loss, Mapping) else loss
    try:
        return spec_from_dict(fields)
    except SpecError as exc:  # "model spec: field 'loss' …": the caller typed an argument, not a spec
        raise ConfigError(f"measure: {str(exc).removeprefix('model spec: ')}") from None


def _copy_to(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A copy on `device` in `dtype`, without .grad: the caller's model is never moved or cast."""
    import copy

    work = copy.deepcopy(model)
    for p in work.parameters():
        p.grad = None
    return work.to(device=device, dtype=dtype)
