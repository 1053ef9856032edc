"""Result objects and how they are rendered (JSON, rich tables)."""

from .result import SCHEMA_VERSION, ProbeResult, Report

__all__ = ["SCHEMA_VERSION", "ProbeResult", "Report"]
