"""Writing results: atomically, so a reader never sees half a file."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    path = Path(path)
    if not path.parent.exists():
        raise ConfigError(f"cannot write {path}: folder {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dump_json(obj: Any, target: str | Path) -> None:
    """`target` "-" means stdout."""
    text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    if str(target) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text_atomic(target, text)
