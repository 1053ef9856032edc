"""A library's pretrained weights, from local disk only: never downloaded.

Looked up in a --weights-dir, the Hugging Face cache and torch hub's checkpoint folder. A
scan of 181 models must not quietly pull 50 GB, a CI runner may have no network, and a
number is only defensible when the report can name the file it came from: the file found
is loaded as the run's checkpoint (strictly, with its sha256), not by the library.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator

from flatcheck.models.checkpoint import SAFETENSORS_EXTS, TORCH_EXTS

CKPT_EXTS = SAFETENSORS_EXTS + TORCH_EXTS
HF_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm's hub loader looks for
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
HF_HUB = "hf-hub:"


def hf_cache_dir() -> Path:
    """Resolved at call time from the environment (huggingface_hub fixes it at import)."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path(env.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "huggingface" / "hub"


def torch_hub_checkpoints() -> Path:
    import torch.hub

    return Path(torch.hub.get_dir()) / "checkpoints"


def find_local_weights(name: str, weights_dir: Path | None) -> tuple[Path | None, str]:
    """timm model `name`'s pretrained weights on disk, or None and where it looked."""
    looked = []
    if weights_dir is not None:
        stems = _weights_dir_stems(name)
        candidates = [weights_dir / f"{stem}{ext}" for stem in stems for ext in CKPT_EXTS]
        candidates += [weights_dir / stem / f for stem in stems for f in HF_FILES]
        looked.append(f"--weights-dir {weights_dir}")
        for c in candidates:
            if c.is_file():
                return c, ""
    if name.startswith(HF_HUB):
        repo, filename = name[len(HF_HUB):].partition("@")[0], None
    else:
        cfg = _pretrained_cfg(name)
        repo = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
        filename = getattr(cfg, "hf_hub_filename", None) if cfg is not None else None
    if repo:
        cache = hf_cache_dir()
        looked.append(f"HF cache {cache} for {repo}")
        hit = hf_cached(repo, [*([filename] if filename else []), *HF_FILES], cache)
        if hit is not None:
            return hit, ""
    url = getattr(cfg, "url", None) if not name.startswith(HF_HUB) and cfg is not None else None
    if url:
        hit, where = _in_torch_hub(url)
        looked.append(where)
        if hit is not None:
            return hit, ""
    if not name.startswith(HF_HUB) and cfg is None:
        looked.append("timm knows no pretrained weights for it")
    return None, "; ".join(looked) or "nowhere"


def find_torchvision_weights(arch: str) -> tuple[Path | None, str]:
    """torchvision model `arch`'s DEFAULT weights in torch hub's folder, or None and where it looked."""
    from torchvision.models import get_model_weights

    try:
        url = get_model_weights(arch).DEFAULT.url
    except Exception:  # no weights enum for this arch
        return None, f"torchvision has no pretrained weights for {arch!r}"
    return _in_torch_hub(url)


def _in_torch_hub(url: str) -> tuple[Path | None, str]:
    hub = torch_hub_checkpoints()
    f = hub / os.path.basename(url.split("?", 1)[0])
    return (f if f.is_file() else None), f"torch hub {f}"


def _weights_dir_stems(name: str) -> list[str]:
    """The file names a --weights-dir may hold `name`'s weights under: the name as given first,
    then the same weights named the other way — `resnet50` for `resnet50.a1_in1k` and the
    reverse — only when that tag is timm's default for the architecture (the weights
    `timm.create_model("resnet50", pretrained=True)` loads); another tag's file never stands in."""
    stem = name.replace("/", "_")
    if name.startswith(HF_HUB):
        return [stem]
    arch, _, tag = name.partition(".")
    cfg = _pretrained_cfg(arch)
    default = getattr(cfg, "tag", None) if cfg is not None else None
    if not default:
        return [stem]
    if not tag:
        return [stem, f"{stem}.{default}"]
    return [stem, arch.replace("/", "_")] if tag == default else [stem]


def _pretrained_cfg(name: str):
    try:
        from timm.models import get_pretrained_cfg

        return get_pretrained_cfg(name)
    except Exception:  # unknown or untagged names: no registry entry to read
        return None


def hf_cached(repo: str, filenames: list[str], cache: Path) -> Path | None:
    """The first of `filenames` of HF repo `repo` in `cache`, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for fname in filenames:
        hit = try_to_load_from_cache(repo, fname, cache_dir=cache)
        if isinstance(hit, str) and Path(hit).is_file():  # other returns mean "not cached"
            return Path(hit)
    return None


@contextlib.contextmanager
def offline() -> Iterator[None]:
    """No library reached inside may go to the network: the environment for code that reads it
    when it runs, and huggingface_hub's flag, which it reads from the environment only once,
    at import."""
    saved = {k: os.environ.get(k) for k in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    constants = sys.modules.get("huggingface_hub.constants")
    flag = getattr(constants, "HF_HUB_OFFLINE", None)
    if constants is not None:
        constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if constants is not None:
            constants.HF_HUB_OFFLINE = flag
