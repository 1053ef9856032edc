"""The table of model sources (timm, torchvision, python, plugins): names to builders.

Its own module, importing neither torch nor the spec, so that validating a spec can ask
which sources exist (plugins registered at run time count) without importing the builders,
and the builders can import the spec: no cycle between models.spec and models.sources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# Builder: fn(spec: ModelSpec) -> nn.Module. Defaults: fn(spec, model) -> Preprocess, the input
# contract the source knows about (fields set in the spec win over it).
Builder = Callable[[Any], Any]
Defaults = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Source:
    build: Builder
    defaults: Defaults | None


_REGISTRY: dict[str, Source] = {}


def register_source(name: str, *, defaults: Defaults | None = None) -> Callable[[Builder], Builder]:
    """Decorator registering `fn(spec) -> nn.Module` as source `name`.

    `defaults(spec, model) -> Preprocess` optionally gives the input contract the
    source knows about; fields set in the spec win over it.
    """

    def decorate(fn: Builder) -> Builder:
        _REGISTRY[name] = Source(fn, defaults)
        return fn

    return decorate


def get_source(name: str) -> Source | None:
    return _REGISTRY.get(name)


def list_sources() -> list[str]:
    return sorted(_REGISTRY)
