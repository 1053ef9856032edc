"""A scan's sample count is held against its data before any model runs (stranger23 §7): an
explicit --samples beyond the split is one exit 2, as a one-model command gives, and a preset's
own count acts as flatcheck's default does (the whole split if smaller). Both gave an error
record per model, exit 1 and the advice --resume --retry-errors, which failed the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flatcheck.data.builtin import DIGITS_TRAIN
from tests.support.cli import SPEC, bad, copy_demo, invoke

DIGITS_TEST = 1797 - DIGITS_TRAIN  # the embedded set's test split: fewer than the preset's 1000
RUN = ["--probes", "gini"]


def folder(tmp_path: Path) -> Path:
    ckpts = tmp_path / "ck"
    copy_demo(ckpts, "a.safetensors")
    copy_demo(ckpts, "b.safetensors")
    shutil.copy(SPEC, ckpts / "spec.yaml")
    return ckpts


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_samples_beyond_the_split_is_one_exit_2_before_any_model(tmp_path):
    out = tmp_path / "scan.jsonl"
    res = invoke("scan", "--checkpoints", folder(tmp_path), "--data", "digits", "--split", "test",
                 "--samples", DIGITS_TEST + 1, *RUN, "--out", out)
    err = bad(res, f"--samples {DIGITS_TEST + 1}", f"the {DIGITS_TEST} samples of data 'digits' split 'test'")
    assert "retry" not in err
    assert not out.exists()  # no record of a model that never ran


def test_the_one_model_command_refuses_the_same_count_in_the_same_words(tmp_path):
    ckpt = copy_demo(tmp_path)
    one = bad(invoke("gini", ckpt, "--spec", SPEC, "--data", "digits", "--split", "test",
                     "--samples", DIGITS_TEST + 1))
    many = bad(invoke("scan", "--checkpoints", folder(tmp_path), "--data", "digits", "--split", "test",
                      "--samples", DIGITS_TEST + 1, *RUN, "--out", tmp_path / "scan.jsonl"))
    assert one == many


def test_a_preset_on_a_smaller_split_measures_it_whole_and_says_so(tmp_path):
    out = tmp_path / "scan.jsonl"
    res = invoke("scan", "--checkpoints", folder(tmp_path), "--data", "digits", "--split", "test",
                 "--preset", "mls-vs-sharpness", *RUN, "--out", out)
    assert res.exit_code == 0, res.stderr
    got = records(out)
    assert [r["status"] for r in got] == ["ok", "ok"]
    assert {r["settings"]["samples"] for r in got} == {DIGITS_TEST}
    # the count the probe saw, not only the one the settings name
    assert {r["meta"]["data"]["samples"] for r in got} == {DIGITS_TEST}
    said = [line for line in res.stderr.splitlines() if "--preset mls-vs-sharpness" in line]
    assert len(said) == 1 and f"all {DIGITS_TEST}" in said[0] and "1000" in said[0], res.stderr


def test_a_preset_resumed_on_a_smaller_split_finds_its_records(tmp_path):
    """The whole split is the count the records hold, so a resume counts them done."""
    ckpts, out = folder(tmp_path), tmp_path / "scan.jsonl"
    args = ["scan", "--checkpoints", ckpts, "--data", "digits", "--split", "test", "--preset",
            "mls-vs-sharpness", *RUN, "--out", out, "-q"]
    assert invoke(*args).exit_code == 0
    again = invoke(*args, "--resume")
    assert again.exit_code == 0, again.stderr
    assert "nothing left to do" in again.stdout
    assert len(records(out)) == 2


def test_a_preset_on_a_larger_split_keeps_its_count(tmp_path):
    """The paper's 1000 where the data has them: the settings, and so the fingerprints of scans
    made before the whole-split fallback, are unchanged."""
    out = tmp_path / "scan.jsonl"
    res = invoke("scan", "--checkpoints", folder(tmp_path), "--data", "digits", "--preset", "mls-vs-sharpness",
                 *RUN, "--out", out)
    assert res.exit_code == 0, res.stderr
    assert "--preset mls-vs-sharpness" not in res.stderr
    assert {(r["settings"]["samples"], r["meta"]["data"]["samples"]) for r in records(out)} == {(1000, 1000)}
