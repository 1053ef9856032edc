"""RunConfig: everything a run needs, typed and validated once, here, at the edge."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .backends.base import BN_MODES
from .errors import ConfigError
from .linalg.memory import parse_bytes
from .models.spec import ModelSpec
from .probes.registry import list_probes, parse_options

DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEFAULT_SAMPLES = 1000
# torch's generators take up to 2**64 - 1, but probes offset the seed to get further streams
# (adaptive-sharpness adds 0x9E3779B9), and a signed 64-bit seed round-trips through any JSON reader
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class ProbeRequest:
    name: str
    options: Any  # the probe's own frozen Options dataclass


@dataclass(frozen=True)
class RunConfig:
    checkpoint: Path | None  # None: keep the weights the model source built (random init)
    spec: "Path | ModelSpec"  # a YAML path, or a spec built in code (e.g. by a scan)
    probes: tuple[ProbeRequest, ...]
    data: str = "digits"
    data_root: Path | None = None
    split: str = "train"
    samples: int | None = None  # None: the first DEFAULT_SAMPLES, or the whole split if smaller
    batch_size: int = 128
    device: str = "auto"
    dtype: str = "float32"
    bn_mode: str = "eval"
    seed: int = 0
    params: tuple[str, ...] = ()
    backend: str = "autograd"
    allow_tf32: bool = False
    compile: bool = False  # torch.compile the HVP (func backends)
    # seconds for all the probes of the run (--budget); each probe gets an equal share of what is
    # left when it starts, and iterative ones stop there (details.stop_reason "budget")
    budget: float | None = None
    # bytes this process may hold while a probe runs (--max-memory: 8G, 512M, or bytes), what it
    # holds already included (api.run leaves each probe the rest); None: a probe's working set
    # takes at most half of the free memory when it runs
    max_memory: int | str | None = None
    # packages a `source: python` spec may import beyond flatcheck.zoo, timm, torchvision
    trust_packages: tuple[str, ...] = ()
    extra_meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        # in code (flatcheck.run) the fields arrive untyped: paths as text, probes as "trace,gini"
        for name in ("checkpoint", "data_root"):
            object.__setattr__(self, name, _path_or_none(f"RunConfig {name}", getattr(self, name)))
        if not isinstance(self.spec, ModelSpec):
            object.__setattr__(self, "spec", _path_or_none("RunConfig spec", self.spec, spec=True))
        if isinstance(self.probes, str) or (isinstance(self.probes, (list, tuple)) and self.probes
                                            and all(isinstance(p, str) for p in self.probes)):
            object.__setattr__(self, "probes", probe_requests(self.probes))
        elif not (isinstance(self.probes, (list, tuple)) and all(isinstance(p, ProbeRequest) for p in self.probes)):
            raise ConfigError(f"RunConfig probes: expected probe names (\"trace,gini\" or a list) or probe_requests(...), "
                              f"got {type(self.probes).__name__}")
        object.__setattr__(self, "probes", tuple(self.probes))
        if self.split not in ("train", "test"):
            raise ConfigError(f"--split must be train or test, got {self.split!r}")
        if self.samples is not None and self.samples < 1:
            raise ConfigError(f"--samples must be a positive integer, got {self.samples}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be a positive integer, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.bn_mode not in BN_MODES:
            raise ConfigError(f"--bn-mode must be one of {', '.join(BN_MODES)}, got {self.bn_mode!r}")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", self.device):
            raise ConfigError(f"--device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be an integer from 0 to {MAX_SEED} (2**63 - 1), got {self.seed}")
        if self.budget is not None and not (math.isfinite(self.budget) and self.budget > 0):
            raise ConfigError(f"--budget must be a positive number of seconds, got {self.budget}")
        if self.max_memory is not None:
            object.__setattr__(self, "max_memory", parse_bytes(self.max_memory))
        if not self.probes:
            raise ConfigError("no probes requested; see `flatcheck list-probes`")
        object.__setattr__(self, "trust_packages", _package_names(self.trust_packages))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def _path_or_none(what: str, value: Any, spec: bool = False) -> Path | None:
    if value is None and not spec:
        return None
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    wanted = "a YAML path or a ModelSpec" if spec else "a path (str or pathlib.Path) or None"
    raise ConfigError(f"{what}: expected {wanted}, got {type(value).__name__}")


def _package_names(names: Any) -> tuple[str, ...]:
    """--trust-package values (None, a list or a tuple from the CLI) as dotted module names."""
    names = tuple(names or ())
    for name in names:
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
            raise ConfigError(f"--trust-package expects a Python package name such as mymodels, got {name!r}")
    return names


def probe_names(names: str | list[str]) -> list[str]:
    """"trace, gini" (or a list) as the probe names it lists, blanks dropped."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    return [n for n in names if n]


def probe_requests(names: str | list[str], options: dict[str, dict[str, Any]] | None = None) -> tuple[ProbeRequest, ...]:
    """Parse "trace,gini" plus {"trace": {"estimator": "exact"}} into validated requests."""
    options = dict(options or {})
    names = probe_names(names)
    if not names:
        raise ConfigError(f"--probes is empty; available: {', '.join(list_probes())}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--probes lists a probe twice: {','.join(names)}")
    for extra in set(options) - set(names):
        raise ConfigError(f"-o {extra}.…: probe {extra!r} is not among --probes {','.join(names)}")
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
