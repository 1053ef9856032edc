"""Plain option values coerced without pydantic.

typer (from 0.2x) turns every option's value into its Python type through a pydantic
TypeAdapter, built when the command is run, so that any command run imports pydantic: a
tenth of a second or more, on a short run more than flatcheck's own modules take. The CLI's
options are of a few plain types (str, int, float, bool, Path, list[str]); for those, a value in the
form typer's adapter reads most simply (a decimal number, any string, a path) is converted
here to what the adapter would give, and anything else — a number written "1_000" or "inf",
a value out of a declared range, an option with its own parser — goes to typer's own
coercion, with its messages. `plain_coercion(command, ctx)` installs this on a click command's
parameters (its help option included); on a typer without this coercion layer it changes nothing.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, get_args, get_origin

try:  # typer's coercion layer (typer ≥ 0.2x); older typers convert with click's types
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # pragma: no cover - depends on the installed typer
    RuntimeParam = None  # type: ignore[assignment,misc]

# what typer's int/float adapters read as Python's int()/float() read them (both parse a
# decimal string to the nearest value, so the results agree); other spellings go to typer
_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def _plain_kind(param: Any) -> str | None:
    """Which of the plain forms `param` takes ("str", "int", "float", "bool", "path", "strs"), or None
    when typer must coerce it (a parser, a range, a choice, a file, another type)."""
    descriptor = getattr(param, "type_descriptor", None)
    info = getattr(descriptor, "parameter_info", None)
    if info is None or descriptor.file_annotation is not None:
        return None
    if info.parser is not None or info.min is not None or info.max is not None:
        return None
    annotation = descriptor.annotation
    if annotation is str:
        return "str"
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    if annotation is bool:  # a flag's True/False skips coercion (typer's process_value); None is None
        return "bool"
    if annotation is Path and info.path_type is None:
        return "path"
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        return "strs"
    return None


if RuntimeParam is not None:

    class PlainRuntimeParam(RuntimeParam):  # type: ignore[misc,valid-type]
        """typer's RuntimeParam for a plain option: its None and multiple-value handling
        (RuntimeParam.coerce), the simple forms converted here, the rest by typer's own."""

        kind: str

        def __init__(self, param: Any, kind: str) -> None:
            descriptor = param.type_descriptor
            super().__init__(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation)
            object.__setattr__(self, "kind", kind)
            object.__setattr__(self, "_descriptor", descriptor)
            object.__setattr__(self, "_typer", None)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            kind = self.kind
            if kind == "str" and type(value) is str:
                return value
            if kind == "int" and (type(value) is int or (type(value) is str and _INT.fullmatch(value))):
                return int(value)
            if kind == "float":
                if type(value) is float:
                    return value
                if type(value) is str and _FLOAT.fullmatch(value) and math.isfinite(number := float(value)):
                    return number
            if kind == "bool" and type(value) is bool:
                return value
            if kind == "path" and type(value) is str:
                # the path as typer's adapter makes it (pathlib's parse of the text), then typer's
                # own checks of it (exists, dash, resolve_path)
                return coerce_cli_path(Path(value), self.parameter_info, path_type=Path, param=param, ctx=ctx)
            if kind == "strs" and isinstance(value, (list, tuple)) and all(type(v) is str for v in value):
                return list(value)
            return self._own()._coerce_value(value, param=param, ctx=ctx)

        def _own(self) -> Any:
            """typer's coercion of this option (its pydantic adapter), built on first need."""
            if self._typer is None:
                object.__setattr__(self, "_typer", build_runtime_param(self._descriptor))
            return self._typer


def plain_coercion(command: Any, ctx: Any) -> Any:
    """`command` (a click command typer built) with its plain options coerced without
    pydantic; options already coerced once, or of other types, keep typer's coercion. `ctx`:
    the context the command is resolved in, which names its help option (None: the options
    alone)."""
    if RuntimeParam is None:
        return command
    for param in command.params if ctx is None else command.get_params(ctx):
        if getattr(param, "_runtime_param", False) is None and (kind := _plain_kind(param)) is not None:
            param._runtime_param = PlainRuntimeParam(param, kind)
    return command
