"""Error tree. Each class carries the process exit code the CLI maps it to.

Exit codes mean one thing each: 0 ok, 1 gate failed, 2 bad input, 101 internal error.
Only `InputError` and its children are the user's fault; anything else that escapes
is a bug in flatcheck and is reported as 101.
"""

from __future__ import annotations

import sys
from typing import Callable

EXIT_INTERRUPTED = 130
_told = False


def interrupted(detail: str = "") -> int:
    """Say "interrupted" on stderr, once per process, whichever layer caught the Ctrl-C (the
    command, with what the user needs to know after it, or the entry point around it);
    returns the exit code that goes with it."""
    global _told
    if not _told:
        _told = True
        sys.stderr.write(f"interrupted{'; ' + detail if detail else ''}\n")
        sys.stderr.flush()
    return EXIT_INTERRUPTED


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ("" when it has none), for one-line reports."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


class StdoutClosed(Exception):
    """stdout's reader went away (`flatcheck … | head`). Not an OSError, so that click, which
    turns a broken pipe into exit 1 ("gate failed" here), lets it through to the entry point."""


# brackets around a run setting's name inside a message (see `setting`): characters no path,
# value or name a message quotes is expected to hold
_OPEN, _CLOSE = "\u2983", "\u2984"
_SEP = "\u2985"  # between a setting's name, its value and the CLI's words for both


def setting(name: str, value: object = None, *, flag: str | None = None) -> str:
    """A run setting (flatcheck.config.SETTINGS) or probe option named in a message: read in
    code, the message says the setting's name (`max_memory`); the CLI says its flag
    (`--max-memory`). With a `value`, code reads `name=value` and the CLI `FLAG value`, or
    `flag` where the command line says it otherwise (a switch: `parts=False` is `--no-layers`)."""
    if value is None:
        return f"{_OPEN}{name}{_CLOSE}"
    return f"{_OPEN}{name}{_SEP}{value}{_SEP}{flag or ''}{_CLOSE}"


def words(text: str, name_of: "Callable[[str], str] | None" = None) -> str:
    """`text` with each `setting(...)` in it said as name_of(name) (default: the name itself)."""
    head, *rest = text.split(_OPEN)
    out = [head]
    for part in rest:
        name, close, tail = part.partition(_CLOSE)
        out.append(_said(name, name_of) + tail if close else _OPEN + part)
    return "".join(out)


def _said(marked: str, name_of: "Callable[[str], str] | None") -> str:
    name, sep, rest = marked.partition(_SEP)
    if not sep:
        return name_of(name) if name_of is not None else name
    value, _, flag = rest.partition(_SEP)
    if name_of is None:
        return f"{name}={value}"
    return flag or f"{name_of(name)} {value}"


class FlatcheckError(Exception):
    """Base class. Message is a single line shown to the user as-is; the settings it names
    (`setting`) read as their names, or as the CLI's flags through `worded`."""

    exit_code: int = 101

    def __str__(self) -> str:
        return words(super().__str__())

    def worded(self, name_of: Callable[[str], str]) -> str:
        """The message with the settings it names said by `name_of` (the CLI: as flags)."""
        return words(super().__str__(), name_of)


class InputError(FlatcheckError):
    """Bad input from the user: a file, a field, a flag. Exit code 2."""

    exit_code = 2


class SpecError(InputError):
    """A model spec (YAML) is malformed: names the file, the field and what is allowed."""


class CheckpointError(InputError):
    """A checkpoint cannot be read safely or does not fit the model."""


class DataError(InputError):
    """A data set is missing, malformed, or not deterministic."""


class ConfigError(InputError):
    """A command-line option or run configuration is invalid."""


class ModelError(InputError):
    """The model cannot give what a probe needs, e.g. an op torch cannot differentiate twice."""


class InternalError(FlatcheckError):
    """An invariant of flatcheck itself was violated. Exit code 101."""

    exit_code = 101
