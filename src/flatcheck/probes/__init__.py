"""Probes: one file each, registered with @register_probe.

The registry's names are imported on first use (PEP 562): the CLI reads probes/catalogue.py
and probes/explanations.py without importing the registry, and with it torch.
"""

from __future__ import annotations

import importlib

__all__ = ["ProbeContext", "create_probe", "list_probes", "parse_options", "register_probe"]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".registry", __name__), name)
