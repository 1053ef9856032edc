"""lmax's notes word each value's deterministic error bound as its table does, "(within b)":
a "±" there reads as a standard error, which a Ritz value's bound is not."""

from __future__ import annotations

import re

import torch

from flatcheck.config import probe_requests
from flatcheck.probes.registry import ProbeContext, create_probe
from tests.probes.test_rank import structured_mlp_case


def test_each_value_in_the_notes_carries_its_bound_as_within():
    (req,) = probe_requests(["lmax"], {"lmax": {"k": 2}})
    r = create_probe("lmax").run(ProbeContext(structured_mlp_case(torch.float64).backend(), seed=0), req.options)
    listed = r.notes.split(";")[0]
    assert listed.startswith("top-2: ") and "±" not in listed, r.notes
    bounds = [float(x) for x in re.findall(r"\(within ([0-9.e+-]+)\)", listed)]
    assert len(bounds) == 2, r.notes
    # the first is the headline's own bound, as the table shows it
    assert bounds[0] == float(f"{r.error_bound:.2g}")
