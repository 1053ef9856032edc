"""Writing results: atomically, so a reader never sees half a file.

A new file is written beside the target and renamed over it. The rename would otherwise
change two things the user set up: the file's mode (mkstemp makes 0o600) and a symlink
(the rename replaces the link itself). So the target is the link's resolved path, and the
temporary file takes the old file's mode (a new file: 0o666 less the umask, like open()).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import ConfigError


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    real = _real_target(path)
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


def _real_target(path: str | Path) -> Path:
    """The file a write to `path` lands in (a symlink's target: the link stays), refused as a
    ConfigError when its folder is gone: the message write_or_rescue passes on as its reason."""
    real = Path(os.path.realpath(path))
    if not real.parent.exists():
        raise ConfigError(f"cannot write {path}: folder {real.parent} does not exist")
    return real


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


def check_distinct_files(files: Sequence[tuple[str, str | Path, bool | str]], *, kinds: bool = True) -> None:
    """Refuse, before any work, an output that is one of the run's inputs or another output:
    the run would destroy its own input, or one output would replace the other; and (kinds) an
    output path holding a file of another kind than the output (check_output_kind). A command
    that learns more of its inputs later leaves the kinds to check_outputs_spare, which first
    names the input an output would overwrite.

    files: (flag, path, writes) for every file the command reads or writes; `writes` is False
    for an input, and for an output True or the kind it writes (OUTPUT_KINDS; True: the flag's)."""
    for i, (flag, path, writes) in enumerate(files):
        for other_flag, other, other_writes in files[i + 1:]:
            if (writes or other_writes) and same_file(path, other):
                raise ConfigError(_clash(flag, path, bool(writes), other_flag, other, bool(other_writes)))
    for flag, path, writes in files if kinds else ():
        if writes and str(path) != "-":
            check_output_kind(flag, path, writes if isinstance(writes, str) else _FLAG_KINDS.get(flag))


# what an output flag writes when its command does not say; "text" is appended to (--summary)
_FLAG_KINDS = {"--json": "json", "--csv": "csv", "--plot": "figure", "--summary": "text"}
OUTPUT_KINDS = ("json", "csv", "figure", "text", "scan", "spec", "checkpoint")
# what each kind of output may replace besides its own kind (an empty file: anything)
_MAY_REPLACE = {"text": ("text", "csv"), "figure": ("figure", "image")}
_KIND_NAMES = {"checkpoint": "a checkpoint", "pickle": "a pickle (a checkpoint or a data batch)",
               "data": "a data file (npz/npy)", "figure": "an image (PNG/PDF/SVG)", "image": "an image",
               "json": "a JSON file", "scan": "a scan's JSONL records", "spec": "a model spec",
               "gates": "a gates file", "csv": "a CSV table", "text": "a text file", "binary": "a binary file"}
_SNIFF_BYTES = 1 << 24  # whole files are parsed up to this size; a larger one by its first line


def check_output_kind(flag: str, path: str | Path, kind: str | None) -> None:
    """Refuse an output path that holds a file of another kind than `kind` (a checkpoint, data,
    a spec, a scan where a CSV goes): writing would destroy it. The command's own earlier
    output of the same kind may be rewritten. kind None: an output of no set kind, which may
    replace anything but an input of a run (a checkpoint, data, a spec, a scan)."""
    real = Path(os.path.realpath(os.path.expanduser(path)))
    if not real.is_file():
        return
    found = sniff_kind(real)
    if found == "empty" or found == kind or found in _MAY_REPLACE.get(kind or "", ()):
        return
    if kind is None and found not in ("checkpoint", "pickle", "data", "spec", "scan", "gates"):
        return
    what = _KIND_NAMES.get(kind or "", "its output")
    raise ConfigError(f"{flag} {path} holds {_KIND_NAMES[found]}, not {what}: writing {flag} would destroy it; "
                      f"give {flag} another path (or remove the file)")


def sniff_kind(path: Path) -> str:
    """What an existing file holds, from its bytes (not its name): 'empty', 'checkpoint'
    (safetensors, a torch zip), 'pickle', 'data' (npz/npy), 'figure' (PNG/PDF/SVG), 'image',
    'json', 'scan' (JSON lines), 'spec', 'gates', 'csv', 'text' or 'binary'."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError:
        return "binary"
    if not head:
        return "empty"
    binary = _binary_kind(head, path)
    if binary is not None:
        return binary
    try:
        text = head.decode("utf-8") if len(head) < _SNIFF_BYTES else head.decode("utf-8", errors="ignore")
    except UnicodeDecodeError:
        return "binary"
    return _text_kind(text)


def _binary_kind(head: bytes, path: Path) -> str | None:
    import struct
    import zipfile

    if head.startswith(b"\x89PNG\r\n\x1a\n") or head.startswith(b"%PDF"):
        return "figure"
    if head[:3] == b"\xff\xd8\xff" or head[:4] in (b"GIF8", b"II*\x00", b"MM\x00*") or head[:2] == b"BM":
        return "image"
    if head.startswith(b"\x93NUMPY"):
        return "data"
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (OSError, zipfile.BadZipFile):
            return "binary"
        if any(n.endswith("data.pkl") for n in names):
            return "checkpoint"
        return "data" if names and all(n.endswith(".npy") for n in names) else "binary"
    if len(head) > 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < len(head) + (1 << 30):
        return "checkpoint"  # safetensors: an 8-byte header length, then the JSON header
    if head[:1] == b"\x80" and head[1:2] in b"\x02\x03\x04\x05":
        return "pickle"
    if b"\x00" in head[:8192]:
        return "binary"
    return None


def _text_kind(text: str) -> str:
    stripped = text.strip()
    if stripped.startswith("<svg") or stripped.startswith("<?xml"):
        return "figure"
    if stripped[:1] in ("{", "["):
        try:
            whole = json.loads(stripped)
        except ValueError:
            whole = None
        if isinstance(whole, dict) and not _scan_record(whole):
            return "json"
        if isinstance(whole, list):
            return "json"
        first = stripped.splitlines()[0]
        try:
            return "scan" if isinstance(json.loads(first), dict) else "text"
        except ValueError:  # an indented JSON document larger than what was read opens with a bare brace
            return "json" if first.strip() in ("{", "[") else "text"
    try:
        import yaml

        data = yaml.safe_load(text)
    except Exception:  # any YAML failure: not YAML, so plain text
        data = None
    if isinstance(data, dict):
        if {"source", "arch"} & set(data):
            return "spec"
        if {"rules", "probes"} & set(data):
            return "gates"
    lines = stripped.splitlines()
    if "," in lines[0] and all(line.count(",") >= lines[0].count(",") for line in lines[1:6]):
        return "csv"
    return "text"


def _scan_record(obj: dict) -> bool:
    return "status" in obj and ("model" in obj or "name" in obj)


def check_outputs_spare(outputs: Sequence[tuple[str, str | Path]], inputs: Sequence[tuple[str, Path]],
                        reads: Sequence[str] = ()) -> None:
    """Refuse an output that is an input found after the command line was read (`what`, a file),
    or, inside an input folder, a file there already or one with a suffix in `reads` (an image
    the data set would read as a sample next time): the run would change what it reads. Then
    an output over a file of another kind (check_output_kind)."""
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
    for flag, path in outputs:
        if str(path) != "-":
            check_output_kind(flag, path, _FLAG_KINDS.get(flag))


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


def dump_json(obj: Any, target: str | Path, flag: str = "--json") -> None:
    """`target` "-" means stdout. A file that cannot be written after the run (its folder
    removed meanwhile, a full disk) is written elsewhere (write_or_rescue): the run is not lost."""
    text = json.dumps(obj, indent=2, allow_nan=False) + "\n"
    if str(target) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_or_rescue(target, text, flag)


class OutputRescued(ConfigError):
    """The output of `flag` not written at its path; `spare` is where it went instead (None: nowhere)."""

    def __init__(self, message: str, flag: str, spare: str | None):
        super().__init__(message)
        self.flag, self.spare = flag, spare


# the rescues of the command running now (rescued_outputs), None outside one
_RESCUES: contextvars.ContextVar[list[OutputRescued] | None] = contextvars.ContextVar("rescues", default=None)


@contextlib.contextmanager
def rescued_outputs() -> Iterator[list[OutputRescued]]:
    """Within it an output that write_or_rescue could not write at its path is noted, not
    raised: the command writes its other outputs and shows its results first, then says where
    each rescued output went (lost_outputs_error). Outside it (a library call) the rescue raises."""
    token = _RESCUES.set([])
    try:
        yield _RESCUES.get()
    finally:
        _RESCUES.reset(token)


def lost_outputs_error(rescued: Sequence[OutputRescued], verdict: int | None = None) -> ConfigError:
    """The one error line after a run whose outputs were not all written where asked: each one
    and where it is now. Exit 2 whatever the verdict: the steps after a CI job's gate read its
    outputs at their paths (a JUnit upload, the next --baseline), and a 0 would let them go on
    without; the verdict itself is on stdout and in the rescued files."""
    said = "; ".join(str(r) for r in rescued)
    where = "the results above and the rescued files are complete" if all(r.spare for r in rescued) \
        else "the results above are complete"
    own = f" (the verdict's own exit code: {verdict})" if verdict is not None else ""
    return ConfigError(f"{said}; exit 2 as {len(rescued)} output(s) not at the path given{own}: {where}")


def write_or_rescue(target: str | Path, data: str | bytes, flag: str, *, append: bool = False) -> str | None:
    """Write `data` to `target` atomically (append: at its end, as $GITHUB_STEP_SUMMARY is
    shared by a job's steps); if that fails, write it beside the target (or in the temporary
    folder, or the working directory), so that a run's result outlives a path that went bad
    while it ran. Returns where it went instead (None: at `target`); the rescue is raised as
    an OutputRescued naming both, or noted where rescued_outputs is open."""
    blob = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if append:
            _real_target(target)
            with open(target, "ab") as fh:
                fh.write(blob)
        else:
            write_bytes_atomic(target, blob)
        return None
    except (OSError, ConfigError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        why = why.removeprefix(f"cannot write {target}: ")
    spare = write_spare(target, blob)
    if spare is not None:
        rescue = OutputRescued(f"{flag} {target}: cannot write ({why}); the output is in {spare} instead", flag, spare)
    else:
        rescue = OutputRescued(f"{flag} {target}: cannot write ({why}), nor anywhere else (the temporary folder, "
                               "the working directory)", flag, None)
    noted = _RESCUES.get()
    if noted is None:
        raise rescue
    noted.append(rescue)
    return spare


def write_spare(target: str | Path, blob: bytes) -> str | None:
    """Write `blob` to a new file named after `target`: beside it, else in the temporary folder,
    else in the working directory; its path, or None when none of them takes it."""
    name = Path(target).name or "output"
    for folder in (Path(os.path.realpath(target)).parent, Path(tempfile.gettempdir()), Path.cwd()):
        try:
            fd, spare = tempfile.mkstemp(prefix=f"flatcheck-{Path(name).stem}-", suffix=Path(name).suffix or ".txt",
                                         dir=folder)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(blob)
            return spare
        except OSError:
            Path(spare).unlink(missing_ok=True)
    return None
