"""Hutch++ stops at its exact count, 3·P: a sketch of P columns spans the whole space, so the
trace (and every diagonal block's) is exact there, against dense float64 truth. Before the cap,
--probes-max 3000 on a 599-parameter CNN took 2,599 products for what 1,797 gave."""

from __future__ import annotations

import pytest
import torch

from flatcheck.linalg import hutchpp
from flatcheck.operators import LayoutParts
from tests.probes.test_trace import _run
from tests.support.dense import DenseOperator, block_traces, dense, make_case

EPS64 = torch.finfo(torch.float64).eps


def _matrix(n: int, rank: int | None) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    B = torch.randn(n, rank or n, generator=g, dtype=torch.float64)
    return B @ B.T - (0.0 if rank else 0.5 * n) * torch.eye(n, dtype=torch.float64)  # indefinite at full rank


@pytest.mark.parametrize("rank", [None, 4])
def test_capped_at_three_products_a_dimension_and_exact(rank):
    """Asked for far more than 3·P, it takes 3·P and returns Tr(A) to rounding, also where A
    (and so the sketch A·S) is rank-deficient; below 3·P it takes what was asked."""
    n = 12
    A = _matrix(n, rank)
    scale = A.abs().sum().item()  # rounding of Σ_i q_iᵀAq_i is a few eps of Σ|A_ij|
    for asked in (3 * n, 3 * n + 2, 300):
        est = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=asked)
        assert est.matvecs == 3 * n and est.stop_reason == "exact", asked
        assert abs(est.value - A.trace().item()) <= 1e3 * EPS64 * scale
    est = hutchpp(DenseOperator(A), generator=torch.Generator().manual_seed(0), matvecs=3 * n - 3)
    assert est.matvecs == 3 * n - 3 and est.stop_reason == "matvecs"


def test_capped_parts_are_their_blocks_exact_traces():
    case = make_case("mlp")
    H, _ = dense(case)
    layout = case.problem.layout
    est = hutchpp(DenseOperator(H), generator=torch.Generator().manual_seed(1), matvecs=10 * layout.dim,
                  split=LayoutParts(layout))
    assert est.matvecs == 3 * layout.dim
    scale = H.abs().sum().item()
    for name, truth in block_traces(H, layout).items():
        value, _ = est.groups[("module", name)]
        assert abs(value - truth) <= 1e3 * EPS64 * scale, name


@pytest.mark.parametrize("parts", [True, False])
def test_the_probe_spends_the_exact_count(parts):
    """Through the trace probe, with parts (products) and without (quadratic forms)."""
    case = make_case("mlp")
    H, _ = dense(case)
    P = case.problem.layout.dim
    r = _run(case, estimator="hutchpp", matrix="hessian", probes_max=5 * P, parts=parts)
    assert r.matvecs == 3 * P and r.details["stop_reason"] == "exact"
    assert abs(r.value - H.trace().item()) <= 1e3 * EPS64 * H.abs().sum().item()
