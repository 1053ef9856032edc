"""Probes: one file each, registered with @register_probe."""

from .registry import ProbeContext, create_probe, list_probes, parse_options, register_probe

__all__ = ["ProbeContext", "create_probe", "list_probes", "parse_options", "register_probe"]
