"""`flatcheck head-trace`, `relative-flatness` and `adaptive-sharpness` end to end on the demo."""

from __future__ import annotations

import pytest

from tests.support.cli import CKPT, SPEC, as_json, assert_only_tables, invoke, ok

SMALL = ["--samples", "64", "--batch-size", "32"]
HEAD_PARAMS = 32 * 10 + 10  # DigitsCNN.head = Linear(32, 10)


def command(name: str, *extra: str):
    return invoke(name, CKPT, "--spec", SPEC, "--data", "digits", *SMALL, *extra)


def one_line_error(result, flag: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    err = result.stderr.strip()
    assert err.startswith("error:") and "\n" not in err and flag in err, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def head_trace_verified() -> dict:
    return as_json(command("head-trace", "--verify", "--dtype", "float64", "--json", "-"))


def test_head_trace_json(head_trace_verified):
    r = head_trace_verified["results"]["head-trace"]
    d = r["details"]
    assert r["exact"] and r["stderr"] is None and r["label"] == "Tr(H) of head"
    assert d["head"] == "head" and d["classes"] == 10 and d["features"] == 32 and d["parameters"] == HEAD_PARAMS
    assert abs(r["value"] - (d["weight_trace"] + d["bias_trace"])) <= 1e-12 * r["value"]
    assert d["relative_flatness"] > 0
    v = d["verify"]
    assert v["coordinates"] == v["total_coordinates"] == HEAD_PARAMS == r["matvecs"]
    assert v["relative_difference"] <= 1e-10  # float64: autograd and the closed form agree to rounding


def test_head_trace_table_shows_weight_and_bias():
    result = command("head-trace")
    ok(result)
    assert_only_tables(result.stdout)
    assert "head.weight" in result.stdout and "head.bias" in result.stdout


def test_relative_flatness_json_matches_head_trace(head_trace_verified):
    data = as_json(command("relative-flatness", "--dtype", "float64", "--json", "-"))
    r = data["results"]["relative-flatness"]
    kappa = head_trace_verified["results"]["head-trace"]["details"]["relative_flatness"]
    assert abs(r["value"] - kappa) <= 1e-12 * kappa
    assert set(r["details"]["per_class"]) == {str(c) for c in range(10)}
    assert abs(sum(r["details"]["per_class"].values()) - r["value"]) <= 1e-12 * r["value"]


def test_adaptive_sharpness_json():
    data = as_json(command("adaptive-sharpness", "--rho", "0.01", "--noise-draws", "3", "--probes-max", "4",
                           "--loss", "sigmoid_mse", "--json", "-"))
    r = data["results"]["adaptive-sharpness"]
    d = r["details"]
    assert d["loss"] == "sigmoid_mse" and d["rho"] == 0.01 and d["method"] == "both"
    assert d["mc"]["draws"] == 3 and d["second_order"]["probes"] == 4 and d["route_pilot"]["probes"] == 8
    assert r["matvecs"] == 4 + 8  # the second-order probes and the route's pilot
    head = d[{"monte-carlo": "mc", "second-order": "second_order"}[d["route"]]]  # the route that resolves it
    assert r["value"] == head["value"] and r["stderr"] == head["stderr"] and r["seed"] == 0


def test_adaptive_sharpness_second_order_only_table():
    result = command("adaptive-sharpness", "--method", "second-order", "--probes-max", "4")
    ok(result)
    assert_only_tables(result.stdout)
    assert "second order" in result.stdout and "MC" not in result.stdout


@pytest.mark.parametrize("args, flag", [
    (["--rho", "-1"], "--rho"),
    (["--noise-draws", "0"], "--noise-draws"),
    (["--loss", "hinge"], "--loss"),
    (["--method", "exact"], "method"),
])
def test_adaptive_sharpness_bad_flags(args, flag):
    one_line_error(command("adaptive-sharpness", *args), flag)


def test_head_trace_bad_flags():
    one_line_error(command("head-trace", "--verify-max", "0"), "--verify-max")
    one_line_error(command("head-trace", "--head", "features.0"), "--head must name an nn.Linear")
    # the option, not a spec field nor measure()'s keyword (reviewer19: "head nope: keyword 'head' …")
    one_line_error(command("head-trace", "--head", "nope"), "error: --head names no module of")
