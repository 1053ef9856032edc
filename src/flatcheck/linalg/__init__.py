"""Estimators that are plain functions of a linear operator (anything with matmat, dim, dtype, device)."""

from .random import rademacher
from .trace import TraceEstimate, hutchinson, hutchpp

__all__ = ["TraceEstimate", "hutchinson", "hutchpp", "rademacher"]
