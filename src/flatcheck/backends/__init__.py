"""Backends make curvature-matrix products over the whole sample set.

The contract is flatcheck.backends.base (protocols checked with isinstance); finding and
building backends is flatcheck.backends.registry; every other public module here is one
backend. The computations they share live in flatcheck.engines.
"""

from ..layout import ParamLayout
from .base import Backend, BackendSpec, ExactGGN, GGNVp, Hvp, HvpSums, Outputs, Problem, Vhv, model_mode
from .registry import create_backend, list_backends, rebuild, register_backend, register_wrapper

__all__ = ["Backend", "BackendSpec", "ExactGGN", "GGNVp", "Hvp", "HvpSums", "Outputs", "ParamLayout", "Problem",
           "Vhv", "create_backend", "list_backends", "model_mode", "rebuild", "register_backend",
           "register_wrapper"]
