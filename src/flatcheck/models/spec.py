"""Model spec: the YAML file that tells flatcheck how to rebuild a network.

All validation of a spec happens here, once, so that the builders in `sources`
and the backend can trust every field. Each failure is a one-line `SpecError`
naming the file and the field.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from flatcheck.errors import SpecError
from flatcheck.models.registry import list_sources
from flatcheck.models.yamlfile import load_yaml

LOSSES = ("cross_entropy", "mse", "sigmoid_mse", "label_smoothing")
SOURCES = ("timm", "torchvision", "python")
DEFAULT_LABEL_SMOOTHING = 0.1

SPEC_FIELDS = (
    "source", "arch", "kwargs", "num_classes", "input_size",
    "mean", "std", "loss", "head", "checkpoint", "output_key",
)
_TOP_FIELDS = SPEC_FIELDS
_LOSS_FIELDS = ("name", "alpha")
_CHECKPOINT_FIELDS = ("key", "strip_prefix")
# Constructor arguments that would either clash with a top-level field or make
# a builder fetch pretrained weights; flatcheck always loads the user's checkpoint.
_RESERVED_KWARGS = ("num_classes", "pretrained", "weights")


def _normalise_loss_name(name: str) -> str:
    return name.strip().lower().replace("-", "_")


@dataclass(frozen=True)
class LossSpec:
    """Training loss. Hyphenated names ("sigmoid-mse") are accepted.

    alpha is the label-smoothing amount; left at 0.0 with name "label_smoothing"
    it becomes 0.1, since smoothing by zero would just be cross-entropy.
    """

    name: str = "cross_entropy"
    alpha: float = 0.0

    def __post_init__(self) -> None:
        name = _normalise_loss_name(self.name) if isinstance(self.name, str) else self.name
        if name not in LOSSES:
            raise SpecError(f"loss: unknown loss {self.name!r}; allowed: {', '.join(LOSSES)}")
        if not 0.0 <= float(self.alpha) < 1.0:
            raise SpecError(f"loss: 'alpha' must be in [0, 1), got {self.alpha!r}")
        alpha = float(self.alpha)
        if name == "label_smoothing" and alpha == 0.0:
            alpha = DEFAULT_LABEL_SMOOTHING
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "alpha", alpha)


@dataclass(frozen=True)
class CheckpointSpec:
    """Where the weights sit inside a checkpoint file.

    key: dotted path to a nested state dict ("state_dict", "ema.module").
    strip_prefix: removed from the start of every key that has it.
    """

    key: str | None = None
    strip_prefix: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    source: str
    arch: str
    kwargs: dict = field(default_factory=dict)
    num_classes: int | None = None
    input_size: tuple[int, ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    loss: LossSpec = field(default_factory=LossSpec)
    head: str | None = None
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    output_key: str | int | None = None  # which part of a structured forward output is the logits
    path: Path | None = None
    sha256: str | None = None
    # Came inside a checkpoint rather than from a file the user chose: its
    # `source: python` may only import packages named with --trust-package.
    embedded: bool = False
    # field -> where its value came from ("spec file PATH", "flag --num-classes", "library
    # metadata (…)", "default" …): the report stores it beside the resolved spec
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)
    # how messages name a spec that is no file ("--model timm:resnet18", "CKPT (embedded spec)")
    label: str | None = field(default=None, compare=False)
    # how a spec nobody named was found beside its checkpoint (models.discover), for messages;
    # set, it also marks a spec the user did not choose, whose python modules beside it are
    # imported only under --trust-package (sources.ImportPolicy)
    found: str | None = field(default=None, compare=False)
    # where a python spec that is no file (--model python:…) imports its own modules from:
    # the working directory, as a spec file's own folder
    folder: Path | None = field(default=None, compare=False)

    @property
    def discovered(self) -> bool:
        """Found beside its checkpoint (STEM.yaml, spec.yaml, config.json), not named by the user."""
        return self.found is not None and not self.embedded

    @property
    def where(self) -> str:
        """How error messages refer to this spec."""
        if self.label is not None:
            return self.label
        return str(self.path) if self.path is not None else "model spec"


def load_spec(path: str | Path, *, embedded: bool = False) -> ModelSpec:
    """Read and validate a YAML model spec (duplicate keys refused)."""
    path = Path(path)
    data, sha256 = read_spec_file(path)
    return spec_from_dict(data, path=path, sha256=sha256, embedded=embedded)


def read_spec_file(path: Path) -> tuple[Any, str]:
    """A YAML spec's parsed contents (not yet validated) and the sha256 of its bytes."""
    if path.is_dir():
        raise SpecError(f"{path}: model spec is a folder; give the YAML file")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(f"{path}: model spec not found") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read model spec ({exc.strerror or exc})") from None
    return load_yaml(raw, str(path)), hashlib.sha256(raw).hexdigest()


# the label of the spec a live model gets, the call it came from (measure(), the Tracker):
# its fields are the caller's keyword arguments, and messages name them so
LIVE = "measure()"
TRACKER = "Tracker()"
LIVE_CALLS = (LIVE, TRACKER)


def field_words(where: str, name: str) -> str:
    """How a message names a spec field: `field 'loss.name'` in a spec; where the spec is a
    live call's arguments (LIVE_CALLS), the keyword (`keyword 'loss' (its 'name')`)."""
    if where not in LIVE_CALLS:
        return f"field '{name}'"
    top, _, rest = name.partition(".")
    return f"keyword '{top}'" + (f" (its '{rest}')" if rest else "")


def spec_from_dict(
    data: Any, *, path: Path | None = None, sha256: str | None = None, embedded: bool = False,
    origins: Mapping[str, str] | None = None, origin: str | None = None, label: str | None = None,
    found: str | None = None, folder: Path | None = None,
) -> ModelSpec:
    """Validate a parsed spec. `path` only labels error messages and the result.

    embedded=True marks a spec that travelled inside a checkpoint: building it
    never imports Python code the user did not name with --trust-package.
    origins: where each given field came from; a given field it does not name came from
    `origin` (default: "spec file PATH"), and a field not given is "default".
    """
    where = label or (str(path) if path is not None else "model spec")
    v = _Validator(where)
    if not isinstance(data, Mapping):
        raise SpecError(f"{where}: top level must be a mapping of fields, got {_kind(data)}")
    values = _parse(v, data)
    for required in ("source", "arch"):
        if values.get(required) is None:
            raise SpecError(f"{where}: missing required field '{required}'")
    given = origin or (f"spec file {path}" if path is not None else "spec")
    told = dict(origins or {})
    try:
        v.check_normalisation(values.get("mean"), values.get("std"), values.get("input_size"))
    except SpecError as exc:
        # a flag's value checked against the file's: say which came from where
        flagged = [f"{f} from {told[f]}" for f in ("mean", "std", "input_size") if f in told]
        if not flagged:
            raise
        raise SpecError(f"{exc} ({'; '.join(flagged)})") from None
    return ModelSpec(
        **values, path=path, sha256=sha256, embedded=embedded, label=label, found=found, folder=folder,
        origins={f: told.get(f, given) if data.get(f) is not None else "default" for f in SPEC_FIELDS},
    )


def check_fields(data: Mapping[str, Any], where: str) -> None:
    """Validate the fields of a partial spec (values given on the command line, before they
    are merged with the rest): unknown names and wrong types, each named after `where`."""
    _parse(_Validator(where), data)


def _parse(v: "_Validator", data: Mapping[str, Any]) -> dict[str, Any]:
    """Every field's validated value (None or its default when absent)."""
    v.no_unknown(data, _TOP_FIELDS, "")
    source = v.optional_string(data.get("source"), "source")
    if source is not None and source not in _known_sources():
        allowed = ", ".join(_known_sources())
        raise SpecError(f"{v.where}: field 'source' must be one of {allowed}, got {source!r}")
    arch = v.optional_string(data.get("arch"), "arch")
    if source == "python" and arch is not None and ":" not in arch:
        raise SpecError(
            f"{v.where}: field 'arch' must be 'module.path:callable' for source python, got {arch!r}"
        )
    return {
        "source": source,
        "arch": arch,
        "kwargs": v.kwargs(data.get("kwargs")),
        "num_classes": v.positive_int(data.get("num_classes"), "num_classes"),
        "input_size": v.input_size(data.get("input_size")),
        "mean": v.floats(data.get("mean"), "mean", positive=False),
        "std": v.floats(data.get("std"), "std", positive=True),
        "loss": v.loss(data.get("loss")),
        "head": v.optional_string(data.get("head"), "head"),
        "checkpoint": v.checkpoint(data.get("checkpoint")),
        "output_key": v.output_key(data.get("output_key")),
    }


def spec_to_dict(spec: ModelSpec) -> dict[str, Any]:
    """The spec's fields as a YAML spec writes them (unset ones left out); spec_from_dict of it
    gives the same spec."""
    out: dict[str, Any] = {"source": spec.source, "arch": spec.arch}
    if spec.kwargs:
        out["kwargs"] = dict(spec.kwargs)
    for name in ("num_classes", "input_size", "mean", "std"):
        value = getattr(spec, name)
        if value is not None:
            out[name] = list(value) if isinstance(value, tuple) else value
    loss = spec.loss
    out["loss"] = {"name": loss.name, "alpha": loss.alpha} if loss.name == "label_smoothing" else loss.name
    for name in ("head", "output_key"):
        if getattr(spec, name) is not None:
            out[name] = getattr(spec, name)
    ckpt = {k: getattr(spec.checkpoint, k) for k in _CHECKPOINT_FIELDS if getattr(spec.checkpoint, k) is not None}
    if ckpt:
        out["checkpoint"] = ckpt
    return out


def _known_sources() -> tuple[str, ...]:
    # Sources registered at run time (plugins) are valid too.
    return tuple(dict.fromkeys((*SOURCES, *list_sources())))


def _kind(value: Any) -> str:
    if value is None:
        return "nothing (an empty file)"
    return {list: "a list", dict: "a mapping", str: "a string"}.get(type(value), repr(value))


class _Validator:
    """Type checks that all phrase their failure the same way."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, name: str, expected: str, value: Any) -> SpecError:
        return SpecError(f"{self.where}: {field_words(self.where, name)} must be {expected}, got {value!r}")

    def no_unknown(self, data: Mapping, allowed: tuple[str, ...], prefix: str) -> None:
        for key in data:
            if key not in allowed:
                raise SpecError(
                    f"{self.where}: unknown {field_words(self.where, prefix + str(key))}; "
                    f"allowed: {', '.join(sorted(prefix + a for a in allowed))}"
                )

    def string(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, "a non-empty string", value)
        return value.strip()

    def optional_string(self, value: Any, name: str) -> str | None:
        return None if value is None else self.string(value, name)

    def positive_int(self, value: Any, name: str) -> int | None:
        if value is None:
            return None
        # bool is an int subclass; `num_classes: yes` is a typo, not 1.
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(name, "a positive integer", value)
        return value

    def input_size(self, value: Any) -> tuple[int, ...] | None:
        if value is None:
            return None
        expected = "a list of 1 or 3 positive integers ([C, H, W] or [D])"
        if not isinstance(value, (list, tuple)) or len(value) not in (1, 3):
            raise self.fail("input_size", expected, value)
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int) or item <= 0:
                raise self.fail("input_size", expected, value)
        return tuple(value)

    def floats(self, value: Any, name: str, *, positive: bool) -> tuple[float, ...] | None:
        if value is None:
            return None
        expected = "a non-empty list of finite positive numbers" if positive else "a non-empty list of finite numbers"
        if not isinstance(value, (list, tuple)) or not value:
            raise self.fail(name, expected, value)
        for item in value:
            # YAML's .nan and .inf are floats; they would normalise every input to NaN.
            if isinstance(item, bool) or not isinstance(item, (int, float)) or not math.isfinite(item):
                raise self.fail(name, expected, value)
            if positive and not item > 0:
                raise self.fail(name, expected, value)
        return tuple(float(x) for x in value)

    def check_normalisation(self, mean, std, input_size) -> None:
        # One without the other would silently normalise half-way.
        if (mean is None) != (std is None):
            given, other = ("mean", "std") if mean is not None else ("std", "mean")
            raise SpecError(f"{self.where}: field '{given}' is set but '{other}' is not; give both or neither")
        if mean is None:
            return
        if len(mean) != len(std):
            raise SpecError(
                f"{self.where}: fields 'mean' and 'std' must have the same length, got {len(mean)} and {len(std)}"
            )
        if input_size is not None and len(input_size) == 3 and len(mean) != input_size[0]:
            raise SpecError(
                f"{self.where}: field 'mean' must have {input_size[0]} values (one per channel "
                f"of input_size {list(input_size)}), got {len(mean)}"
            )

    def output_key(self, value: Any) -> str | int | None:
        if value is None:
            return None
        if isinstance(value, str) and value.strip():
            return value.strip()
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        raise self.fail("output_key", "a key or attribute name, or a non-negative index", value)

    def kwargs(self, value: Any) -> dict:
        if value is None:
            return {}
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise self.fail("kwargs", "a mapping of argument names to values", value)
        for key in _RESERVED_KWARGS:
            if key in value:
                hint = "use the top-level field" if key == "num_classes" else "flatcheck never downloads weights"
                raise SpecError(f"{self.where}: field 'kwargs' must not contain '{key}' ({hint})")
        return dict(value)

    def loss(self, value: Any) -> LossSpec:
        if value is None:
            return LossSpec()
        if isinstance(value, str):
            value = {"name": value}
        if not isinstance(value, Mapping):
            raise self.fail("loss", "a loss name or a mapping with 'name' and 'alpha'", value)
        self.no_unknown(value, _LOSS_FIELDS, "loss.")
        name = _normalise_loss_name(self.string(value.get("name", "cross_entropy"), "loss.name"))
        if name not in LOSSES:
            raise SpecError(
                f"{self.where}: {field_words(self.where, 'loss.name')} must be one of {', '.join(LOSSES)}, "
                f"got {value.get('name')!r}"
            )
        alpha = value.get("alpha")
        if alpha is None:
            return LossSpec(name=name)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < 1:
            raise self.fail("loss.alpha", "a number in [0, 1)", alpha)
        if name != "label_smoothing" and alpha != 0:
            raise SpecError(f"{self.where}: {field_words(self.where, 'loss.alpha')} only applies to label_smoothing, "
                            f"not {name}")
        return LossSpec(name=name, alpha=float(alpha))

    def checkpoint(self, value: Any) -> CheckpointSpec:
        if value is None:
            return CheckpointSpec()
        if not isinstance(value, Mapping):
            raise self.fail("checkpoint", "a mapping with 'key' and/or 'strip_prefix'", value)
        self.no_unknown(value, _CHECKPOINT_FIELDS, "checkpoint.")
        return CheckpointSpec(
            key=self.optional_string(value.get("key"), "checkpoint.key"),
            strip_prefix=self.optional_string(value.get("strip_prefix"), "checkpoint.strip_prefix"),
        )


def spec_yaml(spec: Any) -> str:
    """A ModelSpec as a YAML spec file, each field under a comment saying where its value came
    from (spec.origins); loading the text gives the same spec."""
    lines = [f"# resolved by flatcheck: {spec.source}:{spec.arch}"]
    for name, value in spec_to_dict(spec).items():
        lines.append(f"# {name}: {spec.origins.get(name, 'default')}")
        flow = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=1 << 16)
        lines.append(f"{name}: {flow.removesuffix(chr(10)).removesuffix('...').strip()}")
    return "\n".join(lines) + "\n"
