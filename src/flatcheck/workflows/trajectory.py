"""Where a checkpoint sits on a training run: its step and epoch, from its safetensors metadata
or its file name, as training loops name them:

    step_000200.safetensors      → step 200          (zero-padded counters)
    model-step=1500.pt           → step 1500         (Lightning's {step} templates)
    epoch=12.pth                 → epoch 12
    epoch=3-step=1500.ckpt       → epoch 3, step 1500

A `step`/`epoch` field in the safetensors metadata (string → string, as the format stores
it) says it explicitly and wins over the name. Either lands in the scan's record (results_io
TRAJECTORY_FIELDS), and `flatcheck report --x step` plots fields along the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..models.checkpoint import SAFETENSORS_EXTS

FIELDS = ("step", "epoch")
# the word must not be the tail of another ("timestep_5" is not a step); "_", "-", "=" or
# nothing may separate it from the number
_NAME = re.compile(r"(?<![a-z])(step|epoch)[_=\-]?(\d+)(?!\d)", re.IGNORECASE)


@dataclass
class Position:
    values: dict[str, int] = field(default_factory=dict)  # "step"/"epoch" → the number
    source: dict[str, str] = field(default_factory=dict)  # "step"/"epoch" → "metadata" or "file name"
    problem: str | None = None  # a metadata value that is not an integer


def from_name(stem: str) -> dict[str, int]:
    """step/epoch in a file name; a word named twice with different numbers says neither."""
    found: dict[str, set[int]] = {}
    for word, number in _NAME.findall(stem):
        found.setdefault(word.lower(), set()).add(int(number))
    return {k: v.pop() for k, v in found.items() if len(v) == 1}


def from_metadata(path: Path) -> tuple[dict[str, int], str | None]:
    if path.suffix.lower() not in SAFETENSORS_EXTS:
        return {}, None
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
    except Exception:  # an unreadable header is the model's load error, reported when it loads
        return {}, None
    out: dict[str, int] = {}
    for key in FIELDS:
        if key in meta:
            text = str(meta[key]).strip()
            if not re.fullmatch(r"[+]?\d+", text):
                return out, f"{path.name}: safetensors metadata field {key!r} is {text!r}, expected an integer"
            out[key] = int(text)
    return out, None


def position(path: Path) -> Position:
    meta, problem = from_metadata(path)
    name = from_name(path.stem)
    pos = Position(problem=problem)
    if problem:  # the file says something unreadable about itself: no guess from the name either
        return pos
    for key in FIELDS:
        if key in meta:
            pos.values[key], pos.source[key] = meta[key], "metadata"
        elif key in name:
            pos.values[key], pos.source[key] = name[key], "file name"
    return pos
