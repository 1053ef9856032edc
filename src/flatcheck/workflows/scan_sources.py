"""What a scan runs over: timm models by pattern or list, or a folder of checkpoints + specs.

Pretrained weights are looked up on local disk only — a --weights-dir, the Hugging Face
cache, torch hub's checkpoint folder — and never downloaded: a scan of 181 models must not
quietly pull 50 GB, and a CI runner may have no network. A model whose weights are not on
disk becomes a `skipped` record that says where flatcheck looked.

Checkpoint folders pair `NAME.safetensors` (or .pt/.pth/.bin) with `NAME.yaml` next to it;
a `spec.yaml` in the folder serves every checkpoint without its own spec.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import ConfigError
from ..models.checkpoint import SAFETENSORS_EXTS, TORCH_EXTS

CKPT_EXTS = SAFETENSORS_EXTS + TORCH_EXTS
HF_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm's hub loader looks for
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass
class Entry:
    """One model of a scan. `spec` is built lazily so a broken spec is that model's error."""

    name: str
    origin: str  # "timm" or "checkpoint"
    make_spec: Callable[[], Any]
    describe: dict[str, Any]  # what identifies the model in the fingerprint
    checkpoint: Path | None = None
    skip_reason: str | None = None
    step: int | None = None  # where on a training trajectory (checkpoint folders only)
    epoch: int | None = None
    trajectory_from: dict[str, str] | None = None  # "step"/"epoch" → "file name" or "metadata"
    run: str | None = None  # the training run its step belongs to (the checkpoint folder)


def family(name: str) -> str:
    """Model family for colouring plots: the name before its first '_' (vit, deit3, eva02 …)."""
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
               weights_dir: Path | None) -> Entry:
    from ..models.spec import spec_from_dict

    spec_dict: dict[str, Any] = {"source": "timm", "arch": name, "kwargs": dict(kwargs)}
    if input_size is not None:
        spec_dict["input_size"] = list(input_size)
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


def hf_cache_dir() -> Path:
    """Resolved at call time from the environment (huggingface_hub fixes it at import)."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "huggingface" / "hub"


def find_local_weights(name: str, weights_dir: Path | None) -> tuple[Path | None, str]:
    looked = []
    if weights_dir is not None:
        stem = name.replace("/", "_")
        candidates = [weights_dir / f"{stem}{ext}" for ext in CKPT_EXTS]
        candidates += [weights_dir / stem / f for f in HF_FILES]
        looked.append(f"--weights-dir {weights_dir}")
        for c in candidates:
            if c.is_file():
                return c, ""
    cfg = _pretrained_cfg(name)
    repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if repo:
        cache = hf_cache_dir()
        looked.append(f"HF cache {cache} for {repo}")
        hit = _hf_cached(repo, getattr(cfg, "hf_hub_filename", None), cache)
        if hit is not None:
            return hit, ""
    url = getattr(cfg, "url", None) if cfg is not None else None
    if url:
        import torch.hub

        hub = Path(torch.hub.get_dir()) / "checkpoints"
        looked.append(f"torch hub {hub}")
        f = hub / os.path.basename(url.split("?", 1)[0])
        if f.is_file():
            return f, ""
    if cfg is None:
        looked.append("timm knows no pretrained weights for it")
    return None, "; ".join(looked) or "nowhere"


def _pretrained_cfg(name: str):
    try:
        from timm.models import get_pretrained_cfg

        return get_pretrained_cfg(name)
    except Exception:  # unknown or untagged names: no registry entry to read
        return None


def _hf_cached(repo: str, filename: str | None, cache: Path) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for fname in ([filename] if filename else []) + list(HF_FILES):
        hit = try_to_load_from_cache(repo, fname, cache_dir=cache)
        if isinstance(hit, str) and Path(hit).is_file():  # other returns mean "not cached"
            return Path(hit)
    return None


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """No library reached during the scan may go to the network for weights."""
    saved = {k: os.environ.get(k) for k in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------- checkpoint folders


def checkpoint_entries(folder: Path) -> list[Entry]:
    from ..models.spec import load_spec

    if not folder.is_dir():
        raise ConfigError(f"--checkpoints {folder}: not a folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in CKPT_EXTS)
    if not files:
        raise ConfigError(f"--checkpoints {folder}: holds no {', '.join(CKPT_EXTS)} files")
    shared = next((folder / n for n in ("spec.yaml", "spec.yml") if (folder / n).is_file()), None)
    out = []
    for ckpt in files:
        own = next((ckpt.with_suffix(s) for s in (".yaml", ".yml") if ckpt.with_suffix(s).is_file()), None)
        spec_path = own or shared
        st = ckpt.stat()
        entry = Entry(ckpt.stem, "checkpoint", (lambda p=spec_path: load_spec(p)),
                      {"checkpoint": str(ckpt.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                       "spec": str(spec_path) if spec_path else None}, checkpoint=ckpt)
        if spec_path is None:
            entry.skip_reason = f"no spec: expected {ckpt.with_suffix('.yaml').name} or spec.yaml in {folder}"
        _place(entry, ckpt)
        out.append(entry)
    return out


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
