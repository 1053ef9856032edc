"""Curvature matrices as linear operators over the flat parameter vector.

Estimators in flatcheck.linalg see only `matmat` and `dim`; which matrix it is
(Hessian or GGN) and how products are made (which backend) stays here.
"""

from __future__ import annotations

from torch import Tensor

from .backends.base import Backend
from .errors import ConfigError

MATRICES = ("hessian", "ggn")


class CurvatureOperator:
    """H or G of the whole-sample-set loss; counts every matrix-vector product it makes."""

    def __init__(self, backend: Backend, matrix: str = "hessian"):
        if matrix not in MATRICES:
            raise ConfigError(f"--matrix must be one of {', '.join(MATRICES)}, got {matrix!r}")
        self.backend = backend
        self.matrix = matrix
        self.layout = backend.problem.layout
        self.dim = self.layout.dim
        self.dtype = backend.problem.dtype
        self.device = backend.problem.device
        self.matvecs = 0
        self._product = backend.hvp if matrix == "hessian" else backend.ggn_vp

    def matmat(self, V: Tensor) -> Tensor:
        """(k, P) → (k, P)."""
        self.matvecs += V.shape[0]
        return self._product(V)
