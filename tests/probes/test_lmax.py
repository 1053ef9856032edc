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
