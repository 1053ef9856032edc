"""Logits out of a forward that returns more than logits (a tuple, a dict, a HF ModelOutput).

Every backend and probe assumes `model(x)` is a (batch, classes) tensor. Rather
than teach each of them, the model itself is made to return plain logits by a
forward hook on its root module. A hook, not a wrapping module: a wrapper would
put a prefix on every parameter, buffer and module name, and those names are
the checkpoint's keys, the --params globs, the per-layer rows and the head.

Rule (spec field `output_key`):
- unset: a tensor is taken as is; otherwise a `logits` key or attribute, else
  the first tensor (tuple/list elements, dict values, dataclass fields, in order);
- a string: that key of a dict, or that attribute;
- an integer: that position of a tuple or list, or of a dict's values.
Anything else is a SpecError naming the spec and `output_key`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from flatcheck.errors import SpecError
from flatcheck.models.spec import field_words

OutputKey = str | int | None
_MISSING = object()


class SelectLogits:
    """Forward hook on the root module: replaces a structured output by its logits."""

    def __init__(self, key: OutputKey, where: str) -> None:
        self.key = key
        self.where = where

    def __call__(self, _module: nn.Module, _args: Any, output: Any) -> Tensor | None:
        if isinstance(output, Tensor) and self.key is None:
            return None  # unchanged: the common case costs nothing
        return select_logits(output, self.key, self.where)


def attach_output_selector(model: nn.Module, key: OutputKey, where: str) -> None:
    # Registered first, so hooks added later on the root module (by probes) see logits.
    model.register_forward_hook(SelectLogits(key, where))


def select_logits(output: Any, key: OutputKey, where: str) -> Tensor:
    found = _default(output) if key is None else _by_key(output, key, where)
    if isinstance(found, Tensor):
        return found
    if key is None:
        raise SpecError(
            f"{where}: the model's forward returned {_describe(output)} with no tensor to take as logits; "
            f"set {field_words(where, 'output_key')} to the key, attribute or index that holds them"
        )
    raise SpecError(f"{where}: {field_words(where, 'output_key')} {key!r} selects {type(found).__name__}, not a tensor of logits")


def _default(output: Any) -> Any:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping):
        return output["logits"] if "logits" in output else _first_tensor(output.values())
    logits = getattr(output, "logits", _MISSING)
    if logits is not _MISSING:
        return logits
    if isinstance(output, (tuple, list)):
        return _first_tensor(output)
    if dataclasses.is_dataclass(output):
        return _first_tensor(getattr(output, f.name) for f in dataclasses.fields(output))
    return None


def _first_tensor(values) -> Tensor | None:
    return next((v for v in values if isinstance(v, Tensor)), None)


def _by_key(output: Any, key: str | int, where: str) -> Any:
    if isinstance(output, Tensor):
        raise SpecError(f"{where}: {field_words(where, 'output_key')} is {key!r} but the model's forward returns a tensor; remove it")
    if isinstance(key, int):
        items = list(output.values()) if isinstance(output, Mapping) else output
        if isinstance(items, (tuple, list)) and key < len(items):
            return items[key]
    elif isinstance(output, Mapping):
        if key in output:
            return output[key]
    else:
        found = getattr(output, key, _MISSING)
        if found is not _MISSING:
            return found
    raise SpecError(f"{where}: {field_words(where, 'output_key')} {key!r} is not in the model's output, {_describe(output)}")


def _describe(output: Any) -> str:
    if isinstance(output, Mapping):
        return f"a {type(output).__name__} with keys {', '.join(map(str, output)) or 'none'}"
    if isinstance(output, (tuple, list)):
        kinds = ", ".join(type(v).__name__ for v in output)
        return f"a {type(output).__name__} of {len(output)} ({kinds})"
    if dataclasses.is_dataclass(output):
        return f"a {type(output).__name__} with fields {', '.join(f.name for f in dataclasses.fields(output))}"
    return f"a {type(output).__name__}"
