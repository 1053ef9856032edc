"""What a gate says when it refuses a relative rule it could only compare unpaired: the true
reason it is unpaired, and remedies that change the verdict (a probe that keeps no per-probe
values cannot be paired by remaking its baseline; the width it names is the narrowest accepted)."""

from __future__ import annotations

import re

import pytest

from flatcheck.errors import InputError
from flatcheck.workflows.gate.baseline import Baseline
from flatcheck.workflows.gate.checks import check_baseline
from flatcheck.workflows.gate.config import parse_gate_config
from tests.workflows.test_gate import META, traced

# an adaptive-sharpness record as `flatcheck gate … --json` (schema 2.5) writes it
SHARPNESS = {"probe": "adaptive-sharpness", "value": 6.840298613403057e-09, "stderr": 9.50108327667969e-10,
             "dof": 99, "error_bound": None, "exact": False, "resolved": True, "matvecs": 100, "seconds": 3.4,
             "seed": 0,
             "details": {"rho": 0.0005, "loss": "cross_entropy", "method": "second-order", "parameters": 136,
                         "route": "second-order", "route_reason": "method second-order",
                         "stop_reason": "max_probes"}}


def gate_file(percent: int, kind: str = "max_increase"):
    return parse_gate_config({"probes": {"adaptive-sharpness": {"method": "second-order"}},
                              "rules": [{"field": "adaptive-sharpness.value", kind: f"{percent}%"}]})


def refusal(cfg, results, schema="2.5", seed=0) -> str:
    with pytest.raises(InputError) as exc:
        check_baseline(cfg, Baseline(results, {**META, "schema_version": schema}, "--baseline b.json"), META,
                       seed=seed)
    return str(exc.value)


@pytest.mark.parametrize("kind", ["max_increase", "max_decrease"])
def test_a_probe_without_per_probe_values_is_told_so_and_given_a_width_that_is_accepted(kind):
    msg = refusal(gate_file(20, kind), {"adaptive-sharpness": SHARPNESS})
    assert "the baseline's adaptive-sharpness result keeps no per-probe values" in msg
    assert "schema < 2.0" not in msg
    # remaking the baseline at this seed pairs nothing, and the probe has no `probes` option
    assert "--no-baseline --json" not in msg and "probes ≥" not in msg
    assert "max or min rule" in msg
    width = int(re.search(rf"widen the rule to {kind}: (\d+)% or more", msg).group(1))
    base = Baseline({"adaptive-sharpness": SHARPNESS}, {**META, "schema_version": "2.5"}, "--baseline b.json")
    check_baseline(gate_file(width, kind), base, META, seed=0)  # the width named is accepted
    with pytest.raises(InputError, match="cannot pass an unchanged model unpaired"):
        check_baseline(gate_file(width - 1, kind), base, META, seed=0)  # and is the narrowest


def test_an_absolute_rule_on_the_same_baseline_is_not_refused():
    cfg = parse_gate_config({"probes": {"adaptive-sharpness": {"method": "second-order"}},
                             "rules": [{"field": "adaptive-sharpness.value", "max": 1e-8}]})
    check_baseline(cfg, Baseline({"adaptive-sharpness": SHARPNESS}, {**META, "schema_version": "2.5"}, "b"),
                   META, seed=0)


def test_a_trace_at_another_seed_is_still_advised_to_pair():
    values = [10.0 + 6 * (-1) ** i * (i % 3) for i in range(16)]
    cfg = parse_gate_config({"rules": [{"field": "trace.value", "max_increase": "20%"}]})
    msg = refusal(cfg, {"trace": traced(values)}, seed=1)
    assert "unpaired (seeds differ (baseline 0, now 1))" in msg
    assert "probes_max ≥" in msg and "--no-baseline --json) to compare paired" in msg


def test_a_schema_1_baseline_says_why_and_that_remaking_it_pairs():
    record = {"probe": "trace", "value": 10.0, "stderr": 2.0, "dof": 15, "matvecs": 16, "seconds": 0.0,
              "details": {"estimator": "hutchinson", "matrix": "hessian"}}
    cfg = parse_gate_config({"rules": [{"field": "trace.value", "max_increase": "20%"}]})
    msg = refusal(cfg, {"trace": record}, schema="1.0")
    assert "the baseline is of schema 1.0, from before reports kept per-probe values" in msg
    assert "to compare paired" in msg


def test_a_decided_rule_s_note_names_the_probe_that_keeps_no_values():
    from flatcheck.workflows.gate.verdicts import evaluate

    cfg = parse_gate_config({"probes": {"adaptive-sharpness": {"method": "second-order"}},
                             "rules": [{"field": "adaptive-sharpness.value", "max_increase": "200%"}]})
    # the run's record as evaluate reads it (a mapping, as the report's JSON holds it)
    (c,) = evaluate(cfg, {"adaptive-sharpness": SHARPNESS}, {"adaptive-sharpness": SHARPNESS})
    assert c.verdict == "pass"
    assert c.message == "unpaired: this adaptive-sharpness result keeps no per-probe values"
