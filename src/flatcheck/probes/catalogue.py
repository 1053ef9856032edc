"""What the CLI says about the probes without importing them (and torch): each probe's help
lines and its options as `flatcheck explain` lists them, read from the probe classes and
their Options and stored in catalogue.json beside this module.

The stored copy is used only while the probe modules are the ones it was read from (a hash
of their sources). Otherwise the CLI reads the probes themselves once and keeps what it read
in the user's cache ($XDG_CACHE_HOME/flatcheck), under that hash, for the next command.
Regenerate the shipped copy with `python -m flatcheck.probes.catalogue` after changing a
probe's help or options; tests/commands/test_front_door.py checks that it is current.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STORED = HERE / "catalogue.json"
# beside the probes, read by nobody but `explain`: its prose is not in the catalogue
_NOT_SOURCES = frozenset({"explanations.py"})


def sources_hash() -> str:
    """sha256 over the probe modules' sources (the package's .py files)."""
    digest = hashlib.sha256()
    for path in sorted(HERE.glob("*.py")):
        if path.name not in _NOT_SOURCES:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def stored(shipped_only: bool = False) -> dict[str, Any] | None:
    """The stored catalogue, {probe: {summary, command_help, options}}, when it was read from
    the probe modules as they are now (the shipped copy, else the user's cached one); None
    otherwise."""
    digest = sources_hash()
    for path in (STORED,) if shipped_only else (STORED, cached_path(digest)):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if data.get("sources") == digest:
            return data["probes"]
    return None


def cached_path(digest: str) -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser()
    return root / "flatcheck" / f"probe-catalogue-{digest[:16]}.json"


def read() -> dict[str, Any]:
    """The catalogue read from the probes themselves (imports every probe, and torch)."""
    from .kit import COMMAND, HELP, SHOW, flag_names
    from .registry import get_probe_class, list_probes

    out: dict[str, Any] = {}
    for name in list_probes():
        cls = get_probe_class(name)
        options = []
        for field in dataclasses.fields(cls.Options):
            meta = field.metadata
            options.append({
                "key": field.name,
                "flags": None if COMMAND in meta else list(flag_names(field)),
                "default": _shown(meta.get(SHOW, field.default)),
                "help": meta.get(HELP, ""),
            })
        out[name] = {"summary": cls.summary, "command_help": getattr(cls, "command_help", None) or cls.summary,
                     "options": options}
    return out


def current() -> dict[str, Any]:
    """The stored catalogue when it is current, else the one read from the probes (then kept
    in the user's cache; a cache that cannot be written is skipped)."""
    found = stored()
    if found is None:
        found = read()
        try:
            _write(cached_path(sources_hash()), found)
        except OSError:
            pass
    return found


def _shown(value: Any) -> Any:
    """A default as explain prints it (`default {value}`), kept as JSON can hold it."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def _write(path: Path, probes: dict[str, Any]) -> None:
    text = json.dumps({"sources": sources_hash(), "probes": probes}, indent=1, ensure_ascii=False, sort_keys=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)


def write() -> None:
    """Write the shipped copy from the probes as they are now."""
    _write(STORED, read())


if __name__ == "__main__":
    write()
    print(f"wrote {STORED}")
