"""Probe registry (register_probe / list_probes / create_probe) and what a probe is given.

Adding a probe is one decorated class in one file of this package; it declares typed
options (a frozen dataclass) that are validated once, at the edge, by `parse_options`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import pkgutil
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol, runtime_checkable

import torch

from ..backends.base import Backend
from ..errors import ConfigError, setting
from ..models.spec import ModelSpec
from ..report.result import ProbeResult


@dataclass
class ProbeContext:
    backend: Backend
    seed: int
    # (description, done, total, *, value=None, stderr=None): see probes/kit.progress_reporter
    progress: Callable[..., None] | None = None
    spec: ModelSpec | None = None  # the model spec, for probes that need e.g. the head's name
    # the same data source, another split ("train"/"test"), same sample cap and batching;
    # raises DataError when that split does not exist
    split_samples: Callable[[str], Any] | None = None
    # time.monotonic() by which this probe's share of --budget is spent; iterative estimators
    # stop there and report what they reached (details.stop_reason "budget")
    deadline: float | None = None
    # state a probe may keep from one run to the next on the same model (a Tracker's warm
    # starts: lmax keeps its Ritz vectors here); None: every run starts cold
    warm: dict[Any, Any] | None = None
    # bytes a probe's working set may take (what the run's max_memory, the process's cap,
    # leaves when the probe starts); None: half of what is free when it runs
    # (linalg.memory.memory_limit). Probes chunk samples/classes/vectors to fit, or refuse
    memory_allowance: int | None = None
    # the run's max_memory as given and what the process held when the probes started (None
    # without it): recorded in each result's details.memory, so a plan can be read back
    memory_cap: int | None = None
    memory_held: int | None = None

    def generator(self) -> torch.Generator:
        """A fresh generator per probe, so a probe's numbers do not depend on which ran before it."""
        return torch.Generator().manual_seed(self.seed)


class Probe(Protocol):
    """A probe declares how a CI gate reads its results as `gating: ClassVar[Gating]`
    (flatcheck.probes.gating): its error bound and degrees of freedom, what pairs two runs,
    which options define the quantity, which routes are other estimators, the option a
    rerun raises. A probe without one is gated on its exact values only.

    The probe's CLI command (`flatcheck NAME`) is generated from `Options`; `command_help`
    (default: `summary`) is its help line, and `shows_layers = True` gives a command without
    a per-layer option field a --layers/--no-layers switch of the table alone."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type]
    # the backend capabilities every run needs (protocols of flatcheck.backends.base: Outputs,
    # Hvp, GGNVp, ExactGGN, …); a probe whose needs depend on its options also has
    # `requires_for(options)` (NeedsByOptions), which `requirements` asks instead
    requires: ClassVar[frozenset[type]]

    def run(self, ctx: ProbeContext, options: Any) -> ProbeResult: ...


@runtime_checkable
class NeedsByOptions(Protocol):
    """A probe whose needs depend on its options (a Hessian Hutchinson trace needs no GGN trace)."""

    def requires_for(self, options: Any) -> frozenset[type]: ...


def requirements(probe: Probe, options: Any) -> frozenset[type]:
    """The backend capabilities this run of `probe` needs, with these options."""
    return probe.requires_for(options) if isinstance(probe, NeedsByOptions) else probe.requires


_PROBES: dict[str, type] = {}


def register_probe(cls: type) -> type:
    _PROBES[cls.name] = cls
    return cls


def _load_builtin() -> None:
    # the probe modules are this module's siblings, found by file name (not imported by name
    # here, which would make the package and its registry import each other); a helper module
    # imported with them (kit, explanations) registers nothing
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name != "registry" and not info.name.startswith("_"):  # _name: private helpers
            importlib.import_module(f"{__package__}.{info.name}")


def list_probes(pattern: str = "*") -> list[str]:
    _load_builtin()
    return sorted(n for n in _PROBES if fnmatch.fnmatchcase(n, pattern))


def get_probe_class(name: str) -> type:
    if name not in _PROBES:  # the probe's own module first (head-trace: head_trace.py), the rest if need be
        module = name.replace("-", "_")
        if module.isidentifier() and not module.startswith("_") and (Path(__file__).parent / f"{module}.py").is_file():
            importlib.import_module(f"{__package__}.{module}")
    if name not in _PROBES:
        _load_builtin()
    if name not in _PROBES:
        raise ConfigError(f"{setting('probes')}: unknown probe {name!r}; available: {', '.join(list_probes())}")
    return _PROBES[name]


def create_probe(name: str) -> Probe:
    return get_probe_class(name)()


def parse_options(name: str, raw: dict[str, Any]) -> Any:
    """Build the probe's Options from loosely typed values (strings from -o key=value included)."""
    cls = get_probe_class(name).Options
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in raw.items():
        key_n = key.replace("-", "_")
        if key_n not in fields:
            raise ConfigError(
                f"option {name}.{key} is unknown; {name} takes: {', '.join(sorted(fields)) or 'no options'}"
            )
        parse = fields[key_n].metadata.get("parse")
        if parse is not None and isinstance(value, str):
            value = parse(value)  # the field's own reading of a string ("auto" → None …)
        values[key_n] = _coerce(f"{name}.{key_n} (--{key_n.replace('_', '-')})", value, hints[key_n])
    try:
        options = cls(**values)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    # options given together that the probe would silently ignore (an estimator without
    # probes, a floor above the ceiling): only given ones count, a default is never the user's
    check_given = getattr(options, "check_given", None)
    if check_given is not None:
        check_given(frozenset(values))
    return options


def _coerce(where: str, value: Any, hint: Any) -> Any:
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ConfigError(f"option {where} must be one of {', '.join(map(str, allowed))}, got {value!r}")
        return value
    try:
        if hint is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                return value.lower() in ("true", "1", "yes")
            return bool(value)
        if hint is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if hint is float:
            return float(value)
    except (TypeError, ValueError):
        kind = "true or false (also 1/0, yes/no)" if hint is bool else f"{'an' if hint is int else 'a'} {hint.__name__}"
        raise ConfigError(f"option {where} must be {kind}, got {value!r}") from None
    return value
