"""The shipped gate (examples/gates.yaml) in the workflow of docs/quickstart/ci-gate.md, on the demo checkpoint.

(a) paired: a baseline made at seed s and the gate at the same seed pass for every s in 0–19,
    and the unchanged model reproduces the baseline's per-probe values to round-off;
(b) unpaired: the baseline of seed 0 and the gate at seeds 1–19 pass (19 of 19);
(c) a copy of the checkpoint whose trace is ≥ 1.3× the original's (the head scaled by 0.85) (checked with the exact GGN
    trace and a Hutch++ Tr(H) with its own interval) fails the gate: exit 1, the relative rule
    "fail", not inconclusive, both paired and unpaired;
(d) the head scaled by 2 (the softmax saturates, the trace falls, accuracy stays) and by 0.5
    fail it, by the trace's rule in the direction it moved and by the Jacobian's, which moves
    with the logit scale.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy import stats

from flatcheck import api
from flatcheck.config import RunConfig, probe_requests
from flatcheck.workflows.gate.baseline import Baseline
from flatcheck.workflows.gate.checks import check_baseline
from flatcheck.workflows.gate.config import load_gate_config
from flatcheck.workflows.gate.run import run_gate
from flatcheck.workflows.gate.verdicts import evaluate
from tests.support.cli import CKPT, ROOT, SPEC, invoke

pytestmark = pytest.mark.workflow  # whole workflows, seconds each: make test-all only


GATES = ROOT / "examples" / "gates.yaml"
SAMPLES = 512  # as in the quickstart's workflow
SEEDS = range(20)
RELATIVE = "trace.value max_increase 20%"


def config(seed: int, checkpoint=CKPT, probes=None, options=None) -> RunConfig:
    gate = load_gate_config(GATES)
    return RunConfig(checkpoint=checkpoint, spec=SPEC, data="digits", samples=SAMPLES, device="cpu", seed=seed,
                     probes=probe_requests(probes or list(gate.probes), options or gate.probes))


@pytest.fixture(scope="module")
def outcomes():
    """Per seed: the first release's gate (--no-baseline: its JSON is the baseline) and the
    next gate on the same checkpoint, at the same seed, against it."""
    gate = load_gate_config(GATES)
    out = {}
    for seed in SEEDS:
        first = run_gate(config(seed), gate).to_dict()
        baseline = Baseline(first["results"], {k: v for k, v in first.items() if k not in ("results", "gate")},
                            f"seed {seed}")
        out[seed] = (baseline, run_gate(config(seed), gate, baseline=baseline))
    return gate, out


def _check(outcome, name: str):
    return next(c for c in outcome.checks if c.bound.name == name)


@pytest.mark.statistical
def test_paired_gate_passes_an_unchanged_model_at_every_seed(outcomes):
    _, out = outcomes
    for seed, (baseline, outcome) in out.items():
        check = _check(outcome, RELATIVE)
        assert outcome.passed and outcome.exit_code == 0, (seed, [c.to_dict() for c in outcome.checks])
        assert check.verdict == "pass" and check.paired == len(baseline.results["trace"]["details"]["probe_values"])
        b = baseline.results["trace"]["value"]
        assert abs(outcome.report.results["trace"].value - b) <= 1e-9 * abs(b)


@pytest.mark.statistical
def test_unpaired_gate_passes_at_other_seeds(outcomes):
    gate, out = outcomes
    baseline = out[0][0]
    passed = 0
    for seed in SEEDS[1:]:
        current = out[seed][1].report
        check_baseline(gate, baseline, current.meta, seed=seed)  # decidable: not refused up front
        checks = evaluate(gate, current.results, baseline.results)
        relative = next(c for c in checks if c.bound.name == RELATIVE)
        assert relative.paired is None and "seeds differ" in relative.message
        passed += all(not c.failed for c in checks)
    assert passed == len(SEEDS) - 1


@pytest.fixture(scope="module")
def sharper(tmp_path_factory):
    """The demo checkpoint with its head's weights scaled by 0.85: less confident softmax
    outputs, whose curvature p(1 − p) grows — Tr(G) 27.7 → 38.8 (1.40×). Checked below, since
    the direction is not obvious: scaling the last convolution by 1.3 instead lowers the trace
    to 14.6, and so does scaling the head up, once softmax saturates."""
    sd = load_file(str(CKPT))
    sd["head.weight"] = sd["head.weight"] * 0.85
    path = tmp_path_factory.mktemp("sharper") / "sharper.safetensors"
    save_file(sd, str(path))
    return path


def test_the_perturbed_checkpoint_has_a_larger_trace(sharper):
    """Its exact GGN trace, and Hutch++'s Tr(H) interval, are ≥ 1.3× the original's."""
    exact = {"trace": {"estimator": "exact"}}
    g0 = api.run(config(0, probes=["trace"], options=exact)).results["trace"].value
    g1 = api.run(config(0, sharper, probes=["trace"], options=exact)).results["trace"].value
    assert g1 >= 1.3 * g0, (g0, g1)
    precise = {"trace": {"estimator": "hutchpp", "probes_max": 192, "parts": False}}
    h0 = api.run(config(0, probes=["trace"], options=precise)).results["trace"]
    h1 = api.run(config(0, sharper, probes=["trace"], options=precise)).results["trace"]
    q = stats.norm.ppf(1 - 1e-4)
    assert h1.value - q * h1.stderr >= 1.3 * (h0.value + q * h0.stderr), (h0, h1)


@pytest.mark.parametrize("seed", [0, 1], ids=["paired", "unpaired"])
def test_gate_fails_a_checkpoint_whose_trace_grew(tmp_path, sharper, seed):
    base = tmp_path / "release.json"
    common = ["--spec", SPEC, "--data", "digits", "--samples", str(SAMPLES), "--config", GATES, "--device", "cpu"]
    first = invoke("gate", CKPT, *common, "--no-baseline", "--json", base, "--seed", "0", "-q")
    assert first.exit_code == 0, first.stderr
    res = invoke("gate", sharper, *common, "--baseline", base, "--seed", str(seed), "--json", "-", "-q")
    assert res.exit_code == 1, res.stderr
    checks = {c["rule"]: c for c in json.loads(res.stdout)["gate"]["checks"]}
    assert checks[RELATIVE]["verdict"] == "fail"
    assert (checks[RELATIVE]["paired"] is not None) == (seed == 0)


@pytest.fixture(scope="module")
def rescaled(tmp_path_factory):
    """The demo checkpoint with its head (weight and bias) scaled by 2 and by 0.5: the logits
    scale by the same factor, the argmax does not."""
    folder = tmp_path_factory.mktemp("rescaled")
    out = {}
    for factor in (2.0, 0.5):
        sd = load_file(str(CKPT))
        sd["head.weight"], sd["head.bias"] = sd["head.weight"] * factor, sd["head.bias"] * factor
        out[factor] = folder / f"head_x{factor}.safetensors"
        save_file(sd, str(out[factor]))
    return out


@pytest.mark.statistical  # its baseline is the 20 seeds' runs of `outcomes`
@pytest.mark.parametrize("factor, trace_moved, jacobian_moved", [(2.0, "max_decrease", "max_increase"),
                                                                  (0.5, "max_increase", "max_decrease")],
                         ids=["fc×2", "fc×0.5"])
def test_the_shipped_gate_fails_a_rescaled_head_in_both_directions(outcomes, rescaled, factor, trace_moved,
                                                                   jacobian_moved):
    """fc × 2 drove Tr(H) from 27.9 to 3.6 with accuracy 1.0, and the shipped gate (trace max and
    max_increase, accuracy min) passed it. Against the seed-0 baseline, at seeds 0 (paired) and
    1 (unpaired): the trace's rule in the direction it moved fails, and so does the Jacobian's,
    which scales exactly with the logits; accuracy cannot see either."""
    gate, out = outcomes
    baseline = out[0][0]
    for seed in (0, 1):
        outcome = run_gate(config(seed, rescaled[factor]), gate, baseline=baseline)
        checks = {c.bound.name: c for c in outcome.checks}
        assert outcome.exit_code == 1
        assert checks[f"trace.value {trace_moved} 20%"].verdict == "fail", checks[f"trace.value {trace_moved} 20%"]
        jac = checks[f"jacobian.value {jacobian_moved} 20%"]
        assert jac.verdict == "fail" and jac.value == pytest.approx(factor * jac.baseline, rel=1e-5)
        assert checks["gini.details.accuracy min 0.9"].verdict == "pass"


def test_probe_vectors_do_not_depend_on_the_block_size():
    """Pairing runs of different probe counts relies on this: the i-th Rademacher vector of a
    seed is the same whether it was drawn alone or in a block of any size."""
    from flatcheck.linalg.random import rademacher_signs

    whole = rademacher_signs(8, 1000, torch.Generator().manual_seed(3), device="cpu")
    g = torch.Generator().manual_seed(3)
    pieces = torch.cat([rademacher_signs(k, 1000, g, device="cpu") for k in (5, 1, 2)])
    assert torch.equal(whole, pieces)


# 6 probes are refused: the paired interval, widened for the differences' skewness, would
# leave an unchanged model inconclusive (its baseline's trace interval holds 0)
PAIRED_PROBES = 8


def test_a_paired_rerun_doubles_both_sides(tmp_path):
    """The head scaled by 0.94 (Tr(H) up several percent) against an 8-probe baseline of the
    original: paired over 8 probes the 20% rule is inconclusive; the rerun draws 16 probes on
    both sides — the baseline re-measured from its checkpoint, which its report names — and
    passes (at 0.93–0.94 one rerun decides; 0.92 stays inconclusive, 0.90 fails outright and
    0.95 passes at once). With
    the baseline's checkpoint gone, pairing cannot grow: no rerun is spent and the rule counts
    as failed, saying why."""
    release = tmp_path / "release.safetensors"
    release.write_bytes(CKPT.read_bytes())
    sd = load_file(str(CKPT))
    sd["head.weight"] = sd["head.weight"] * 0.94
    candidate = tmp_path / "candidate.safetensors"
    save_file(sd, str(candidate))
    cfg = tmp_path / "gates.yaml"
    cfg.write_text(f"probes:\n  trace: {{probes_max: {PAIRED_PROBES}}}\nrules:\n"
                   "  - {field: trace.value, max_increase: 20%, inconclusive: rerun}\n", encoding="utf-8")
    common = ["--spec", SPEC, "--data", "digits", "--samples", str(SAMPLES), "--config", cfg, "--device", "cpu", "-q"]
    base = tmp_path / "release.json"
    assert invoke("gate", release, *common, "--no-baseline", "--json", base).exit_code == 0
    res = invoke("gate", candidate, *common, "--baseline", base, "--json", "-")
    (check,) = json.loads(res.stdout)["gate"]["checks"]
    assert res.exit_code == 0 and check["verdict"] == "pass", check
    assert check["paired"] == 2 * PAIRED_PROBES and check["reruns"] == 1 and "re-measured" in check["message"]
    release.unlink()
    res = invoke("gate", candidate, *common, "--baseline", base, "--json", "-")
    (check,) = json.loads(res.stdout)["gate"]["checks"]
    assert res.exit_code == 1 and check["verdict"] == "inconclusive" and check["reruns"] == 0
    assert check["paired"] == PAIRED_PROBES and "the baseline's last probe value was paired" in check["message"]


def test_gate_takes_the_route_of_a_short_baseline(tmp_path):
    """A baseline of 8 probes took its total by HVPs (too few products to repay tracing for
    forward tangents); a gate of 20 probes would take forward tangents on its own, but follows
    the baseline's route, so the unchanged model reproduces the baseline's probe values
    exactly, not only to the round-off between the two routes."""
    from flatcheck.probes.trace import TANGENT_MIN_PRODUCTS
    from flatcheck.workflows.gate.config import parse_gate_config

    short = {"trace": {"probes_max": 8, "parts": False, "rtol": None}}
    first = api.run(config(0, probes=["trace"], options=short)).to_dict()
    assert first["results"]["trace"]["details"]["route"] == "hvp_sums"
    baseline = Baseline(first["results"], {k: v for k, v in first.items() if k != "results"}, "short")
    gate = parse_gate_config({"probes": {"trace": {"probes_max": 20}},
                              "rules": [{"field": "trace.value", "max_increase": "20%"}]})
    assert 20 >= TANGENT_MIN_PRODUCTS
    own = api.run(config(0, probes=["trace"], options=gate.probes)).results["trace"]
    assert own.details["route"] == "vhv_tangent"  # without the baseline: its own route
    got = run_gate(config(0, probes=["trace"], options=gate.probes), gate, baseline=baseline).report.results["trace"]
    base_values = first["results"]["trace"]["details"]["probe_values"]
    assert got.details["route"] == "hvp_sums" and got.details["probe_values"][:8] == base_values
    assert own.details["probe_values"][:8] != base_values  # what pinning the route is for
