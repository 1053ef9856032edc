"""Backends found by name, built from a name, and rebuilt for another problem.

A backend is one module of this package that registers itself when imported: a leaf
(`register_backend`, products of its own) or a wrapper (`register_wrapper`, products of a
leaf it builds, as `distributed:INNER` shards one over processes). Modules are found by
file name, as probes are, so adding a backend adds a file and edits none; `_name` modules
and the contract (base) and this registry are not backends.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from ..problem import Problem
from .base import Backend, BackendSpec

Make = Callable[[Problem], Backend]


@dataclass(frozen=True)
class _Leaf:
    factory: Callable[..., Backend]
    options: dict[str, str]  # option name → what it does, for the error when another leaf is asked for it


@dataclass(frozen=True)
class _Wrapper:
    factory: Callable[[Problem, Make], Backend]  # (problem, make inner backend for a problem)
    default_inner: str


_LEAVES: dict[str, _Leaf] = {}
_WRAPPERS: dict[str, _Wrapper] = {}
_NOT_BACKENDS = {"base", "registry"}


def register_backend(name: str, options: dict[str, str] | None = None):
    """Class decorator: `factory(problem, **options)` builds backend `name`; `options` names
    the keyword options it takes (a true value asked of a leaf without it is refused)."""

    def deco(factory):
        _LEAVES[name] = _Leaf(factory, dict(options or {}))
        return factory

    return deco


def register_wrapper(name: str, default_inner: str):
    """Decorator: `factory(problem, make)` builds `name:INNER`, calling make(problem′) for each
    INNER backend it needs (INNER = `default_inner` when the name is just `name`)."""

    def deco(factory):
        _WRAPPERS[name] = _Wrapper(factory, default_inner)
        return factory

    return deco


def _discover() -> None:
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name not in _NOT_BACKENDS and not info.name.startswith("_"):
            importlib.import_module(f"{__package__}.{info.name}")


def list_backends() -> list[str]:
    """Every name --backend takes alone (leaves and wrappers)."""
    _discover()
    return sorted({*_LEAVES, *_WRAPPERS})


def _choices() -> str:
    names = list_backends() + [f"{w}:{leaf}" for w in sorted(_WRAPPERS) for leaf in sorted(_LEAVES)]
    return ", ".join(names)


def create_backend(name: str, problem: Problem, **options: object) -> Backend:
    """`name` is a registered backend, or WRAPPER:INNER (e.g. "distributed:func").

    options: what the leaf backend takes (`compile=True`: the func backend's torch.compile);
    options left false or None are not asked for.
    """
    _discover()
    outer, _, inner = name.partition(":")
    wrapper = _WRAPPERS.get(outer)
    leaf = (inner or wrapper.default_inner) if wrapper is not None else (None if inner else outer)
    if leaf not in _LEAVES:
        raise ConfigError(f"--backend {name!r} is unknown; available: {_choices()}")
    asked = {k: v for k, v in options.items() if v is not None and v is not False}
    for option in asked:
        if option not in _LEAVES[leaf].options:
            takers = [n for n, lf in sorted(_LEAVES.items()) if option in lf.options]
            names = " or ".join([*takers, *(f"{w}:{t}" for w in sorted(_WRAPPERS) for t in takers)])
            why = "; ".join(_LEAVES[t].options[option] for t in takers)
            raise ConfigError(f"--{option.replace('_', '-')} needs --backend {names} ({why}), got --backend {name}")

    def make(p: Problem) -> Backend:
        return _LEAVES[leaf].factory(p, **asked)

    backend = wrapper.factory(problem, make) if wrapper is not None else make(problem)
    backend.spec = BackendSpec(name, tuple(sorted(asked.items())))
    return backend


def rebuild(backend: Backend, **changes: object) -> Backend:
    """The same kind of backend (wrapper, inner and options: `distributed:func --compile`
    stays that) over the backend's problem with `changes` (samples=…, layout=…, loss=…)."""
    return create_backend(backend.spec.name, replace(backend.problem, **changes), **dict(backend.spec.options))
