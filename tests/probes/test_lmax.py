"""lmax's notes: the advice they give fits the run that gave them."""

from __future__ import annotations

import pytest
import torch

from flatcheck.config import probe_requests
from flatcheck.probes.registry import ProbeContext, create_probe
from tests.probes.test_rank import structured_mlp_case


@pytest.mark.parametrize("dtype, advised", [(torch.float32, True), (torch.float64, False)])
def test_an_unconverged_note_advises_float64_only_where_the_run_is_not(dtype, advised):
    """`lmax … --dtype float64 --max-iter 1` ended its note "raise --max-iter (now 1) or --tol,
    or use --dtype float64" (stranger test): a float64 run has nothing finer to go to."""
    (req,) = probe_requests(["lmax"], {"lmax": {"k": 1, "max_iter": 1, "method": "lanczos"}})
    r = create_probe("lmax").run(ProbeContext(structured_mlp_case(dtype).backend(), seed=0), req.options)
    assert "NOT converged" in r.notes  # the case still exercises the advice
    assert "raise --max-iter (now 1) or --tol" in r.notes
    assert ("--dtype float64" in r.notes) == advised, r.notes


def test_a_cold_block_starts_from_the_gradient_and_says_so():
    """The default cold λmax grows its Krylov space from the loss gradient and one random
    vector (operators.CurvatureOperator.lead) and records it; its value is the dense truth's
    within the certified bound it reports. --starts 1 stays random."""
    from tests.support.dense import dense

    case = structured_mlp_case(torch.float64)
    truth = torch.linalg.eigvalsh(dense(case)[0])[-1].item()
    (req,) = probe_requests(["lmax"], {"lmax": {"k": 1, "tol": 1e-8}})
    r = create_probe("lmax").run(ProbeContext(case.backend(), seed=0), req.options)
    assert r.details["start_vectors"] == "the loss gradient (first batch) and 1 random"
    assert abs(r.value - truth) <= r.error_bound
    (one,) = probe_requests(["lmax"], {"lmax": {"k": 1, "starts": 1}})
    r1 = create_probe("lmax").run(ProbeContext(case.backend(), seed=0), one.options)
    assert r1.details["start_vectors"] == "1 random"
