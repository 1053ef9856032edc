"""Backends make curvature-matrix products over the whole sample set."""

from .base import Backend, Problem, list_backends, create_backend, register_backend
from ..layout import ParamLayout

__all__ = ["Backend", "Problem", "ParamLayout", "list_backends", "create_backend", "register_backend"]
