"""Which model a run measures, from what the user gave: --spec, --model, the checkpoint alone,
and the spec-field flags every command shares. Nothing is built here (see models.load).

Precedence, highest first: a flag (--num-classes, --input-size, --mean, --std, --set), then
the spec (the --spec file, --model's reference, or what the checkpoint says: models.discover),
then the library's own metadata (filled after the model is built: sources.complete_spec),
then flatcheck's defaults. Every field's origin travels with the spec into the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flatcheck.errors import CheckpointError, ConfigError
from flatcheck.models.discover import NO_WEIGHTS, find_spec, nothing_found, spec_from_timm_config
from flatcheck.models.pretrained import HF_HUB, find_local_weights, find_torchvision_weights, hf_cache_dir, hf_cached
from flatcheck.models.spec import SPEC_FIELDS, ModelSpec, check_fields, read_spec_file, spec_from_dict
from flatcheck.models.yamlfile import load_yaml

REF_FORMS = "timm:NAME, torchvision:NAME or python:MODULE:FUNCTION"
_DOTTED = ("kwargs", "loss", "checkpoint")  # mapping fields --set may reach into: --set loss.alpha=0.2


@dataclass(frozen=True)
class ModelRequest:
    """What the command line (or load_model's arguments) said about the model."""

    checkpoint: Path | None = None
    spec: Path | None = None
    model: str | None = None
    pretrained: bool = False
    random_init: bool = False
    num_classes: int | None = None
    input_size: str | None = None  # S or C,H,W
    mean: str | None = None  # comma-separated
    std: str | None = None
    sets: tuple[str, ...] = ()  # FIELD=VALUE
    fields: dict[str, Any] = field(default_factory=dict)  # spec fields given in code (load_model)


@dataclass(frozen=True)
class Resolved:
    spec: ModelSpec
    checkpoint: Path | None  # the weights' file: the user's, or the library's from its local cache
    weights: str  # "checkpoint", "pretrained" or "random-init"


def resolve(req: ModelRequest) -> Resolved:
    """The spec and the weights' file for `req`; one-line ConfigError/SpecError otherwise."""
    if req.pretrained and req.random_init:
        raise ConfigError("--pretrained and --random-init exclude each other")
    if req.checkpoint is not None and (req.pretrained or req.random_init):
        flag = "--pretrained" if req.pretrained else "--random-init"
        raise ConfigError(f"{flag} is for a run without a CHECKPOINT; {req.checkpoint} gives the weights")
    base = _base(req)
    spec = _with_overrides(base, *_overrides(req))
    if req.checkpoint is not None:
        return Resolved(spec, req.checkpoint, "checkpoint")
    if req.random_init:
        return Resolved(spec, None, "random-init")
    if req.pretrained:
        return Resolved(spec, library_weights(spec, base.weights_name), "pretrained")
    raise ConfigError(NO_WEIGHTS)


def describe(req: ModelRequest) -> ModelSpec:
    """The spec alone (no weights needed): `flatcheck spec`."""
    return _with_overrides(_base(req), *_overrides(req))


# ---------------------------------------------------------------- the spec's own layer


@dataclass(frozen=True)
class _Base:
    data: dict[str, Any]
    origin: str
    path: Path | None = None
    sha256: str | None = None
    embedded: bool = False
    label: str | None = None
    weights_name: str | None = None  # the library's name for --pretrained, when not the arch (hf-hub:…)
    found: str | None = None  # how the checkpoint's own spec was found (discover.Found.how)
    folder: Path | None = None  # a --model python: reference's own modules: the working directory


def _base(req: ModelRequest) -> _Base:
    if req.spec is not None and req.model is not None:
        raise ConfigError("--spec and --model exclude each other: give the model one way")
    if req.spec is not None:
        data, sha256 = read_spec_file(req.spec)
        return _Base(data, f"spec file {req.spec}", req.spec, sha256)
    if req.model is not None:
        return model_reference(req.model)
    if req.checkpoint is None:
        raise ConfigError("no model: give a CHECKPOINT that says what it holds, --spec SPEC or --model REF "
                          f"({REF_FORMS})")
    if not req.checkpoint.is_file():  # before asking what it says: a missing file says nothing
        if req.checkpoint.is_dir():
            raise CheckpointError(f"checkpoint {req.checkpoint} is a folder, not a file; give the checkpoint file "
                                  "inside it")
        raise CheckpointError(f"checkpoint not found: {req.checkpoint}")
    found = find_spec(req.checkpoint)
    if found is None:
        raise ConfigError(nothing_found(req.checkpoint))
    data, sha256 = found.read()
    return _Base(data, found.origin, found.path, sha256, found.kind == "embedded", found.label, found=found.how)


def model_reference(ref: str) -> _Base:
    """--model REF as spec fields: timm:NAME (hf-hub:timm/… included), torchvision:NAME,
    python:MODULE:FUNCTION."""
    source, sep, name = ref.partition(":")
    label = f"--model {ref}"
    if not sep or not name.strip() or source not in ("timm", "torchvision", "python"):
        raise ConfigError(f"--model expects {REF_FORMS}, got {ref!r}")
    name = name.strip()
    if source == "python" and (":" not in name or not all(name.split(":", 1))):
        raise ConfigError(f"--model python: expects python:MODULE:FUNCTION, got {ref!r}")
    if source == "timm" and name.startswith(HF_HUB):
        return _hf_hub(name, label)
    # a python reference imports a module in the working directory as a spec file imports one
    # in its own folder (models.sources._ImportPolicy): taken now, where the user typed it
    folder = Path.cwd() if source == "python" else None
    return _Base({"source": source, "arch": name}, f"flag --model {ref}", label=label, folder=folder)


def _hf_hub(name: str, label: str) -> _Base:
    """An hf-hub:timm/… model is described by its repository's config.json, read from the local
    HF cache (flatcheck never downloads; timm would fetch it even without weights)."""
    repo = name[len(HF_HUB):].partition("@")[0]
    cache = hf_cache_dir()
    found = hf_cached(repo, ["config.json"], cache)
    if found is None:
        raise ConfigError(f"{label}: config.json of {repo} is not in the local HF cache {cache} (flatcheck never "
                          f"downloads: fetch it with `hf download {repo}`, or set HF_HOME)")
    import json

    data = spec_from_timm_config(json.loads(found.read_text(encoding="utf-8")), found)
    return _Base(data, f"config.json {found}", label=label, weights_name=name)


# ---------------------------------------------------------------- the flags' layer


def flag_fields(req: ModelRequest) -> dict[str, Any]:
    """The spec fields `req`'s flags set (--num-classes, --input-size, --mean, --std, --set), checked."""
    return _overrides(req)[0]


def merge_fields(data: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """Spec fields with flag-set ones on top; kwargs/loss/checkpoint mappings merge key by key."""
    out = dict(data)
    for name, value in fields.items():
        if name in _DOTTED and isinstance(value, dict) and name in out:
            out[name] = {**_as_mapping(name, out[name]), **value}
        else:
            out[name] = value
    return out


def _overrides(req: ModelRequest) -> tuple[dict[str, Any], dict[str, str]]:
    """Spec fields set by flags (or load_model's keywords), each checked alone so that an error
    names the flag, and where each came from."""
    out: dict[str, Any] = {}
    told: dict[str, str] = {}

    def put(name: str, value: Any, flag: str) -> None:
        check_fields({name: value}, flag)
        out[name] = value
        told[name] = f"flag {flag.split('=')[0]}"

    for name, value in req.fields.items():
        if name not in SPEC_FIELDS:
            raise ConfigError(f"load_model: unknown spec field {name!r}; allowed: {', '.join(SPEC_FIELDS)}")
        put(name, list(value) if isinstance(value, tuple) else value, f"load_model({name}=…)")
        told[name] = "argument"
    if req.num_classes is not None:
        put("num_classes", req.num_classes, "--num-classes")
    if req.input_size is not None:
        put("input_size", list(parse_input_size(req.input_size)), "--input-size")
    for name in ("mean", "std"):
        text = getattr(req, name)
        if text is not None:
            put(name, list(parse_floats(text, f"--{name}")), f"--{name}")
    for item in req.sets:
        name, value = parse_set(item)
        top, _, sub = name.partition(".")
        if sub:
            merged = _as_mapping(top, out.get(top))
            merged[sub] = value
            check_fields({top: merged}, f"--set {item}")
            out[top] = merged
        else:
            check_fields({top: value}, f"--set {item}")
            out[top] = value
        told[top] = f"flag --set {top}"
    return out, told


def _with_overrides(base: _Base, overrides: dict[str, Any], told: dict[str, str]) -> ModelSpec:
    if not isinstance(base.data, dict):  # an empty file, a YAML list: said as spec_from_dict says it
        return spec_from_dict(base.data, path=base.path, label=base.label)
    data = merge_fields(base.data, overrides)
    for given, other in (("mean", "std"), ("std", "mean")):
        # a flag for one of the pair must not pair silently with nothing
        if given in overrides and data.get(other) is None:
            raise ConfigError(f"--{given} is given but not --{other}, and the spec sets no {other}; give both")
    return spec_from_dict(data, path=base.path, sha256=base.sha256, embedded=base.embedded, label=base.label,
                          origin=base.origin, origins=told, found=base.found, folder=base.folder)


def _as_mapping(name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if name == "loss" and isinstance(value, str):
        return {"name": value}
    if isinstance(value, dict):
        return dict(value)
    raise ConfigError(f"--set {name}.…: field '{name}' is {value!r}, not a mapping")


def parse_set(item: str) -> tuple[str, Any]:
    """--set FIELD=VALUE (or FIELD.KEY=VALUE for kwargs, loss, checkpoint); VALUE is YAML."""
    name, sep, text = item.partition("=")
    name = name.strip()
    top, dot, sub = name.partition(".")
    if not sep or not top:
        raise ConfigError(f"--set expects FIELD=VALUE, got {item!r}")
    if top not in SPEC_FIELDS:
        raise ConfigError(f"--set {item}: unknown spec field {top!r}; allowed: {', '.join(SPEC_FIELDS)}")
    if dot and (top not in _DOTTED or not sub):
        raise ConfigError(f"--set {item}: only {', '.join(_DOTTED)} take FIELD.KEY=VALUE")
    return name, load_yaml(text, f"--set {item}", error=ConfigError)


def parse_input_size(text: str, flag: str = "--input-size") -> tuple[int, ...]:
    """S (a square RGB image: 3,S,S) or C,H,W (also CxHxW), positive integers."""
    try:
        parts = tuple(int(p) for p in text.replace("x", ",").split(","))
    except ValueError:
        parts = ()
    if len(parts) == 1:
        parts = (3, parts[0], parts[0])
    if len(parts) != 3 or min(parts) < 1:
        expected = f"{flag} expects S or C,H,W positive integers, got {text!r}"
        if len(parts) == 2 and min(parts) >= 1:
            # H,W without C, or a flat size split in two: say what each of those is written as,
            # as the data's own refusal does for flat samples against an image size
            h, w = parts
            raise ConfigError(f"{expected} (2 numbers): an image takes C,H,W (an RGB {h}×{w}: 3,{h},{w}), a lone "
                              "S means 3,S,S, and a flat input of D values takes --set 'input_size=[D]'")
        raise ConfigError(expected)
    return parts


def parse_floats(text: str, flag: str) -> tuple[float, ...]:
    """"0.5,0.5,0.5" as numbers (one per channel)."""
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise ConfigError(f"{flag} expects comma-separated numbers (one per channel), got {text!r}") from None
    return values


# ---------------------------------------------------------------- the library's weights


def library_weights(spec: ModelSpec, name: str | None = None) -> Path:
    """--pretrained: the library's weights for `spec` (or for the library's `name`, e.g. an
    hf-hub:… reference), from the local cache only."""
    if spec.source == "timm":
        found, looked = find_local_weights(name or spec.arch, None)
    elif spec.source == "torchvision":
        found, looked = find_torchvision_weights(spec.arch)
    else:
        raise ConfigError(f"--pretrained: source {spec.source} has no library weights; give a CHECKPOINT")
    if found is None:
        raise ConfigError(f"--pretrained: no local weights for {spec.source} model {spec.arch!r} (looked in "
                          f"{looked}); flatcheck never downloads: put the file there, or give a CHECKPOINT")
    return found
