"""The run's settings, declared once: name, type, default, help, check and CLI flag of each.

`Settings` is the declaration. flatcheck.config.RunConfig is a Settings with the model and
the probes added; the CLI's shared flags (commands/kit.py), the keywords of measure() and the
Tracker (flatcheck.live) and the way an error names a setting are all read from it: an error
below the CLI names a setting with errors.setting("max_memory"), which a call reads as
`max_memory` and the CLI as `--max-memory` (flag_of).

A floor module: no torch, no flatcheck module but errors, so that `flatcheck --help` reads
the flags without importing torch.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import ConfigError, setting

# torch's generators take up to 2**64 - 1, but probes offset the seed to get further streams
# (adaptive-sharpness adds 0x9E3779B9), and a signed 64-bit seed round-trips through any JSON reader
MAX_SEED = 2**63 - 1
DEFAULT_SAMPLES = 1000
DEFAULT_BATCH_SIZE = 128


class BnMode(enum.StrEnum):
    """Which statistics BatchNorm normalises with while a probe runs."""

    EVAL = "eval"  # the running statistics: each sample's output depends on that sample only
    TRAIN = "train"  # the batch's statistics, as training uses them (running buffers left untouched)


class Dtype(enum.StrEnum):
    """The floating-point type a run measures in."""

    FLOAT32 = "float32"
    FLOAT64 = "float64"

    @property
    def torch(self) -> Any:
        import torch

        return getattr(torch, self.value)

    @classmethod
    def of(cls, torch_dtype: Any) -> "Dtype | None":
        """The Dtype of a torch.dtype (None: one flatcheck does not measure in)."""
        return next((d for d in cls if d.torch == torch_dtype), None)


class DeviceKind(enum.StrEnum):
    """What --device names: auto (CUDA when present, under torchrun each rank's own GPU), or
    a device type; cuda may carry an index (cuda:1)."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"
    MPS = "mps"


@dataclass(frozen=True)
class Setting:
    """How one field of Settings is given and checked.

    flag: its CLI spelling (None: not a CLI flag); cli_type: the type the CLI parses before
    `check` sees the value (a size "8G" for max_memory); check(name, value) returns the value
    in its field's type or raises ConfigError naming the setting; live: a keyword of
    measure() and the Tracker, whose default there is `live_default` (None: taken from the
    model, the data or the declaration's default, as flatcheck.live says)."""

    flag: str | None
    help: str
    check: Callable[[str, Any], Any]
    cli_type: Any = None
    live: bool = False
    live_default: Any = None


SETTING = "flatcheck.setting"


def declare(default: Any, flag: str | None, help: str, check: Callable[[str, Any], Any], **how: Any) -> Any:
    return dataclasses.field(default=default, metadata={SETTING: Setting(flag, help, check, **how)})


# ---------------------------------------------------------------- checks: (name, value) -> value


def _choice(enum_type: type[enum.StrEnum]) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        try:
            return enum_type(value)
        except ValueError:
            choices = ", ".join(m.value for m in enum_type)
            raise ConfigError(f"{setting(name)} must be one of {choices}, got {value!r}") from None

    return check


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{setting(name)} must be text, got {value!r}")
    return value


def _split(name: str, value: Any) -> str:
    if value not in ("train", "test"):
        raise ConfigError(f"{setting(name)} must be train or test, got {value!r}")
    return value


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{setting(name)} must be a positive integer, got {value!r}")
    return value


def _positive_int_or_none(name: str, value: Any) -> int | None:
    return None if value is None else _positive_int(name, value)


def _device(name: str, value: Any) -> str:
    text = str(value) if type(value).__name__ == "device" else value  # a torch.device
    kind, colon, index = text.partition(":") if isinstance(text, str) else ("", "", "")
    if kind not in DeviceKind.__members__.values() or (colon and (kind != DeviceKind.CUDA or not index.isdigit())):
        raise ConfigError(f"{setting(name)} must be auto, cpu, cuda or cuda:N, got {value!r}")
    return text


def _seed(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{setting(name)} must be an integer from 0 to {MAX_SEED} (2**63 - 1), got {value!r}")
    return value


def _budget(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{setting(name)} must be a positive number of seconds, got {value!r}")
    return float(value)


def _size(name: str, value: Any) -> int | None:
    if value is None:
        return None
    from .linalg.memory import parse_bytes

    return parse_bytes(value, name)


def _flag_only(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{setting(name)} must be True or False, got {value!r}")
    return value


def _path(name: str, value: Any) -> Path | None:
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise ConfigError(f"{setting(name)}: expected a path (str or pathlib.Path) or None, got {type(value).__name__}")


def names_of(name: str, value: Any) -> tuple[str, ...]:
    """A list of names given as "a, b" (the CLI's comma-separated flag) or any iterable of
    strings, blanks dropped."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(n.strip() for n in value.split(",") if n.strip())
    try:
        names = tuple(value)
    except TypeError:
        raise ConfigError(f"{setting(name)} must be a name, a comma-separated string or a list of names, "
                          f"got {value!r}") from None
    if not all(isinstance(n, str) for n in names):
        raise ConfigError(f"{setting(name)} must list names (strings), got {value!r}")
    return tuple(n.strip() for n in names if n.strip())


def _packages(name: str, value: Any) -> tuple[str, ...]:
    names = tuple(value or ())
    for package in names:
        if not isinstance(package, str) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", package):
            raise ConfigError(f"{setting(name)} expects a Python package name such as mymodels, got {package!r}")
    return names


# ---------------------------------------------------------------- the declaration


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How a run measures: the data, the numerics, the seed and the limits. Checked once, when
    made; a value may arrive as the CLI or a call gives it ("8G", "a,b", a torch.device)."""

    data: str = declare("digits", "--data", "data set: digits, synthetic, cifar10, cifar100, mnist, "
                        "fashion-mnist, svhn, npz:PATH, imagefolder:PATH", _text)
    data_root: Optional[Path] = declare(None, "--data-root", "folder holding torchvision data sets "
                                        "[default: $FLATCHECK_DATA_ROOT]", _path, cli_type=Optional[Path])
    split: str = declare("train", "--split", "train or test", _split)
    samples: Optional[int] = declare(None, "--samples", "use the first N samples, in fixed order "
                                     "[default: 1000, or the whole split if smaller]", _positive_int_or_none,
                                     cli_type=Optional[int], live=True)
    batch_size: int = declare(DEFAULT_BATCH_SIZE, "--batch-size", "samples per forward pass [default: 128, "
                              "grown on a CUDA device to what a probe's memory holds, except under --bn-mode train]",
                              _positive_int, live=True)
    device: str = declare("auto", "--device", "auto, cpu, cuda or cuda:N", _device, live=True)
    dtype: Dtype = declare(Dtype.FLOAT32, "--dtype", "float32 or float64", _choice(Dtype), cli_type=str, live=True)
    bn_mode: BnMode = declare(BnMode.EVAL, "--bn-mode", "BatchNorm statistics: eval (running) or train "
                              "(batch; running stats left untouched)", _choice(BnMode), cli_type=str, live=True)
    seed: int = declare(0, "--seed", "seed of every random draw: probe vectors, samples, and a --random-init "
                        "model's weights", _seed, live=True, live_default=0)
    # bytes this process may hold while a probe runs, what it holds already included (api.run
    # leaves each probe the rest); None: a probe's working set takes at most half of the free
    # memory when it runs
    max_memory: Optional[int] = declare(
        None, "--max-memory", "memory this process may hold while a probe runs, e.g. 8G or 512M (G, M: GiB, MiB; "
        "GB, MB: 10^9, 10^6 bytes; on CUDA, device memory), what it holds already (torch, the model, the "
        "samples) included: samples, classes and vectors are chunked to fit, and a probe that cannot fit exits "
        "2 [default: each probe's working set takes at most half the free RAM, or half the free VRAM on CUDA]",
        _size, cli_type=Optional[str], live=True)
    params: tuple[str, ...] = declare((), "--params", "comma-separated globs of parameter names to probe, "
                                      "e.g. 'head.*' [default: all trainable]", names_of, cli_type=Optional[str],
                                      live=True)
    backend: str = declare("autograd", "--backend", "product backend", _text)
    allow_tf32: bool = declare(False, "--allow-tf32", "allow TF32 matmuls on CUDA (off by default)", _flag_only)
    compile: bool = declare(False, "--compile", "torch.compile the Hessian-vector product (--backend func; "
                            "falls back to eager if it cannot)", _flag_only)
    # packages a `source: python` spec may import beyond flatcheck.zoo, timm, torchvision
    trust_packages: tuple[str, ...] = declare((), "--trust-package", "let a 'source: python' spec import this "
                                              "package (repeatable); a python spec is code", _packages,
                                              cli_type=Optional[list[str]])
    # seconds for all the probes of the run; each probe gets an equal share of what is left
    # when it starts, and iterative ones stop there (details.stop_reason "budget")
    budget: Optional[float] = declare(
        None, "--budget", "seconds for the run's probes: iterative ones stop when it is spent and report what "
        "they reached (details.stop_reason: budget); several probes share what is left equally [default: none]",
        _budget, cli_type=Optional[float], live=True)

    def __post_init__(self):
        for name, how in declared().items():
            object.__setattr__(self, name, how.check(name, getattr(self, name)))


def declared() -> dict[str, Setting]:
    """Every setting by name, in declaration order."""
    return {f.name: f.metadata[SETTING] for f in dataclasses.fields(Settings)}


def default_of(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(Settings) if f.name == name)


def flag_of(name: str) -> str:
    """How the CLI says a setting (or another name an error gives, such as `probes`)."""
    how = declared().get(name)
    return how.flag if how is not None and how.flag else "--" + name.replace("_", "-")


def live_settings() -> dict[str, Setting]:
    """The settings measure() and the Tracker take as keywords."""
    return {name: how for name, how in declared().items() if how.live}
