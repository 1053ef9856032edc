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


def test_k_past_the_parameters_is_refused_in_the_call_s_keywords():
    """measure() said "use --k ≤ 8 or widen --params" (stranger18); the CLI keeps its flags."""
    import flatcheck
    from flatcheck.errors import ConfigError
    from flatcheck.settings import flag_of

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))  # 8 parameters
    with pytest.raises(ConfigError) as caught:
        flatcheck.measure(model, (torch.randn(8, 3), torch.randint(0, 2, (8,))), probes={"lmax": {"k": 9}})
    assert str(caught.value).startswith("k 9 is more than the 8 probed parameters")
    assert str(caught.value).endswith("use k ≤ 8 or widen params")
    assert caught.value.worded(flag_of).endswith("use --k ≤ 8 or widen --params")
