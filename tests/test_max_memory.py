"""--max-memory (issue 19 §2): the Jacobian probes chunk their samples to fit it with values that do
not depend on the chunking (float64, 1e-12), refuse up front (exit 2, the size they would need)
when one sample cannot fit, and the flag is parsed at the edge."""

from __future__ import annotations

import math

import pytest
from torch import nn

from conftest import make_case
from flatcheck.backends import ParamLayout, Problem
from flatcheck.config import RunConfig, probe_requests
from flatcheck.errors import ConfigError
from flatcheck.linalg.memory import parse_bytes
from flatcheck.models.spec import LossSpec
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options
from test_bad_input import CKPT, SPEC, bad
from test_cli import invoke


def run(case, probe, max_memory=None, **opts):
    ctx = ProbeContext(case.backend(), seed=0, max_memory=max_memory)
    return create_probe(probe).run(ctx, parse_options(probe, opts))


def numbers(d, prefix=""):
    """Every number in a details dict, by path (the chunking's own entries left out)."""
    out = {}
    for k, v in d.items():
        if k in ("chunk_samples", "memory_limit_bytes", "backward_passes"):
            continue
        if isinstance(v, dict):
            out.update(numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
            out[prefix + k] = float(v)
    return out


@pytest.mark.parametrize("probe,method", [("mls", "exact"), ("mls", "estimate"),
                                          ("decomposition", "exact"), ("decomposition", "estimate")])
def test_values_do_not_depend_on_the_chunking(probe, method):
    case = make_case("cnn")  # float64, batches of 10 over 23 samples
    whole = run(case, probe, max_memory=2**40, method=method)
    per_sample = whole.details["memory_per_sample_bytes"]
    assert whole.details["chunk_samples"] >= 10
    # room for exactly one sample, then for three: chunks of 1 and of 3, 3, 3, 1 per batch
    for room, chunk in ((per_sample, 1), (3 * per_sample + 1, 3)):
        small = run(case, probe, max_memory=room, method=method)
        assert small.details["chunk_samples"] == chunk
        a, b = numbers(whole.details), numbers(small.details)
        assert a.keys() == b.keys()
        for key in a:
            if key == "memory_per_sample_bytes":
                continue
            assert math.isclose(a[key], b[key], rel_tol=1e-12, abs_tol=1e-300), (key, a[key], b[key])
        if whole.stderr is not None:
            assert math.isclose(whole.stderr, small.stderr, rel_tol=1e-12)


@pytest.mark.parametrize("probe", ["mls", "decomposition"])
@pytest.mark.parametrize("method", ["exact", "estimate"])
def test_refused_up_front_when_one_sample_cannot_fit(probe, method):
    case = make_case("mlp")
    need = run(case, probe, max_memory=2**40, method=method).details["memory_per_sample_bytes"]
    with pytest.raises(ConfigError, match=f"probe {probe} \\({method} route.*needs about .* GiB even one at a time"):
        run(case, probe, max_memory=need - 1, method=method)


def test_auto_takes_the_estimate_route_when_the_rows_do_not_fit():
    case = make_case("mlp")
    wide = nn.Sequential(nn.Flatten(), nn.Linear(12, 100)).double()  # 100 classes: exact unless it cannot fit
    case.problem = Problem(wide, LossSpec(), case.problem.samples, ParamLayout.from_model(wide))
    exact = run(case, "mls", max_memory=2**40)
    assert exact.details["route"] == "exact"
    need = exact.details["memory_per_sample_bytes"]
    # the estimate route holds no C × D rows: it fits where the exact route's one sample does not
    assert run(case, "mls", max_memory=need - 1).details["route"] == "estimate"


@pytest.mark.parametrize("text,value", [("8G", 8 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", int(1.5 * 2**30)),
                                        ("2GB", 2 * 10**9), ("4096", 4096), (" 64k ", 64 * 2**10)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "8X", "-1G", "0"])
def test_parse_bytes_refuses(text):
    with pytest.raises(ConfigError, match="--max-memory"):
        parse_bytes(text)


def test_run_config_parses_it():
    config = RunConfig(checkpoint=None, spec=SPEC, probes=probe_requests("gini"), max_memory="1G")
    assert config.max_memory == 2**30


def test_cli_exit_2_with_the_size_needed():
    result = invoke("mls", CKPT, "--spec", SPEC, "--samples", "4", "--batch-size", "4", "--max-memory", "1K")
    err = bad(result, "--max-memory", "needs about")
    assert "probe mls" in err


def test_cli_bad_value_is_one_line_exit_2():
    bad(invoke("gini", CKPT, "--spec", SPEC, "--samples", "4", "--max-memory", "lots"), "--max-memory")
