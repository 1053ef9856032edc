"""A safetensors file's JSON header, read without torch and without reading a tensor."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from flatcheck.errors import CheckpointError

_MAX_HEADER = 100_000_000  # safetensors' own limit


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The parsed JSON header and the byte offset where the data starts."""
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > _MAX_HEADER:
                raise ValueError(f"header of {n} bytes")
            header = json.loads(fh.read(n))
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"not a valid safetensors file: {path} ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"not a valid safetensors file: {path} (header is not a JSON object)")
    return header, 8 + n
