"""flatcheck: loss-landscape geometry of trained checkpoints.

Public API: measure(model, data) on live objects, or build a RunConfig and call run();
read the Report. Tracker(model, data, every=K) measures as training runs.

The names below are imported on first use (PEP 562), not with the package: the `flatcheck`
command imports this package before it can catch Ctrl-C, and importing torch takes seconds.
"""

import importlib as _importlib

__version__ = "0.1.0"

_WHERE = {
    "run": "api", "open_session": "api", "Session": "api", "measure": "live",
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
    value = getattr(_importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    # the public names are __all__'s: not the helpers this module imports, nor the submodules
    # that importing a name binds here (flatcheck.api, flatcheck.live, ...)
    return sorted({name for name in globals() if name.startswith("_")} | set(__all__))
