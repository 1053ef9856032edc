"""What a scan runs over: timm models by pattern or list, or a folder of checkpoints + specs.

Pretrained weights are looked up on local disk only — a --weights-dir, the Hugging Face
cache, torch hub's checkpoint folder — and never downloaded: a scan of 181 models must not
quietly pull 50 GB, and a CI runner may have no network. A model whose weights are not on
disk becomes a `skipped` record that says where flatcheck looked.

Checkpoint folders pair `NAME.safetensors` (or .pt/.pth/.bin) with `NAME.yaml` next to it;
a `spec.yaml` in the folder serves every checkpoint without its own spec; a spec embedded in a
checkpoint or a timm config.json beside it count too (models.discover, as for one checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, SpecError
# the local-only lookup of pretrained weights is the one `flatcheck trace --pretrained` uses
from ..models.pretrained import CKPT_EXTS, find_local_weights, offline  # noqa: F401 - offline: scan.py
from ..models.sources import check_known_arch


@dataclass
class Entry:
    """One model of a scan. `spec` is built lazily so a broken spec is that model's error."""

    name: str
    origin: str  # "timm", "model" (--model REF) or "checkpoint"
    make_spec: Callable[[], Any]
    describe: dict[str, Any]  # what identifies the model in the fingerprint
    checkpoint: Path | None = None
    skip_reason: str | None = None
    step: int | None = None  # where on a training trajectory (checkpoint folders only)
    epoch: int | None = None
    trajectory_from: dict[str, str] | None = None  # "step"/"epoch" → "file name" or "metadata"
    run: str | None = None  # the training run its step belongs to (the checkpoint folder)


def family(name: str) -> str:
    """Model family for colouring plots: the name before its first '_' (vit, deit3, eva02 …);
    a --model reference's source (timm:, torchvision:, hf-hub:timm/) is not part of it."""
    name = name.rsplit("/", 1)[-1].rsplit(":", 1)[-1] if ":" in name else name
    base = name.split(".", 1)[0]
    return base.split("_", 1)[0] if "_" in base else base.rstrip("0123456789") or base


# ---------------------------------------------------------------- timm


def timm_names(pattern: str, pretrained: bool) -> list[str]:
    import timm

    names = list(timm.list_models(pattern, pretrained=pretrained))
    if not names:
        hint = " with pretrained weights" if pretrained else ""
        raise ConfigError(f"--timm {pattern!r}: no timm {timm.__version__} model matches{hint}")
    return names


def names_from_file(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"--models-file {path}: cannot read ({exc.strerror or exc})") from None
    names = [ln.split("#", 1)[0].strip() for ln in lines]
    names = [n for n in names if n]
    if not names:
        raise ConfigError(f"--models-file {path}: lists no models (one timm name per line, # comments)")
    return names


def timm_entry(name: str, *, pretrained: bool, kwargs: dict[str, Any], input_size: tuple[int, ...] | None,
               weights_dir: Path | None, fields: dict[str, Any] | None = None) -> Entry:
    """`fields`: spec fields the shared flags set (--num-classes, --mean, --std, --set), on top."""
    from ..models.resolve import merge_fields
    from ..models.spec import spec_from_dict

    spec_dict: dict[str, Any] = {"source": "timm", "arch": name, "kwargs": dict(kwargs)}
    if input_size is not None:
        spec_dict["input_size"] = list(input_size)
    spec_dict = merge_fields(spec_dict, fields or {})
    # label error messages with the model's name rather than "model spec"
    entry = Entry(name, "timm", lambda: spec_from_dict(spec_dict, path=Path(f"timm:{name}")),
                  {"spec": spec_dict, "pretrained": pretrained})
    if pretrained:
        found, looked = find_local_weights(name, weights_dir)
        if found is None:
            entry.skip_reason = f"no local pretrained weights (looked in {looked}); flatcheck never downloads"
        else:
            entry.checkpoint = found
            entry.describe["weights"] = {"path": str(found), "bytes": found.stat().st_size}
    return entry


def model_entry(ref: str, request: Any) -> Entry:
    """--model REF (timm:NAME, torchvision:NAME, python:MODULE:FUNCTION), resolved as every
    command resolves it (models.resolve): a reference that cannot be read is the user's error, up
    front; missing local pretrained weights skip the model."""
    from dataclasses import replace

    from ..models.resolve import describe, flag_fields, resolve

    req = replace(request, model=ref)
    spec = describe(req)
    # a name typed with --model that the library lacks is a typo, told before the scan starts
    # (a --models-file or --timm list records such a model as an error and goes on)
    try:
        check_known_arch(spec)
    except SpecError as exc:
        said = str(exc)
        raise ConfigError(f"--model {ref}: {said[said.find('unknown'):]}") from None
    entry = Entry(ref, "model", lambda: spec,
                  {"model": ref, "fields": flag_fields(req), "pretrained": req.pretrained})
    if req.pretrained:
        try:
            found = resolve(req).checkpoint
        except ConfigError as exc:
            entry.skip_reason = str(exc)
        else:
            entry.checkpoint = found
            entry.describe["weights"] = {"path": str(found), "bytes": found.stat().st_size}
    return entry


# ---------------------------------------------------------------- the data


def split_size(data: str, root: Path | None, split: str, seed: int) -> tuple[int, str]:
    """How many samples the scan's data gives in its split, and the data's name as errors say
    it: read once in the parent, so that a --samples larger than the data is one refusal before
    any model runs rather than an error record of each. The count is the model's neither way:
    a model's preprocessing and class count change its samples, not how many there are."""
    from ..data.registry import create_dataset

    dataset = create_dataset(data, root=root, split=split, seed=seed)
    return len(dataset), dataset.name


# ---------------------------------------------------------------- checkpoint folders


def checkpoint_entries(folder: Path) -> list[Entry]:
    from ..models.discover import find_spec, nothing_found

    if not folder.is_dir():
        raise ConfigError(f"--checkpoints {folder}: not a folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in CKPT_EXTS)
    if not files:
        raise ConfigError(f"--checkpoints {folder}: holds no {', '.join(CKPT_EXTS)} files")
    out = []
    for ckpt in files:
        # what `flatcheck trace CKPT` reads: STEM.yaml, an embedded spec, spec.yaml, config.json
        found = find_spec(ckpt)
        st = ckpt.stat()
        label = None if found is None else str(found.path) if found.kind == "spec file" else found.origin
        entry = Entry(ckpt.stem, "checkpoint", (lambda f=found: f.load()),
                      {"checkpoint": str(ckpt.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                       "spec": label}, checkpoint=ckpt)
        if found is None:
            entry.skip_reason = in_scan_words(f"no spec: {nothing_found(ckpt)}", ckpt)
        _place(entry, ckpt)
        out.append(entry)
    return out


def shared_refusal(entries: list[Entry], trust_packages: tuple[str, ...] | list[str] | None) -> str | None:
    """The one refusal every model of the scan would meet, said before any runs: one spec file
    serves them all (a folder's spec.yaml) and reading it, or the trust its python module
    needs (--trust-package), fails. Both are decided by the file and the flags alone, so each
    model's record would say the same thing. What can differ by model (its weights, its build,
    a head its spec names) stays a record of that model's, so one bad model never ends a scan."""
    from ..models.sources import ImportPolicy

    runnable = [e for e in entries if e.skip_reason is None]
    if not runnable or any(e.origin != "checkpoint" for e in runnable):
        return None
    if len({e.describe.get("spec") for e in runnable}) != 1:
        return None
    first = runnable[0]
    try:
        spec = first.make_spec()
        if spec.source == "python" and ":" in spec.arch:
            # the check that refuses the import, made without importing (sources.ImportPolicy)
            ImportPolicy.of(spec, tuple(trust_packages or ())).check_module_name(spec.arch.partition(":")[0])
    except SpecError as exc:
        n = len(runnable)
        every = "the one model" if n == 1 else f"all {n} models"
        return f"{in_scan_words(str(exc), first.checkpoint)} (the spec of {every} of the scan; none was run)"
    return None


def _place(entry: Entry, ckpt: Path) -> None:
    """The checkpoint's step/epoch on its training run (trajectory.position)."""
    from .trajectory import position

    pos = position(ckpt)
    entry.step, entry.epoch = pos.values.get("step"), pos.values.get("epoch")
    entry.trajectory_from = pos.source or None
    entry.run = ckpt.parent.name if pos.values else None
    if pos.problem and not entry.skip_reason:
        entry.skip_reason = pos.problem


def parse_kwargs(items: list[str]) -> dict[str, Any]:
    """["img_size=64", "drop_rate=0.1"] → typed values (YAML scalars)."""
    from ..models.yamlfile import load_yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--model-kwargs expects KEY=VALUE, got {item!r}")
        out[key.strip()] = load_yaml(value, f"--model-kwargs {item!r}", error=ConfigError)
    return out


# a spec's loader advises the flags of a one-model command; a scan has no --spec or --model
# and names a checkpoint's spec by the file beside it (checkpoint_entries)
_ONE_MODEL_HINTS = ((", not given with --spec,", ""), (", or name the spec with --spec", ""),
                    ("give one of: --spec SPEC or --model REF; ", "give one of: "))


def in_scan_words(text: str, checkpoint: Path | None) -> str:
    """A model's error as a scan user can act on it: the remedies a one-model command's flags
    would be become the scan's own (--trust-package, or the spec file beside the checkpoint)."""
    for said, meant in _ONE_MODEL_HINTS:
        text = text.replace(said, meant)
    if checkpoint is not None:
        text = text.replace("(--spec or --model chooses another)",
                            f"(a {checkpoint.stem}.yaml beside the checkpoint chooses another)")
    return text
