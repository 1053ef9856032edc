"""invariance's predicted trace carries the error of the sampled parts it is built from, and its
interval covers the dense float64 trace of the rescaled model (a ReLU pair: the rescaling is
exact, so the prediction's only error is the parts')."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats
from scipy.special import stdtrit
from typer.testing import CliRunner

from tests.probes.test_trace import Z, _run
from tests.support.dense import dense, make_case
from flatcheck.cli import app
from flatcheck.workflows.invariance import _predicted_trace
from flatcheck.workflows.rescale import apply_rescaling, find_rescaling

ROOT = Path(__file__).resolve().parents[2]


def _rescaled_truth(case, r) -> tuple[float, float]:
    """Dense Tr(H), Tr(G) of the rescaled model; the model is left rescaled."""
    apply_rescaling(case.model, r)
    H2, G2 = dense(case)
    return H2.trace().item(), G2.trace().item()


def _q(result) -> float:
    return stats.norm.ppf(0.975) if result.dof is None else stdtrit(result.dof, 0.975)


@pytest.mark.parametrize("estimator", ["hutchinson", "hutchpp"])
def test_sampled_prediction_has_a_stderr_that_covers_the_truth(estimator):
    case = make_case("mlp")  # the ReLU pair is 3 → 5, scaled by α = 10: 5.weight's part ×100
    r = find_rescaling(case.model, 10.0)
    result = _run(case, seed=0, estimator=estimator, matrix="hessian", probes_max=30, rtol=None)
    predicted, se = _predicted_trace(result, r)
    truth, _ = _rescaled_truth(case, r)
    assert se is not None and se > 0
    # the ×α² part alone carries α²·se of it: a smaller stderr would hide it
    assert se >= r.alpha**2 * result.details["per_parameter"][f"{r.down}.weight"]["stderr"] * (1 - 1e-12)
    assert abs(predicted - truth) <= Z * se


def test_exact_prediction_is_exact():
    case = make_case("mlp")
    r = find_rescaling(case.model, 10.0)
    result = _run(case, estimator="exact")
    predicted, se = _predicted_trace(result, r)
    _, truth = _rescaled_truth(case, r)
    assert se is None
    assert abs(predicted - truth) <= 1e3 * 2.0**-52 * abs(truth)


@pytest.mark.statistical
def test_sampled_prediction_interval_coverage():
    """Over 200 seeds the predicted value ± q·stderr misses the dense rescaled trace no more often
    than a 95 % interval may (binomial, 1e-4): the bound on the stderr may be wide, never short."""
    case = make_case("mlp")
    r = find_rescaling(case.model, 10.0)
    results = [_run(case, seed=s, matrix="hessian", probes_max=20, rtol=None) for s in range(200)]
    truth, _ = _rescaled_truth(case, r)
    misses = 0
    for res in results:
        predicted, se = _predicted_trace(res, r)
        misses += abs(predicted - truth) > _q(res) * se
    assert misses <= stats.binom.isf(1e-4, len(results), 0.05), misses


def test_the_command_shows_the_predicted_stderr():
    result = CliRunner().invoke(app, [
        "invariance", str(ROOT / "demo" / "digits_cnn.safetensors"), "--spec", str(ROOT / "model_specs" / "demo_digits.yaml"),
        "--samples", "32", "--probes", "trace", "-o", "trace.probes_max=10", "-o", "trace.rtol=none",
        "--alpha", "10", "--json", "-", "--quiet",
    ])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["comparison"]
    assert row["predicted_stderr"] is not None and row["predicted_stderr"] > 0
