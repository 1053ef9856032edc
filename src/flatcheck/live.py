"""Live objects: measure(model, data) -> Report on a model and data a caller holds, the
Session a Tracker runs again and again, and the caller's model left exactly as it was.

Probes run on the caller's own module (or on a copy when another device or dtype is asked
for). They are written not to change it — products go through torch.autograd.grad, never
.backward(); model_mode restores every training flag; perturbing probes write the weights
back — but a training loop that goes on afterwards must not depend on that being true of
every probe and every backend, so the state a loop reads is saved before and restored after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import sys
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from .api import ProgressFn, Session, attach, resolve_device, run
from .config import RunConfig, probe_requests
from .data.batches import SampleSet
from .data.catalogue import MissingSplitError
from .data.memory import default_batch_size, memory_data
from .errors import ConfigError, InputError, SpecError, setting
from .models.checkpoint import preview
from .models.outputs import attach_output_selector
from .models.spec import LIVE, LossSpec, ModelSpec, spec_from_dict
from .problem import model_mode, uses_batch_statistics
from .report.result import Report
from .settings import BnMode, Dtype, Settings, default_of, live_settings, names_of

def takes_settings(fn: Callable) -> Callable:
    """`fn` takes the live settings (flatcheck.settings, `live`) as keywords through its
    **settings: its signature lists them, with their defaults there, and an unknown keyword
    is a TypeError as for any function."""
    own = inspect.signature(fn)
    kept = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fields = {f.name: f for f in dataclasses.fields(Settings)}
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=how.live_default,
                               annotation=fields[name].type) for name, how in live_settings().items()]
    fn.__signature__ = own.replace(parameters=kept + added)  # type: ignore[attr-defined]
    return fn


def refuse_unknown_keywords(call: str, given: Iterable[str], known: Iterable[str]) -> None:
    """An unknown keyword is refused as Python refuses one (a TypeError), in the name of the
    public `call` rather than of the function it is handed on to, with the nearest known
    keyword or, when none is near, the whole list."""
    known = sorted(known)
    for name in given:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.8)  # a typo, not a guess
            hint = f"did you mean {near[0]!r}?" if near else f"it takes {', '.join(known)}"
            raise TypeError(f"{call}() got an unexpected keyword argument {name!r}; {hint}")


def keywords_of(fn: Callable) -> list[str]:
    """Every keyword `fn` takes: its own keyword-only parameters and the live settings, which
    takes_settings lists in its signature."""
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


def given_settings(call: str, settings: Mapping[str, Any], fn: Callable) -> dict[str, Any]:
    """The live settings a call of `fn` gave, each with its default where not given; an
    unknown keyword is refused as Python refuses one, against all of `fn`'s keywords, not only
    the settings its **settings gathers (a misspelt `probes` lands there too)."""
    known = live_settings()
    refuse_unknown_keywords(call, settings, keywords_of(fn))
    return {name: settings.get(name, how.live_default) for name, how in known.items()}


@takes_settings
def measure(model: nn.Module, data: Any, *, loss: "str | Mapping[str, Any] | LossSpec" = "cross_entropy",
            probes: "str | Iterable[str] | Mapping[str, Mapping[str, Any] | None]" = ("trace",),
            options: Mapping[str, Mapping[str, Any]] | None = None, test_data: Any = None, head: str | None = None,
            num_classes: int | None = None, output_key: "str | int | None" = None,
            progress: "ProgressFn | bool | None" = None, **settings: Any) -> Report:
    """The probes on a model and data the caller holds: the Report the CLI prints.

    model: an nn.Module returning logits (batch, classes). data: a DataLoader, an (x, y) pair
    of tensors, or any re-iterable of (x, y) batches (x inputs: floats, or uint8 pixels 0..255,
    which are divided by 255 as the CLI's readers do, data.scaled in the report; y integer labels). A source
    that is not the same on every pass (shuffling, augmentation) is read once and held when it fits 1 GiB
    (the report's data.cached); otherwise every pass is checked against the first and a difference is
    refused. loss: a name or a mapping as in a spec ({"name": "label_smoothing", "alpha": 0.1}). probes:
    a name, "a,b", a list of names, or a mapping {probe: {option: value}} (None: the defaults) whose values
    are that probe's options. options: {probe: {option: value}}, as `-o probe.option=value`. Options given
    either way are validated alike; one probe's options given both ways is an error. test_data: the test
    split, for `gap`. head: the final layer's module name (head-trace, relative-flatness; default:
    detected). output_key: which part of a forward that returns a tuple, dict or ModelOutput is the logits,
    as the spec field (None: a `logits` key or attribute, else the first tensor); such a model is measured
    on a copy, so that the caller's own forward is not changed. progress: None (silent), True (the
    command line's progress lines on stderr) or a callable progress(desc, done, total, *, value=None,
    stderr=None), called as each probe does a unit of work (value, stderr: its running estimate, if any).

    The settings are the CLI's (flatcheck.settings, checked alike), with these defaults:
    samples: the first N of data (all when None); batch_size: the loader's own, else 128; device ('auto',
    'cpu', 'cuda', 'cuda:N' or a torch.device) and dtype ('float32', 'float64' or a torch.dtype): the
    model's, another one is measured on a copy; bn_mode: "eval" (BatchNorm on its running statistics,
    with a warning when the model is in train mode) or "train" (the batch's statistics); seed: 0; params:
    globs of parameter names (all trainable when None); budget: seconds for all the probes; max_memory:
    bytes, or a size such as "8G", this process may hold while a probe runs (what it holds already — the
    caller's own tensors included — counts; None: each probe's working set takes at most half of what is
    free).

    The caller's model is left bitwise as it was — weights, buffers, .grad, requires_grad,
    train/eval mode, device and dtype — and so are the global CPU and CUDA random states.
    """
    settings = given_settings("measure", settings, measure)
    lines = _progress_lines(progress)
    _check_module(model)
    # resolved before anything touches the device: a CUDA name on a machine without CUDA is
    # the CLI's ConfigError, not torch's RuntimeError from saving that device's RNG state
    settings["device"] = _live_device(model, settings["device"])
    with preserved(model, settings["device"]), (lines or contextlib.nullcontext(progress or None)) as listener:
        session = open_live_session(model, data, loss=loss, probes=probes, options=options, test_data=test_data,
                                    head=head, num_classes=num_classes, output_key=output_key, **settings)
        report = run(session.config, listener, session)
    _say_skipped(report)
    return report


def _say_skipped(report: Report) -> None:
    """A probe the caller asked for that gave no value by design (gap without a test split, as
    `flatcheck probe` skips it) is said on stderr: in a notebook a None in the results is easily
    taken for a value, and its note is read by no one."""
    import warnings

    for name, result in report.results.items():
        why = result.details.get("skipped")
        if result.value is None and why:
            warnings.warn(f"probe {name} gave no value, skipped: {why}", stacklevel=3)


def _progress_lines(progress: Any) -> Any:
    """measure's progress=, checked before any work: None or False (silent), True (the CLI's
    progress display on stderr, returned here as that display) or a callable taking what a
    probe reports, progress(desc, done, total, *, value=None, stderr=None); a wrong one used to
    fail deep in the first probe, as a TypeError about its call."""
    if progress is None or progress is False:
        return None
    if progress is True:
        from .report.progress import ProgressRenderer, period_from_env

        return ProgressRenderer(sys.stderr, period=period_from_env())
    expected = ("progress must be None, True (the command line's progress lines on stderr) or a callable "
                "progress(desc, done, total, *, value=None, stderr=None)")
    if not callable(progress):
        raise ConfigError(f"{expected}, got {progress!r}")
    try:
        signature = inspect.signature(progress)
    except (TypeError, ValueError):  # a callable whose signature Python cannot read is taken on trust
        return None
    try:
        signature.bind("trace", 0, 0, value=None, stderr=None)
    except TypeError as exc:
        raise ConfigError(f"{expected}; {getattr(progress, '__name__', type(progress).__name__)} cannot take "
                          f"that call ({exc})") from None
    return None


@takes_settings
def open_live_session(model: nn.Module, data: Any, *, loss: Any = "cross_entropy", probes: Any = ("trace",),
                      options: Mapping[str, Mapping[str, Any]] | None = None, test_data: Any = None,
                      head: str | None = None, num_classes: int | None = None, output_key: "str | int | None" = None,
                      extra_meta: dict[str, Any] | None = None, call: str = LIVE, **settings: Any) -> Session:
    """measure's Session, for callers that run it more than once (the Tracker): the model
    itself when it is on `device` in `dtype` already, else a copy there (session.model).
    `call` (one of models.spec.LIVE_CALLS) is what messages about the keywords name."""
    given = given_settings("open_live_session", settings, open_live_session)
    _check_module(model)
    first = next(iter(model.parameters()), None)
    if first is None:
        raise InputError(f"model: {type(model).__name__} has no parameters, so no curvature to measure")
    target_device = _live_device(model, given["device"])
    target_dtype = _dtype_name(given["dtype"], first.dtype)
    bn_mode = given["bn_mode"]
    _say_what_changes(model, bn_mode, given["dtype"], target_dtype)
    if bn_mode is None:
        bn_mode = default_of("bn_mode")
    spec = _live_spec(model, loss, head, num_classes, output_key, call)
    # checked before the data is read, as RunConfig will check them again
    how = live_settings()
    for name in ("samples", "batch_size", "bn_mode", "seed", "budget", "max_memory", "params"):
        if given[name] is not None:
            how[name].check(name, given[name])
    samples, batch_size = given["samples"], given["batch_size"]
    source = memory_data(data, samples=samples, what="data")
    available = len(source.dataset)  # type: ignore[arg-type]
    if samples is not None and samples > available:  # said here in the call's words, not --samples
        raise InputError(f"samples={samples} is more than the {available} samples data gives")
    n = samples if samples is not None else available
    names, chosen = probe_options(probes, options)
    config = RunConfig(
        checkpoint=None, spec=spec, probes=probe_requests(names, chosen),
        data=source.source, samples=n, batch_size=batch_size or default_batch_size(data) or default_of("batch_size"),
        device=str(target_device), dtype=target_dtype, bn_mode=bn_mode, seed=given["seed"],
        params=given["params"], budget=given["budget"], max_memory=given["max_memory"],
        extra_meta=dict(extra_meta or {}),
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
        attach_output_selector(work, spec.output_key, call)
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
        names = list(names_of("probes", list(probes)))
        for name, values in probes.items():
            if values is not None:
                chosen[name] = _option_map(values, f"probes[{name!r}]")
    else:
        names = list(names_of("probes", probes))
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
    # named here, as the CLI names a checkpoint's: the forward's non-finite loss would only
    # say that the model overflows or its weights are broken
    bad = [name for name, t in (*model.named_parameters(), *model.named_buffers())
           if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise InputError(f"model: non-finite values (NaN/Inf) in {len(bad)} tensors: {preview(bad)}")


def _live_device(model: nn.Module, device: Any) -> torch.device:
    """measure's device= (a name or a torch.device) checked as the CLI's --device; None: the
    model's own (the CPU for a model without parameters, which is refused later)."""
    if device is None:
        first = next(iter(model.parameters()), None)
        return torch.device("cpu") if first is None else first.device
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"{setting('device')} must be auto, cpu, cuda, cuda:N or a torch.device, got {device!r}")
    return resolve_device(str(device))


def _dtype_name(dtype: Any, model_dtype: torch.dtype) -> Dtype:
    if dtype is None:
        dtype = model_dtype
    if isinstance(dtype, torch.dtype):
        named = Dtype.of(dtype)
        if named is None:
            raise ConfigError(f"dtype: flatcheck measures in float32 or float64, and the model is {dtype}; "
                              "pass dtype='float32' or 'float64' (a copy is measured)")
        return named
    return live_settings()["dtype"].check("dtype", dtype)


def _say_what_changes(model: nn.Module, bn_mode: str | None, dtype: Any, target_dtype: str) -> None:
    """Warnings for what a live model is measured as that its own forward would not do, unless
    the caller chose it: its BatchNorm on running statistics while it is in train mode
    (bn_mode None, "eval" by default), its parameters cast to one dtype (dtype None)."""
    import warnings

    if bn_mode is None and model.training and uses_batch_statistics(model, BnMode.TRAIN):
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
               output_key: Any = None, call: str = LIVE) -> ModelSpec:
    """The spec a live model would have had: its class as a python source, the loss, the head."""
    cls = type(model)
    fields: dict[str, Any] = {"source": "python", "arch": f"{cls.__module__}:{cls.__qualname__}",
                              "head": head, "num_classes": num_classes, "output_key": output_key}
    if isinstance(loss, LossSpec):
        fields["loss"] = {"name": loss.name, **({"alpha": loss.alpha} if loss.name == "label_smoothing" else {})}
    else:
        fields["loss"] = dict(loss) if isinstance(loss, Mapping) else loss
    try:
        return spec_from_dict(fields, label=call, origin=f"{call} argument")
    except SpecError as exc:  # the caller typed an argument, not a spec: a setting's error
        raise ConfigError(str(exc)) from None


def _copy_to(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """A copy on `device` in `dtype`, without .grad: the caller's model is never moved or cast."""
    import copy

    work = copy.deepcopy(model)
    for p in work.parameters():
        p.grad = None
    return work.to(device=device, dtype=dtype)


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
