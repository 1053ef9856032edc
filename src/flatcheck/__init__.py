"""flatcheck: loss-landscape geometry of trained checkpoints.

Public API: measure(model, data) on live objects, or build a RunConfig and call run();
read the Report. Tracker(model, data, every=K) measures as training runs.

The names below are imported on first use (PEP 562), not with the package: the `flatcheck`
command imports this package before it can catch Ctrl-C, and importing torch takes seconds.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

_WHERE = {
    "run": "api", "open_session": "api", "Session": "api", "measure": "api",
    "Tracker": "workflows.track",
    "load_model": "models.load",
    "RunConfig": "config", "ProbeRequest": "config", "probe_requests": "config",
    "FlatcheckError": "errors", "InputError": "errors",
    "list_probes": "probes.registry", "create_probe": "probes.registry", "register_probe": "probes.registry",
    "Report": "report.result", "ProbeResult": "report.result",
}

__all__ = ["__version__", *_WHERE]


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'flatcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


# Modules that moved in 0.2; the old import paths keep working, with a warning, for one release.
_MOVED = {
    "flatcheck.gate": "flatcheck.workflows.gate",
    "flatcheck.scan": "flatcheck.workflows.scan",
    "flatcheck.scan_sources": "flatcheck.workflows.scan_sources",
    "flatcheck.invariance": "flatcheck.workflows.invariance",
    "flatcheck.rescale": "flatcheck.workflows.rescale",
    "flatcheck.results_io": "flatcheck.workflows.results_io",
    "flatcheck.stats": "flatcheck.workflows.stats",
    "flatcheck.head": "flatcheck.probes._head",
    "flatcheck.hooks": "flatcheck.probes._hooks",
    "flatcheck.inputjac": "flatcheck.probes._inputjac",
    "flatcheck.dist": "flatcheck.backends._dist",
    "flatcheck.backends.layout": "flatcheck.layout",
    "flatcheck.backends.quadform": "flatcheck.engines.quadform",
    "flatcheck.backends.persample": "flatcheck.engines.persample",
    "flatcheck.backends.state": "flatcheck.engines.state",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves an old module path as the module at its new path (the same object, so state and
    monkeypatching are shared), after a DeprecationWarning naming the new path."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib's signature
        if fullname not in _MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):  # noqa: ANN001
        new = _MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes away in the next release",
                      DeprecationWarning, stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:  # noqa: ANN001 - already executed at its new path
        return None


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
