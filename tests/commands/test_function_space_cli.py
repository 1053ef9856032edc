"""The function-space commands end to end on the demo checkpoint, and their flag errors."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import CKPT, SPEC, SMALL, invoke, ok

COMMANDS = ["jacobian", "mls", "activations", "decomposition"]


@pytest.mark.parametrize("command", COMMANDS)
def test_command_on_demo(command):
    result = invoke(command, CKPT, "--spec", SPEC, "--data", "digits", *SMALL, "--quiet", "--json", "-")
    ok(result)
    r = json.loads(result.stdout)["results"][command]
    assert isinstance(r["value"], float) and r["details"]


def test_jacobian_flags_on_demo():
    result = invoke("jacobian", CKPT, "--spec", SPEC, *SMALL, "--quiet", "--output", "softmax",
                    "--exclude-region", "2,2,4,4", "--method", "estimate", "--projections", "8", "--json", "-")
    ok(result)
    d = json.loads(result.stdout)["results"]["jacobian"]
    assert d["details"]["method"] == "estimate" and d["stderr"] > 0 and d["seed"] == 0
    assert (d["details"]["excluded"]["n_out"], d["details"]["excluded"]["n_region"]) == (48, 16)


def test_all_in_probe_command():
    names = "jacobian,mls,activations,decomposition,gini"
    result = invoke("probe", CKPT, "--spec", SPEC, *SMALL, "--quiet", "--probes", names, "--layers", "--json", "-")
    ok(result)
    results = json.loads(result.stdout)["results"]
    assert list(results) == names.split(",")
    assert "entropy" in results["gini"]["details"]
    table = invoke("probe", CKPT, "--spec", SPEC, *SMALL, "--quiet", "--probes", names, "--layers")
    ok(table)
    assert "decomposition" in table.stdout


@pytest.mark.parametrize("args, words", [
    (["jacobian", "--exclude-region", "1,2,3"], "--exclude-region"),
    (["jacobian", "--exclude-region", "7,7,4,4"], "does not fit"),
    (["jacobian", "--output", "foo"], "output"),
    (["mls", "--output", "foo"], "output"),
    (["jacobian", "--method", "magic"], "method"),
    (["jacobian", "--projections", "1"], "--projections"),
    (["mls", "--bn-mode", "train"], "--bn-mode"),
])
def test_bad_flags_exit_2_with_one_line(args, words):
    command, *rest = args
    result = invoke(command, CKPT, "--spec", SPEC, *SMALL, *rest)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.stderr
