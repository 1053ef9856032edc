"""rank's notes (its ± is a spread over starts): how to get a usable error bar when it rests on few starts."""

from __future__ import annotations

import pytest

from flatcheck.config import probe_requests
from flatcheck.probes.registry import ProbeContext, create_probe
from flatcheck.report.render import ROUGH_DOF
from tests.support.dense import make_case


@pytest.mark.parametrize("probe", ["rank"])
@pytest.mark.parametrize("starts", [2, ROUGH_DOF + 1])
def test_a_rough_error_bar_says_how_to_get_a_usable_one(probe, starts):
    """The default 2 starts gave ‖H‖_F 1.187 ± 0.19 against an exact 2.155 (stranger test):
    the table marks a ± on dof below ROUGH_DOF rough, and the note says which flag narrows it.
    The default stays at 2 starts for its cost. (spectrum's ± is floored by the per-start
    variance instead, on a normal interval: test_spectrum_coverage.)"""
    (req,) = probe_requests([probe], {probe: {"starts": starts, "lanczos_steps": 10}})
    r = create_probe(probe).run(ProbeContext(make_case("mlp").backend(), seed=0), req.options)
    assert r.dof == starts - 1
    advised = f"the ± rest on {starts} starts (dof {starts - 1}) and are rough: raise --starts" in r.notes
    assert advised == (starts - 1 < ROUGH_DOF), r.notes
