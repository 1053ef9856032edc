"""`flatcheck embed-spec`: a spec written into a safetensors file's metadata, tensors untouched.

A safetensors file is an 8-byte little-endian header length, a JSON header (tensor names,
dtypes, shapes, byte offsets relative to the data, and an optional `__metadata__` map of
strings), then the tensor data. Only the header is rewritten: offsets are relative to the
data, so the data section is copied byte for byte. safetensors' own save_file would re-lay
every tensor from memory, which needs the whole model in RAM and may reorder the bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

from flatcheck.errors import ConfigError
from flatcheck.models.discover import EMBED_KEY
from flatcheck.models.header import read_header

_ALIGN = 8  # safetensors pads the header with spaces so the data starts 8-byte aligned


def check_spec_fits(spec: Any, checkpoint: Path, trust_packages: tuple[str, ...] = ()) -> None:
    """Build `spec`'s model (a ModelSpec) and load `checkpoint`'s tensors into it, as a run
    would: a spec whose model cannot hold them is refused before it is written into the file."""
    if checkpoint.suffix.lower() != ".safetensors":
        return  # embed_spec refuses it, with the way such a checkpoint carries its spec
    import sys

    from flatcheck.models.load import build_with_weights

    before = set(sys.modules)
    try:
        build_with_weights(spec, checkpoint, trust_packages, dtype=None)
    finally:
        # a module the spec's folder lent only for this check is let go: in a process that goes
        # on (a notebook), the embedded spec is later imported under its own, stricter rule
        folder = spec.path.resolve().parent if spec.path is not None else None
        for name in set(sys.modules) - before:
            file = getattr(sys.modules[name], "__file__", None)
            if folder is not None and file and Path(file).resolve().is_relative_to(folder):
                del sys.modules[name]


def embed_spec(checkpoint: Path, spec: dict[str, Any], out: Path | None = None) -> Path:
    """Write `spec` (validated spec fields) into `checkpoint`'s metadata, in place or to `out`,
    atomically: a reader sees the old file or the new one, never half of either."""
    if checkpoint.suffix.lower() != ".safetensors":
        raise ConfigError(f"embed-spec: {checkpoint} is not a .safetensors file; a .pt checkpoint can carry its "
                          f"spec as {checkpoint.with_suffix('.yaml').name} beside it")
    header, start = read_header(checkpoint)
    meta = dict(header.get("__metadata__") or {})
    meta[EMBED_KEY] = json.dumps(spec, sort_keys=True)
    header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % _ALIGN)
    target = Path(os.path.realpath(out or checkpoint))
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as dst, open(checkpoint, "rb") as src:
            dst.write(struct.pack("<Q", len(text)) + text)
            src.seek(start)
            shutil.copyfileobj(src, dst, 1 << 24)
            dst.flush()
            os.fchmod(dst.fileno(), os.stat(checkpoint).st_mode & 0o777)
            os.fsync(dst.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
