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
from typing import Any, Sequence

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


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: the same resolved path (symlinks, `..`, a file not yet
    written) or, both existing, the same inode (hard links, a case-insensitive file system)."""
    a, b = os.path.expanduser(a), os.path.expanduser(b)
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def check_distinct_files(files: Sequence[tuple[str, str | Path, bool]]) -> None:
    """Refuse, before any work, an output that is one of the run's inputs or another output:
    the run would destroy its own input, or one output would replace the other.

    files: (flag, path, writes) for every file the command reads or writes."""
    for i, (flag, path, writes) in enumerate(files):
        for other_flag, other, other_writes in files[i + 1:]:
            if (writes or other_writes) and same_file(path, other):
                raise ConfigError(_clash(flag, path, writes, other_flag, other, other_writes))


def check_outputs_spare(outputs: Sequence[tuple[str, str | Path]], inputs: Sequence[tuple[str, Path]],
                        reads: Sequence[str] = ()) -> None:
    """Refuse an output that is an input found after the command line was read (`what`, a file),
    or, inside an input folder, a file there already or one with a suffix in `reads` (an image
    the data set would read as a sample next time): the run would change what it reads."""
    for flag, path in outputs:
        target = Path(os.path.realpath(os.path.expanduser(path)))
        for what, source in inputs:
            real = Path(os.path.realpath(source))
            if real.is_dir() and target.is_relative_to(real) and (
                    target.exists() or target.name.lower().endswith(tuple(reads))):
                raise ConfigError(f"{flag} {path} lies inside {what}: writing it there would change an input of the "
                                  f"run; give {flag} another path")
            if not real.is_dir() and same_file(path, source):
                raise ConfigError(f"{flag} {path} is {what}: writing {flag} would overwrite an input of the run; "
                                  f"give {flag} another path")


def _clash(flag: str, path: str | Path, writes: bool, other_flag: str, other: str | Path, other_writes: bool) -> str:
    both = f"{flag} {path} and {other_flag} {other} are the same file"
    if writes and other_writes:
        return f"{both}: one output would replace the other; give each its own path"
    output = flag if writes else other_flag
    return f"{both}: writing {output} would overwrite an input of the run; give {output} another path"


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
