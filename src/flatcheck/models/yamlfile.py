"""One strict way to read the YAML files users write (model specs, gate configs).

PyYAML's safe_load keeps the last of two equal keys without a word, so a spec
with `num_classes` written twice silently uses the second. Here a duplicate key
is refused with the file, the key and both lines. Everything else is safe_load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode

from flatcheck.errors import InputError, SpecError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, line: int, first: int) -> None:
        super().__init__(f"duplicate key {key!r} at line {line} (first at line {first})")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader whose mappings refuse a key written twice.

    Keys brought in by a merge (`<<: *base`) may still be overridden: that is
    what merging is for, and flatten_mapping resolves it after this check.
    """

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        if isinstance(node, MappingNode):
            self._refuse_duplicates(node)
        return super().construct_mapping(node, deep=deep)

    def _refuse_duplicates(self, node: MappingNode) -> None:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:  # unhashable keys are refused by the base constructor with its own message
                continue
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise DuplicateKeyError(key, line, first_line[key])
            first_line[key] = line


def load_yaml(source: str | bytes | Path, where: str, *, error: type[InputError] = SpecError) -> Any:
    """Parse YAML text (str or bytes) or the file at a Path, refusing duplicate keys.

    `where` starts every message (a file name, or "--config FILE"); failures
    raise `error` with one line: not found, unreadable, not UTF-8, not YAML, or
    the duplicate key with its line.
    """
    text = _read(source, where, error) if isinstance(source, Path) else source
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{where}: not valid UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader
    except DuplicateKeyError as exc:
        raise error(f"{where}: {exc}; YAML would silently keep the last, so remove one") from None
    except yaml.YAMLError as exc:
        # PyYAML names a parsed string "<unicode string>"; `where` already names the file
        words = " ".join(str(exc).split()).replace('in "<unicode string>", ', "at ")
        raise error(f"{where}: not valid YAML ({words})") from None


def _read(path: Path, where: str, error: type[InputError]) -> bytes:
    if path.is_dir():
        raise error(f"{where}: is a folder, not a YAML file")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise error(f"{where}: file not found") from None
    except OSError as exc:
        raise error(f"{where}: cannot read ({exc.strerror or exc})") from None

