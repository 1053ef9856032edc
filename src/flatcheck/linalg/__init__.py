"""Estimators that are plain functions of a linear operator (anything with matmat, dim, dtype, device)."""

from .lanczos import EigenResult, lanczos_top
from .power import power_top
from .random import rademacher
from .slq import SLQ, Density, density, slq
from .trace import TraceEstimate, hutchinson, hutchpp

__all__ = ["TraceEstimate", "hutchinson", "hutchpp", "rademacher", "EigenResult", "lanczos_top", "power_top",
           "SLQ", "Density", "slq", "density"]
