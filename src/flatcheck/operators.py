"""Curvature matrices as linear operators over the flat parameter vector.

Estimators in flatcheck.linalg see only `matmat`, `dim` and `matvecs` (linalg.trace.Operator),
and `quadratic` where the streaming flags say so (linalg.trace.StreamsTotals/StreamsParts);
which matrix it is (Hessian or GGN) and how products are made (which backend, and which of
its capabilities) stays here.
"""

from __future__ import annotations

from torch import Tensor

from .backends.base import Backend, HvpSums, Vhv
from .linalg.certify import roundoff_units
from .problem import ParamLayout
from .errors import ConfigError

MATRICES = ("hessian", "ggn")
# one vᵀHv by forward tangents against first-order adjoints, over one double-backward product:
# about half the work (backends/autograd.vhv), and no second backward pass
TANGENT_FORM_COST = 0.5


class CurvatureOperator:
    """H or G of the whole-sample-set loss; counts every matrix-vector product it makes."""

    def __init__(self, backend: Backend, matrix: str = "hessian", vhv: bool = True):
        """vhv=False: quadratic forms by the backend's HVPs even where it has a vhv route."""
        if matrix not in MATRICES:
            raise ConfigError(f"--matrix must be one of {', '.join(MATRICES)}, got {matrix!r}")
        self.backend = backend
        self.matrix = matrix
        self.layout = backend.problem.layout
        self.dim = self.layout.dim
        self.dtype = backend.problem.dtype
        self.device = backend.problem.device
        # units of eps·‖A‖ below which no eigenvalue bound goes: the products' round-off, or the
        # logits' own where a saturated softmax makes that the larger, or the float32 products'
        # measured error where they cancel (linalg/certify.py)
        self.roundoff_units = roundoff_units(backend.problem.max_abs_logit, backend.problem.product_error)
        self.matvecs = 0
        self._vhv = vhv
        self._product = backend.hvp if matrix == "hessian" else backend.ggn_vp

    def matmat(self, V: Tensor) -> Tensor:
        """(k, P) → (k, P)."""
        self.matvecs += V.shape[0]
        return self._product(V)

    @property
    def streams_quadratic(self) -> bool:
        """Whether `quadratic` gets vᵀAv and its parts from the backend without a (k, P) product."""
        return self.matrix == "hessian" and isinstance(self.backend, HvpSums)

    @property
    def takes_vhv(self) -> bool:
        """Whether `quadratic` without parts goes to the backend's vhv, which needs no HVP and
        also takes a diagonal `scale` of the rows."""
        return self._vhv and self.matrix == "hessian" and isinstance(self.backend, Vhv)

    @property
    def form_cost(self) -> float:
        """What one vᵀAv of `quadratic` without parts is expected to cost, over one product of
        `matmat`: TANGENT_FORM_COST by forward tangents (`takes_vhv`, and the backend has not
        fallen back from them), a product's where the form sums an HVP's entries."""
        if self.takes_vhv and getattr(self.backend, "vhv_error", None) is None:
            return TANGENT_FORM_COST
        return 1.0

    @property
    def streams_total(self) -> bool:
        """Whether `quadratic` without parts gets vᵀAv without a (k, P) product."""
        return self.matrix == "hessian" and isinstance(self.backend, (Vhv, HvpSums))

    def quadratic(self, S: Tensor, split: "LayoutParts | None" = None,
                  scale: Tensor | None = None) -> tuple[Tensor, dict]:
        """vᵀAv for every row v of S ((k, P), ±1 int8 signs or floats) in float64, and the
        parts of V ⊙ AV that `split` defines; k matrix-vector products. Only where
        `streams_quadratic` (or, without `split`, `streams_total`); elsewhere estimators take
        `matmat`. Without parts the backend may take a cheaper route than an HVP (`vhv`),
        which also takes the rows times a diagonal `scale` (where `takes_vhv`)."""
        vhv = split is None and self.takes_vhv
        if not vhv and scale is not None:
            raise ValueError("quadratic: scale needs a backend with vhv (see takes_vhv)")
        if not vhv and not self.streams_quadratic:
            # hvp_sums are the Hessian's: a GGN operator (or a backend without them) must not take them
            raise ValueError(f"quadratic: the {self.matrix} operator of backend {self.backend.name} does not "
                             "stream vᵀAv (see streams_quadratic); take matmat")
        self.matvecs += S.shape[0]
        if vhv:
            return self.backend.vhv(S, scale), {}
        sums = self.backend.hvp_sums(S)
        return sums.sum(1), (split.of_sums(sums) if split is not None else {})


class LayoutParts:
    """Module parts ("module", group) and parameter parts ("param", name) of a (k, P) block,
    or of its per-parameter sums: both give the same float64 numbers."""

    def __init__(self, layout: ParamLayout):
        self.layout = layout

    def __call__(self, block: Tensor) -> dict:
        return self.of_sums(self.layout.param_sum_matrix(block))

    def of_sums(self, sums: Tensor) -> dict:
        modules = {("module", g): v for g, v in self.layout.group_sums_of(sums).items()}
        return {**modules, **{("param", n): sums[:, j] for j, n in enumerate(self.layout.names)}}
