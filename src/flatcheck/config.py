"""RunConfig: everything a run needs, typed and validated once, here, at the edge: the
settings (flatcheck.settings, where each is declared with its flag and check), the model and
the probes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, setting
from .settings import DEFAULT_SAMPLES, MAX_SEED, Settings

if TYPE_CHECKING:
    import torch

    from .models.spec import ModelSpec

__all__ = ["DEFAULT_SAMPLES", "MAX_SEED", "ProbeRequest", "RunConfig", "parse_option_assignments", "probe_names",
           "probe_requests"]


@dataclass(frozen=True)
class ProbeRequest:
    name: str
    options: Any  # the probe's own frozen Options dataclass


@dataclass(frozen=True, kw_only=True)
class RunConfig(Settings):
    checkpoint: Path | None  # None: keep the weights the model source built (random init)
    spec: "Path | ModelSpec"  # a YAML path, or a spec built in code (e.g. by a scan)
    probes: tuple[ProbeRequest, ...]
    extra_meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        from .models.spec import ModelSpec

        # in code (flatcheck.run) the fields arrive untyped: paths as text, probes as "trace,gini"
        object.__setattr__(self, "checkpoint", _path_or_none("RunConfig checkpoint", self.checkpoint))
        if not isinstance(self.spec, ModelSpec):
            object.__setattr__(self, "spec", _path_or_none("RunConfig spec", self.spec, spec=True))
        if isinstance(self.probes, str) or (isinstance(self.probes, (list, tuple)) and self.probes
                                            and all(isinstance(p, str) for p in self.probes)):
            object.__setattr__(self, "probes", probe_requests(self.probes))
        elif not (isinstance(self.probes, (list, tuple)) and all(isinstance(p, ProbeRequest) for p in self.probes)):
            raise ConfigError(f"RunConfig probes: expected probe names (\"trace,gini\" or a list) or probe_requests(...), "
                              f"got {type(self.probes).__name__}")
        object.__setattr__(self, "probes", tuple(self.probes))
        super().__post_init__()
        if not self.probes:
            raise ConfigError("no probes requested; see `flatcheck list-probes`")

    @property
    def torch_dtype(self) -> "torch.dtype":
        return self.dtype.torch


def _path_or_none(what: str, value: Any, spec: bool = False) -> Path | None:
    if value is None and not spec:
        return None
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    wanted = "a YAML path or a ModelSpec" if spec else "a path (str or pathlib.Path) or None"
    raise ConfigError(f"{what}: expected {wanted}, got {type(value).__name__}")


def probe_names(names: str | list[str]) -> list[str]:
    """"trace, gini" (or a list) as the probe names it lists, blanks dropped."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    return [n for n in names if n]


def probe_requests(names: str | list[str], options: dict[str, dict[str, Any]] | None = None) -> tuple[ProbeRequest, ...]:
    """Parse "trace,gini" plus {"trace": {"estimator": "exact"}} into validated requests."""
    from .probes.registry import list_probes, parse_options

    options = dict(options or {})
    names = probe_names(names)
    if not names:
        raise ConfigError(f"{setting('probes')} is empty; available: {', '.join(list_probes())}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{setting('probes')} lists a probe twice: {','.join(names)}")
    for extra in set(options) - set(names):
        raise ConfigError(f"-o {extra}.…: probe {extra!r} is not among {setting('probes')} {','.join(names)}")
    return tuple(ProbeRequest(n, parse_options(n, options.get(n, {}))) for n in names)


def parse_option_assignments(items: list[str]) -> dict[str, dict[str, str]]:
    """["trace.estimator=exact", ...] → {"trace": {"estimator": "exact"}}."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        probe, dot, name = key.partition(".")
        if not sep or not dot or not probe or not name:
            raise ConfigError(f"-o/--option expects PROBE.KEY=VALUE, got {item!r}")
        out.setdefault(probe.strip(), {})[name.strip()] = value.strip()
    return out
