"""Verdicts a gate must not give: on a value its probe does not stand behind (an unconverged
λmax), with a normal interval where the stderr is a spread over three start vectors (SLQ), or
a rule skipped because its field is misspelt."""

from __future__ import annotations

import json
import math

import pytest
from scipy.stats import norm, t as student_t

from flatcheck.errors import InputError
from flatcheck.report.result import ProbeResult
from flatcheck.workflows.gate.baseline import Baseline
from flatcheck.workflows.gate.checks import check_baseline
from flatcheck.workflows.gate.config import parse_gate_config
from flatcheck.workflows.gate.verdicts import evaluate, unresolved
from tests.support.cli import CKPT, SPEC, invoke


def lmax_result(converged: bool, to_noise: bool = False) -> ProbeResult:
    return ProbeResult(probe="lmax", value=11.12, stderr=None, matvecs=4, seconds=0.0,
                       resolved=converged or to_noise,
                       details={"converged": [converged], "converged_to_noise": to_noise,
                                "relative_residuals": [1e-4 if converged else 0.045], "tol": 1e-3})


def test_an_unconverged_lmax_is_neither_exact_nor_decided():
    r = lmax_result(False)
    assert r.to_dict()["exact"] is False and r.to_dict()["resolved"] is False
    cfg = parse_gate_config({"rules": [{"field": "lmax.value", "max": 12}]})
    with pytest.raises(InputError, match=r"lmax did not converge \(relative residual 0.045 > tol 0.001\).*max_iter"):
        evaluate(cfg, {"lmax": r})
    # converged, or converged to the dtype's noise: decided as an exact value
    for ok in (lmax_result(True), lmax_result(False, to_noise=True)):
        assert ok.to_dict()["exact"] is True
        assert [c.verdict for c in evaluate(cfg, {"lmax": ok})] == ["pass"]


def test_a_baseline_lmax_that_did_not_converge_is_refused_even_from_an_old_report():
    cfg = parse_gate_config({"rules": [{"field": "lmax.value", "max_increase": "10%"}]})
    old = lmax_result(False).to_dict()
    del old["resolved"]  # a report from before the field: lmax's details say it
    assert unresolved(old) is not None
    with pytest.raises(InputError, match="the baseline's lmax did not converge"):
        check_baseline(cfg, Baseline({"lmax": old}, {}, "base.json"), {}, seed=0)


def test_a_misspelt_field_of_a_probe_the_baseline_holds_is_bad_input_not_skipped():
    cfg = parse_gate_config({"rules": [{"field": "trace.valu", "max_increase": "10%"}]})
    base = {"trace": ProbeResult(probe="trace", value=1.0, stderr=0.1, matvecs=8, seconds=0.0).to_dict()}
    with pytest.raises(InputError, match="field 'trace.valu' is not in the baseline's trace result"):
        check_baseline(cfg, Baseline(base, {}, "base.json"), {}, seed=0)
    # a probe the baseline does not hold at all (added since) is still skipped, beside one it decides
    cfg2 = parse_gate_config({"rules": [{"field": "gini.value", "max_increase": "10%"},
                                        {"field": "trace.value", "max_increase": "200%"}]})
    skipped = check_baseline(cfg2, Baseline(base, {}, "base.json"), {}, seed=0)
    assert [b.name for b in skipped] == ["gini.value max_increase 10%"]
    # and a baseline that decides no relative rule at all is refused (test_gate_coverage)
    cfg3 = parse_gate_config({"rules": [{"field": "gini.value", "max_increase": "10%"}]})
    with pytest.raises(InputError, match="a report of trace only, with no gini result"):
        check_baseline(cfg3, Baseline(base, {}, "base.json"), {}, seed=0)


def test_a_rule_on_no_probe_or_on_a_field_the_result_lacks_names_the_gate_file():
    from flatcheck.errors import ConfigError

    with pytest.raises(ConfigError, match="gates.yaml: field 'rules\\[0\\].field' names no probe 'gnii'.*gini") as info:
        parse_gate_config({"rules": [{"field": "gnii.value", "max": 1}]}, where="gates.yaml")
    assert "--probes" not in str(info.value)  # no flag the user never typed
    cfg = parse_gate_config({"rules": [{"field": "gini.details.acuracy", "max": 1}]}, where="gates.yaml")
    result = ProbeResult(probe="gini", value=0.5, stderr=None, matvecs=0, seconds=0.0, details={"per_layer": {}})
    with pytest.raises(InputError, match="^gates.yaml: rule .*'gini.details.acuracy' is not in the gini result"):
        evaluate(cfg, {"gini": result}, no_baseline=True)


def test_slq_fields_take_students_t_with_starts_minus_one_dof():
    # three starts: the interval is t(2), 4.3 standard errors at 95 %, not the normal 1.96
    r = ProbeResult(probe="spectrum", value=11.24, stderr=0.87, matvecs=15, seconds=0.0, dof=2,
                    details={"trace": {"value": 30.0, "stderr": 2.0}})
    cfg = parse_gate_config({"rules": [{"field": "spectrum.value", "min": 16},
                                       {"field": "spectrum.details.trace", "min": 36}]})
    head, trace = evaluate(cfg, {"spectrum": r})
    q = student_t.ppf(0.975, 2)
    assert head.ci == pytest.approx((11.24 - q * 0.87, 11.24 + q * 0.87))
    assert trace.ci == pytest.approx((30.0 - q * 2.0, 30.0 + q * 2.0))
    # with the normal quantile 30 + 1.96·2 = 33.9 < 36 would have failed; t(2) straddles 36
    assert 30.0 + norm.ppf(0.975) * 2.0 < 36 and trace.verdict == "inconclusive"


@pytest.mark.parametrize("probe,dof", [("spectrum", None), ("rank", 2)])
def test_slq_probes_report_their_degrees_of_freedom(tmp_path, probe, dof):
    # rank's spread rests on starts − 1 dof; spectrum's stderr is floored by a start's known
    # variance, a normal interval (dof null)
    out = tmp_path / "r.json"
    result = invoke(probe, CKPT, "--spec", SPEC, "--samples", "16", "--lanczos-steps", "4", "--starts", "3",
                    "--json", str(out), "-q")
    assert result.exit_code == 0, result.stderr
    r = json.loads(out.read_text())["results"][probe]
    assert r["dof"] == dof and math.isfinite(r["stderr"])


def test_the_gate_command_refuses_an_unconverged_lmax(tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text("probes:\n  lmax: {k: 1, max_iter: 3}\nrules:\n  - field: lmax.value\n    max: 1000\n")
    result = invoke("gate", CKPT, "--spec", SPEC, "--samples", "64", "--config", str(gates), "--no-baseline")
    assert result.exit_code == 2, result.stderr
    assert "lmax did not converge" in result.stderr and "Traceback" not in result.stderr


def test_a_rerun_raises_the_slq_starts():
    from flatcheck.probes.spectrum import SpectrumOptions
    from flatcheck.workflows.gate.run import decide_with_reruns

    # stderr ∝ 1/√starts; the interval (t with starts − 1 dof) settles the rule only at 8 starts
    def res(n):
        return ProbeResult(probe="spectrum", value=10.0, stderr=4.0 / math.sqrt(n), matvecs=0, seconds=0.0,
                           dof=n - 1)

    threshold = 10.0 + student_t.ppf(0.975, 7) * 4.0 / math.sqrt(8) + 0.01
    cfg = parse_gate_config({"rules": [{"field": "spectrum.value", "max": threshold, "inconclusive": "rerun"}],
                             "max_reruns": 3})
    asked = []

    def rerun(more):
        asked.append(more["spectrum"].starts)
        return {"spectrum": res(more["spectrum"].starts)}

    checks, _ = decide_with_reruns(cfg, {"spectrum": res(2)}, {"spectrum": SpectrumOptions()}, rerun)
    assert asked == [4, 8] and checks[0].verdict == "pass"


def test_a_gate_given_a_budget_says_why_it_takes_none(tmp_path):
    # click's "no such option: --budget" named the other flags, not the reason
    gates = tmp_path / "gates.yaml"
    gates.write_text("rules:\n  - field: gini.value\n    max: 1\n")
    result = invoke("gate", CKPT, "--spec", SPEC, "--config", str(gates), "--no-baseline", "--budget", "5")
    assert result.exit_code == 2 and result.stderr.startswith("error: gate takes no --budget"), result.stderr
    assert "--budget" not in invoke("gate", "--help").stdout  # not offered


def test_a_misspelt_field_of_an_absolute_rule_is_refused_before_the_run_where_the_baseline_can_tell():
    """stranger20: `gini.details.acuracy min 0.3` ran every probe before exit 2. A baseline that
    holds a gini result measured as this gate measures it shows which fields there are."""
    gini = ProbeResult(probe="gini", value=0.4, stderr=None, matvecs=0, seconds=0.0,
                       details={"accuracy": 0.9, "entropy": 0.5}).to_dict()
    trace = ProbeResult(probe="trace", value=4.0, stderr=0.1, matvecs=30, seconds=0.0,
                        details={"estimator": "hutchpp", "parts": False, "layers": {}}).to_dict()
    base = Baseline({"gini": gini, "trace": trace}, {}, "base.json")
    typo = parse_gate_config({"rules": [{"field": "gini.details.acuracy", "min": 0.3}]})
    with pytest.raises(InputError, match=r"base.json: rule gini.details.acuracy min 0.3: field "
                                         r"'gini.details.acuracy' is not in the baseline's gini result "
                                         r"\(.*details: accuracy, entropy\)"):
        check_baseline(typo, base, {}, seed=0)
    spelt = parse_gate_config({"rules": [{"field": "gini.details.accuracy", "min": 0.3},
                                         {"field": "gini.accuracy", "min": 0.3}]})
    assert check_baseline(spelt, base, {}, seed=0) == []
    # a baseline without a gini result cannot tell: checked on the run's own result, as before
    assert check_baseline(typo, Baseline({"trace": trace}, {}, "base.json"), {}, seed=0) == []
    # a field that only other options make: a layer's trace, which this gate turns parts on for
    layer = parse_gate_config({"probes": {"trace": {"estimator": "hutchpp"}},
                               "rules": [{"field": "trace.details.layers.1.value", "max": 9}]})
    assert check_baseline(layer, base, {}, seed=0) == []
    # the same baseline at the same options does tell a misspelt trace field
    other = parse_gate_config({"probes": {"trace": {"estimator": "hutchpp"}},
                               "rules": [{"field": "trace.details.mean_eigenvalu", "max": 9}]})
    with pytest.raises(InputError, match="field 'trace.details.mean_eigenvalu' is not in the baseline's trace"):
        check_baseline(other, base, {}, seed=0)


def test_a_part_rule_against_a_baseline_without_parts_says_how_to_make_one_with_them():
    """stranger20: a per-layer rule against a baseline made with parts off said `layers holds `
    and listed nothing. It says the baseline's layers are empty and the option, as the gate file
    spells it, that a baseline with them is made with."""
    trace = ProbeResult(probe="trace", value=4.0, stderr=0.1, matvecs=30, seconds=0.0,
                        details={"estimator": "hutchpp", "parts": False, "layers": {}, "per_parameter": {}}).to_dict()
    base = Baseline({"trace": trace}, {}, "base.json")
    for field in ("trace.details.layers.1.value", "trace.layers.1.value"):
        cfg = parse_gate_config({"probes": {"trace": {"estimator": "hutchpp", "probes_max": 30}},
                                 "rules": [{"field": field, "max_increase": "20%"}]})
        with pytest.raises(InputError) as refused:
            check_baseline(cfg, base, {}, seed=0)
        said = str(refused.value)
        assert f"field '{field}' is not in the baseline's trace result: its trace.details.layers is empty" in said
        assert "measured with parts: false, this gate runs probes.trace.parts: true" in said, said
        assert "holds" not in said and "estimator" not in said  # the options that agree are not named
    # a baseline with parts still names the layers it holds for a misspelt one
    trace["details"].update(parts=True, layers={"0": {"value": 1.0, "stderr": 0.1}, "2": {"value": 3.0}})
    cfg = parse_gate_config({"rules": [{"field": "trace.details.layers.1.value", "max_increase": "20%"}]})
    with pytest.raises(InputError, match=r"trace.details.layers holds 0, 2"):
        check_baseline(cfg, base, {}, seed=0)


@pytest.mark.parametrize("field", ["trace.details.layers.1.value", "trace.layers.1.value",
                                   "trace.per_parameter.1.weight.value"])
def test_a_rule_on_a_part_turns_parts_on_however_it_spells_the_path(field):
    """results_io reads `trace.layers.1.value` as `trace.details.layers.1.value`; a gate that left
    parts off for the shorthand ran without them and found no layer after the run."""
    cfg = parse_gate_config({"rules": [{"field": field, "max": 9}]})
    assert cfg.options("trace").parts is True
    assert parse_gate_config({"rules": [{"field": "trace.value", "max": 9}]}).options("trace").parts is False
    # and a part's stderr comes from the trace's own 10 probes: Student's t with 9 degrees of freedom
    part = {"value": 2.9, "stderr": 0.03}
    res = {"trace": ProbeResult(probe="trace", value=4.0, stderr=0.1, matvecs=10, seconds=0.0, dof=9,
                                details={"layers": {"1": part}, "per_parameter": {"1.weight": part}}).to_dict()}
    (c,) = evaluate(cfg, res)
    half = student_t.ppf(0.975, 9) * 0.03
    assert c.ci == pytest.approx((2.9 - half, 2.9 + half))
