"""What a checkpoint says it is, when no --spec or --model is given.

Four places, first found wins: `<stem>.yaml` beside the checkpoint (the user's own file for
this checkpoint, so it can correct anything else), a spec embedded in the safetensors
metadata (`flatcheck embed-spec`), a `spec.yaml` in its folder (shared by every checkpoint
there), a timm `config.json` beside it (what timm's push_to_hub writes). `flatcheck trace`
and `flatcheck scan --checkpoints` both ask here.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flatcheck.errors import SpecError
from flatcheck.models.spec import ModelSpec, read_spec_file, spec_from_dict

EMBED_KEY = "flatcheck.spec"  # safetensors __metadata__ key holding the spec as JSON
WAYS = ("--spec SPEC or --model REF", "a spec embedded in it (flatcheck embed-spec CKPT --spec SPEC)",
        "STEM.yaml or spec.yaml beside it", "a timm config.json beside it")


@dataclass(frozen=True)
class Found:
    """One place a checkpoint's spec was found."""

    kind: str  # "spec file" | "embedded" | "config.json"
    path: Path  # the YAML, the checkpoint (embedded) or the config.json

    @property
    def origin(self) -> str:
        return {"embedded": f"embedded in {self.path}", "config.json": f"config.json {self.path}"}.get(
            self.kind, f"spec file {self.path}")

    @property
    def how(self) -> str:
        """Which spec this is and how it was found, for a message about the model it builds."""
        ckpt = "the checkpoint"
        if self.kind == "embedded":
            return f"the spec embedded in {self.path} (by flatcheck embed-spec)"
        if self.kind == "config.json":
            return f"{self.path}, the timm config found beside {ckpt}"
        if self.path.stem in ("spec",):
            return f"{self.path}, the spec found in {ckpt}'s folder"
        return f"{self.path}, the spec found beside {ckpt}"

    @property
    def label(self) -> str | None:
        kinds = {"embedded": "embedded spec", "config.json": "config.json"}
        return f"{self.path} ({kinds[self.kind]})" if self.kind in kinds else None

    def read(self) -> tuple[dict[str, Any], str]:
        """The spec's fields as found, and the sha256 of what they were read from."""
        if self.kind == "embedded":
            data = embedded_spec(self.path)
            return data, hashlib.sha256(_canonical(data)).hexdigest()
        if self.kind == "config.json":
            raw = _read(self.path)
            return spec_from_timm_config(_json(raw, self.path), self.path), hashlib.sha256(raw).hexdigest()
        return read_spec_file(self.path)

    def load(self) -> ModelSpec:
        data, sha256 = self.read()
        return spec_from_dict(data, path=self.path, origin=self.origin, embedded=self.kind == "embedded",
                              sha256=sha256, label=self.label, found=self.how)


def find_spec(checkpoint: Path) -> Found | None:
    """Where `checkpoint`'s spec is, in the order of the module docstring; None: nowhere."""
    folder = checkpoint.parent
    for path in (checkpoint.with_suffix(".yaml"), checkpoint.with_suffix(".yml")):
        if path.is_file() and path != checkpoint:
            return Found("spec file", path)
    if embedded_spec(checkpoint) is not None:
        return Found("embedded", checkpoint)
    for name in ("spec.yaml", "spec.yml"):
        if (folder / name).is_file():
            return Found("spec file", folder / name)
    if (folder / "config.json").is_file():
        return Found("config.json", folder / "config.json")
    return None


# a run given a model (--model, --spec) but no weights: said by resolve, and by the entry point
# from the command line alone, before torch is imported
NO_WEIGHTS = ("no weights: give a CHECKPOINT, or --pretrained (the library's weights, from the local cache) "
              "or --random-init")


def nothing_found(checkpoint: Path) -> str:
    """The one line for a checkpoint that says nothing about its model."""
    hint = _shape_hint(checkpoint)
    return (f"{checkpoint} does not say which model it holds; give one of: {WAYS[0]}; {WAYS[1]}; "
            f"{checkpoint.with_suffix('.yaml').name} or spec.yaml beside it; {WAYS[3]}" + (f" ({hint})" if hint else ""))


# torchvision ResNets by their blocks per stage, and whether a block has a third conv (bottleneck)
_TV_RESNETS = {((2, 2, 2, 2), False): "resnet18", ((3, 4, 6, 3), False): "resnet34",
               ((3, 4, 6, 3), True): "resnet50", ((3, 4, 23, 3), True): "resnet101",
               ((3, 8, 36, 3), True): "resnet152"}
TV_RESNET18_SPEC = "model_specs/resnet18_torchvision_cifar10.yaml"


def _shape_hint(checkpoint: Path) -> str | None:
    """What a bare state dict's keys say it is, when they are a torchvision ResNet's."""
    shapes = _shapes(checkpoint)
    if shapes is None:
        return None
    blocks: dict[int, set[int]] = {}
    for key in shapes:
        m = re.match(r"layer([1-4])\.(\d+)\.", key)
        if m:
            blocks.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    fc = shapes.get("fc.weight")
    if sorted(blocks) != [1, 2, 3, 4] or "conv1.weight" not in shapes or fc is None or len(fc) != 2:
        return None
    arch = _TV_RESNETS.get((tuple(len(blocks[i]) for i in (1, 2, 3, 4)), "layer1.0.conv3.weight" in shapes))
    if arch is None:
        return None
    classes = int(fc[0])
    hint = f"its keys are torchvision's {arch} with a {classes}-class fc: --model torchvision:{arch} --num-classes {classes}"
    if arch == "resnet18" and classes == 10:
        hint += f", or --spec {TV_RESNET18_SPEC} from flatcheck's source tree (CIFAR-10 at 32×32)"
    return hint


def embedded_spec(checkpoint: Path) -> dict[str, Any] | None:
    """The spec in a safetensors file's metadata, or None (another format, or none there)."""
    if checkpoint.suffix.lower() != ".safetensors" or not checkpoint.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(checkpoint), framework="pt") as fh:
            text = (fh.metadata() or {}).get(EMBED_KEY)
    except Exception:  # not readable as safetensors: load_checkpoint says so with its own line
        return None
    return None if text is None else _json(text.encode("utf-8"), Path(f"{checkpoint} metadata {EMBED_KEY}"))


def spec_from_timm_config(cfg: Any, where: Path) -> dict[str, Any]:
    """Spec fields from a timm config.json (`architecture`, `num_classes`, `model_args`,
    `pretrained_cfg`'s input size and normalisation); a transformers config.json is refused,
    since flatcheck builds transformers models only through a python spec."""
    if not isinstance(cfg, dict):
        raise SpecError(f"{where}: not a timm config.json (a JSON object was expected)")
    arch = cfg.get("architecture")
    if not isinstance(arch, str) or not arch:
        if "architectures" in cfg or "model_type" in cfg:
            raise SpecError(f"{where}: a transformers config.json ({', '.join(map(str, cfg.get('architectures') or [cfg.get('model_type')]))}); "
                            f"flatcheck builds timm models from config.json, other models from a python spec (--spec)")
        raise SpecError(f"{where}: field 'architecture' (the timm model name) is missing")
    data: dict[str, Any] = {"source": "timm", "arch": arch}
    args = {k: v for k, v in (cfg.get("model_args") or {}).items() if k not in ("num_classes", "pretrained")}
    if args:
        data["kwargs"] = args
    if cfg.get("num_classes") is not None:
        data["num_classes"] = cfg["num_classes"]
    pre = cfg.get("pretrained_cfg") or {}
    for name in ("input_size", "mean", "std"):
        if pre.get(name) is not None:
            data[name] = list(pre[name])
    return data


_HINT_LOAD_BYTES = 1 << 30  # a pickled checkpoint is unpickled for a hint only up to this size


def _shapes(checkpoint: Path) -> dict[str, list[int]] | None:
    """Each tensor's shape by key: from a safetensors header (no tensor read), else from the
    loaded state dict of a file small enough to load for a hint; None: unreadable or too big."""
    try:
        if checkpoint.suffix.lower() == ".safetensors":
            from flatcheck.models.header import read_header

            header, _ = read_header(checkpoint)
            return {k: list(v.get("shape", [])) for k, v in header.items() if isinstance(v, dict)}
        if checkpoint.stat().st_size > _HINT_LOAD_BYTES:
            return None
        from flatcheck.models.checkpoint import load_checkpoint

        return {k: list(v.shape) for k, v in load_checkpoint(checkpoint).state_dict.items()}
    except Exception:  # unreadable: the run's own load says why, with its own line
        return None


def _json(raw: bytes, where: Path) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpecError(f"{where}: not valid JSON ({exc})") from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")
