"""A spec's `head` naming a module the model does not have is refused when the model is
loaded, by every command, not only by the probes that read the head (stranger21: trace
measured a spec with head: "3" silently; head-trace alone refused it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import flatcheck
from flatcheck.errors import SpecError
from tests.support.cli import CKPT, FAST_JSON, SPEC, bad, invoke


def spec_with_head(tmp_path: Path, head: str) -> Path:
    text = SPEC.read_text().replace("head: head", f'head: "{head}"')
    assert f'head: "{head}"' in text
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("command", ["trace", "gini"])
def test_a_head_naming_no_module_is_refused_by_a_probe_that_never_reads_it(tmp_path, command):
    spec = spec_with_head(tmp_path, "3")
    err = bad(invoke(command, CKPT, "--spec", spec, "--data", "digits", *FAST_JSON[:4], "--quiet"),
              str(spec), "field 'head'", "'3'")
    assert err.endswith("linear layers near the end: head"), err


def test_the_spec_s_own_head_still_runs(tmp_path):
    result = invoke("gini", CKPT, "--spec", spec_with_head(tmp_path, "head"), "--data", "digits",
                    *FAST_JSON[:4], "--quiet")
    assert result.exit_code == 0, result.stderr


def test_measure_refuses_a_head_keyword_naming_no_module():
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    with pytest.raises(SpecError, match=r"^measure\(\): keyword 'head' names no module of .*: 'fc'; "
                                        r"linear layers near the end: 0, 2$"):
        flatcheck.measure(model, (x, y), probes="gini", head="fc")
