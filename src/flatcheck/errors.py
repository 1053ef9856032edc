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


def setting(name: str) -> str:
    """A run setting (flatcheck.config.SETTINGS) named in an error message: read in code, the
    message says the setting's name (`max_memory`); the CLI says its flag (`--max-memory`)."""
    return f"{_OPEN}{name}{_CLOSE}"


def words(text: str, name_of: "Callable[[str], str] | None" = None) -> str:
    """`text` with each `setting(...)` in it said as name_of(name) (default: the name itself)."""
    head, *rest = text.split(_OPEN)
    out = [head]
    for part in rest:
        name, close, tail = part.partition(_CLOSE)
        out.append((name_of(name) if name_of is not None else name) + tail if close else _OPEN + part)
    return "".join(out)


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
