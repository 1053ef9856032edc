"""Backends make curvature-matrix products over the whole sample set.

The contract is flatcheck.backends.base (protocols checked with isinstance); finding and
building backends is flatcheck.backends.registry; every other public module here is one
backend. The computations they share live in flatcheck.engines.
"""

from ..problem import ParamLayout
from .base import Backend, BackendSpec, ExactGGN, GGNVp, Hvp, HvpFailure, HvpSums, LimitMemory, Outputs, Vhv
from .registry import create_backend, list_backends, rebuild, register_backend, register_wrapper

__all__ = ["Backend", "BackendSpec", "ExactGGN", "GGNVp", "Hvp", "HvpFailure", "HvpSums", "LimitMemory", "Outputs",
           "ParamLayout", "Vhv", "create_backend", "list_backends", "rebuild", "register_backend", "register_wrapper"]
