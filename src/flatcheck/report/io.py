"""Writing results: atomically, so a reader never sees half a file.

A new file is written beside the target and renamed over it. The rename would otherwise
change two things the user set up: the file's mode (mkstemp makes 0o600) and a symlink
(the rename replaces the link itself). So the target is the link's resolved path, and the
temporary file takes the old file's mode (a new file: 0o666 less the umask, like open()).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    real = Path(os.path.realpath(path))  # a symlink's target is written; the link stays
    if not real.parent.exists():
        raise ConfigError(f"cannot write {path}: folder {real.parent} does not exist")
    mode = _mode_for(real)
    fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: str | Path, flag: str) -> None:
    """Refuse an output path that write_bytes_atomic could not write, before any work is done.

    Tried for real (a temporary file in the folder) rather than inferred from mode bits:
    root ignores them, and a read-only mount or a full quota only shows when writing."""
    given = Path(path)
    real = Path(os.path.realpath(given))
    if real.is_dir():
        raise ConfigError(f"{flag} {given}: is a folder; give a file path")
    if not real.parent.is_dir():
        what = "is not a folder" if real.parent.exists() else "does not exist"
        raise ConfigError(f"{flag} {given}: {real.parent} {what}")
    if real.exists() and not os.access(real, os.W_OK):
        raise ConfigError(f"{flag} {given}: the file is read-only; make it writable or give another path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".probe", dir=real.parent)
    except OSError as exc:
        raise ConfigError(f"{flag} {given}: cannot write in folder {real.parent} "
                          f"({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(tmp)


def _mode_for(real: Path) -> int:
    try:
        return stat.S_IMODE(real.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def dump_json(obj: Any, target: str | Path) -> None:
    """`target` "-" means stdout."""
    text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    if str(target) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_text_atomic(target, text)
