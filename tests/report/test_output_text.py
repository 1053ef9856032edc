"""Output a person reads once: whole help texts at 80 columns, tables that wrap
rather than cut, zero within noise said as such, no shares of a total that is noise, and an
invariance table that never says "same" for a rescaling that changed the predictions."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import torch

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from flatcheck.cli import app
from flatcheck.report.render import fmt_estimate, layers_table, render, within_noise
from flatcheck.report.result import ProbeResult, Report
from flatcheck.workflows.invariance import Comparison, InvarianceReport
from flatcheck.workflows.rescale import Rescaling

RUNNER = CliRunner(env={"COLUMNS": "80", "FORCE_COLOR": None, "TTY_COMPATIBLE": None})
META = {"model": {"arch": "flatcheck.zoo.demo_cnn:DigitsCNN", "probed_parameters": 14410, "loss": "cross_entropy"},
        "data": {"name": "digits", "split": "train", "samples": 64}, "bn_mode": "eval", "device": "cpu",
        "dtype": "float32", "seed": 0}


def printed(renderable_or_fn, width: int = 80) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False)
    if callable(renderable_or_fn):
        renderable_or_fn(console)
    else:
        console.print(renderable_or_fn)
    return console.file.getvalue()


# ---------------------------------------------------------------- help texts

def command_names() -> list[str]:
    result = RUNNER.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    section = result.stdout.split("Commands:")[1]
    return re.findall(r"^  ([a-z][a-z-]+)  ", section, re.M)


@pytest.mark.workflow
def test_top_level_help_lists_each_command_with_its_whole_first_paragraph():
    result = RUNNER.invoke(app, ["--help"])
    text = result.stdout
    assert max(map(len, text.splitlines())) <= 80
    section = text.split("Commands:")[1]
    assert not re.search(r"(e\.g\.|\.\.\.)\n", section), section  # click's cut: "Run several probes in one pass, e.g."
    names = command_names()
    assert {"probe", "trace", "gate", "scan", "report", "explain", "invariance"} <= set(names)
    listing = " ".join(text.split("Commands:")[1].split())
    for name in names:
        command = app  # the listed text is the command's own first paragraph, whole
        help_text = RUNNER.invoke(command, [name, "--help"]).stdout
        first = " ".join(help_text.split("\n\n")[1].split())
        assert first in listing, (name, first)


@pytest.mark.parametrize("name", ["probe", "gate", "scan", "report", "invariance", "explain", "trace", "lmax",
                                  "adaptive-sharpness", "mls", "spectrum", "jacobian", "decomposition"])
def test_every_command_help_fits_80_columns_without_jargon(name):
    result = RUNNER.invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    assert not re.search(r"seed[- ]?0\d\d", result.stdout, re.I)
    assert "…" not in result.stdout


def test_report_help_names_the_real_key():
    text = " ".join(RUNNER.invoke(app, ["report", "--help"]).stdout.split())
    assert "normalized_mls" in text and "mls.details.normalized" not in text


# ---------------------------------------------------------------- zero within noise

@pytest.mark.parametrize("value, stderr, zero", [
    (-2.8e-08, 4.2e-08, True), (4.2e-08, 4.2e-08, True), (5e-08, 4.2e-08, False), (42.3, 7.8, False),
    (0.0, 0.0, False), (1.0, None, False), (float("nan"), 1.0, False),
])
def test_within_noise(value, stderr, zero):
    assert within_noise(value, stderr) is zero
    text = fmt_estimate(value, stderr)
    assert text.startswith("0 within noise: ") is zero
    if zero:
        assert text == "0 within noise: -2.800e-08 ± 4.2e-08" or value != -2.8e-08


def trace_result(value: float, stderr: float, parts: dict[str, tuple[float, float]]) -> ProbeResult:
    layers = {name: {"value": v, "stderr": s, "parameters": 100} for name, (v, s) in parts.items()}
    return ProbeResult(probe="adaptive-sharpness", value=value, stderr=stderr, matvecs=16, seconds=1.0, seed=0,
                       label="S_ρ (Monte Carlo)", details={"layers": layers})


def test_summary_says_zero_within_noise_and_layer_shares_are_dropped_for_a_noise_total():
    noisy = trace_result(-2.8e-08, 4.2e-08, {"conv1": (3e-08, 5e-08), "head": (-5.8e-08, 6e-08)})
    text = printed(lambda c: render(Report(meta=META, results={"adaptive-sharpness": noisy}), c), width=160)
    assert "0 within noise: -2.800e-08 ± 4.2e-08" in text
    assert "│ share" not in text and "%" not in text
    assert "no shares: the total is zero within its standard error" in " ".join(text.split())


def test_a_value_its_probe_does_not_stand_behind_is_marked_in_the_table():
    """An lmax short of its tolerance (a Ritz value below λmax by an unknown amount) printed as
    a bare number reads as a result."""
    short = ProbeResult(probe="lmax", value=13.61, stderr=None, matvecs=30, seconds=1.0, seed=0, label="λmax(H)",
                        resolved=False)
    text = printed(lambda c: render(Report(meta=META, results={"lmax": short}), c), width=160)
    assert "13.61 (unresolved)" in text
    done = ProbeResult(probe="lmax", value=13.66, stderr=None, matvecs=40, seconds=1.0, seed=0, label="λmax(H)")
    assert "unresolved" not in printed(lambda c: render(Report(meta=META, results={"lmax": done}), c), width=160)


@pytest.mark.parametrize("dof, rough", [(1, True), (4, True), (5, False), (None, False)])
def test_a_stderr_on_few_degrees_of_freedom_is_marked_rough_in_the_table(dof, rough):
    """spectrum's default 2 starts printed ‖H‖_F "1.187 ± 0.19" where the exact value is 2.155
    (stranger test): a ± on dof 1 looks as precise as one on dof 100. The JSON carried the dof;
    the table now says it where it is below ROUGH_DOF."""
    few = ProbeResult(probe="spectrum", value=1.187, stderr=0.19, dof=dof, matvecs=118, seconds=1.0, seed=0,
                      label="‖H‖_F (SLQ)")
    text = printed(lambda c: render(Report(meta=META, results={"spectrum": few}), c), width=160)
    assert "1.187 ± 0.19" in text
    assert (f"(rough ±: dof {dof})" in text) == rough, text


def test_the_header_says_when_float64_inputs_were_rounded():
    """A float32 run reads float64 inputs as their float32 rounding; the JSON's data.rounded said
    so and the table did not, so a reader of the terminal took the values for the file's own."""
    result = ProbeResult(probe="lmax", value=13.66, stderr=None, matvecs=40, seconds=1.0, seed=0, label="λmax(H)")
    rounded = {**META, "data": {**META["data"], "rounded": "float64 inputs → float32 (--dtype float64 keeps them)"}}
    text = " ".join(printed(lambda c: render(Report(meta=rounded, results={"lmax": result}), c), width=200).split())
    assert "digits/train n=64 (float64 inputs rounded to float32) ·" in text, text
    plain = printed(lambda c: render(Report(meta=META, results={"lmax": result}), c), width=200)
    assert "rounded" not in plain


def test_the_header_says_when_products_ran_with_tf32():
    """TF32 moved the demo's lmax 18 times its certified bound on an H200
    (benchmarks/results/tf32_effect_h200.md): a table from such a run says so beside the dtype."""
    result = ProbeResult(probe="lmax", value=13.66, stderr=None, matvecs=40, seconds=1.0, seed=0, label="λmax(H)")
    tf32 = {**META, "allow_tf32": True}
    text = " ".join(printed(lambda c: render(Report(meta=tf32, results={"lmax": result}), c), width=200).split())
    assert "float32 (TF32) · seed" in text, text
    plain = printed(lambda c: render(Report(meta={**META, "allow_tf32": False}, results={"lmax": result}), c), width=200)
    assert "TF32" not in plain


def test_layer_shares_kept_for_a_resolved_total():
    clear = trace_result(10.0, 0.5, {"conv1": (6.0, 0.4), "head": (4.0, 0.3)})
    text = printed(layers_table(clear))
    assert "60.0%" in text and "40.0%" in text and "no shares" not in text


def test_summary_table_wraps_long_names_at_80_columns():
    long = ProbeResult(probe="adaptive-sharpness", value=1.5, stderr=0.1, matvecs=100, seconds=3.0, seed=0,
                       label="S_ρ second-order (ρ²/2)·Tr(diag|w| H diag|w|) over every probed parameter")
    text = printed(lambda c: render(Report(meta=META, results={"adaptive-sharpness": long}), c))
    assert "…" not in text
    assert max(map(len, text.splitlines())) <= 80
    joined = "".join(text.split())
    assert "adaptive-sharpness" in joined.replace("│", "") and "everyprobedparameter" in joined.replace("│", "")


# ---------------------------------------------------------------- invariance

def invariance(logit_change: float) -> InvarianceReport:
    before = ProbeResult(probe="trace", value=40.0, stderr=2.0, matvecs=8, seconds=1.0, seed=0, label="Tr(H)")
    after = ProbeResult(probe="trace", value=41.0, stderr=2.0, matvecs=8, seconds=1.0, seed=0, label="Tr(H)")
    report = Report(meta=META, results={"trace": before})
    return InvarianceReport(rescaling=Rescaling("relu-pair", "conv1", "conv2", 10.0), max_logit_change=logit_change,
                            logit_tolerance=1e-4, argmax_agreement=1.0 if logit_change < 1e-4 else 0.7,
                            original=report, rescaled=Report(meta=META, results={"trace": after}),
                            comparisons=[Comparison("trace", "Tr(H)", before, after, None, moved=False)])


def test_invariance_never_says_same_when_the_predictions_changed():
    changed = invariance(0.3)
    text = printed(changed.render, width=120)
    assert "same" not in text and "n/a" in text and "CHANGED" in text
    assert changed.to_dict()["comparison"][0]["moved"] is None
    kept = invariance(1e-7)
    text = printed(kept.render, width=120)
    assert "same" in text and "n/a" not in text
    assert kept.to_dict()["comparison"][0]["moved"] is False


# ---------------------------------------------------------------- --weights-dir names, as its help says

@pytest.mark.parametrize("asked, on_disk, found", [
    ("resnet50.a1_in1k", "resnet50.safetensors", True),           # timm's default tag: NAME.safetensors
    ("resnet50", "resnet50.a1_in1k.safetensors", True),           # and the reverse
    ("resnet50.a1_in1k", "resnet50.a1_in1k.safetensors", True),   # the tag-qualified name itself
    ("resnet50.a1_in1k", "resnet50.a1_in1k/model.safetensors", True),
    ("resnet50.a2_in1k", "resnet50.safetensors", False),          # another tag's weights never stand in
])
def test_weights_dir_accepts_name_and_tag_qualified_files(tmp_path, asked, on_disk, found):
    from flatcheck.models.pretrained import find_local_weights

    path = tmp_path / on_disk
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"weights")
    hit, looked = find_local_weights(asked, tmp_path)
    assert (hit == path) is found, (hit, looked)


# ---------------------------------------------------------------- channels: grey ↔ RGB when the spec asks

def test_grey_data_feeds_a_three_channel_model_replicated():
    from flatcheck.data.preprocess import Preprocess
    from flatcheck.data.registry import create_dataset

    grey, rgb = create_dataset("digits"), create_dataset("digits", preprocess=Preprocess(input_size=(3, 8, 8)))
    assert rgb.sample_shape == (3, 8, 8) and rgb.channel_conversion == "grey → RGB (replicated)"
    for i in (0, 7):
        assert all(torch.equal(rgb[i][0][c], grey[i][0][0]) for c in range(3))
    assert grey.channel_conversion is None


def rgb_npz(path, n: int = 40):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 3, 8, 8, generator=g).numpy().astype("float32")
    y = (torch.arange(n) % 10).numpy()
    np.savez(path, x=x, y=y)
    return x


def test_rgb_data_feeds_a_one_channel_model_by_luminance(tmp_path):
    from flatcheck.data.preprocess import Preprocess
    from flatcheck.data.registry import create_dataset

    x = rgb_npz(tmp_path / "rgb.npz")
    ds = create_dataset(f"npz:{tmp_path / 'rgb.npz'}", preprocess=Preprocess(input_size=(1, 8, 8)))
    assert ds.sample_shape == (1, 8, 8) and ds.channel_conversion.startswith("RGB → grey (luminance")
    want = 0.299 * x[3, 0] + 0.587 * x[3, 1] + 0.114 * x[3, 2]  # PIL's convert("L") weights
    assert np.allclose(ds[3][0][0].numpy(), want, rtol=0, atol=4 * np.finfo(np.float32).eps)


def test_no_standard_conversion_is_still_refused():
    from flatcheck.data.preprocess import Preprocess
    from flatcheck.data.registry import create_dataset
    from flatcheck.errors import DataError

    with pytest.raises(DataError, match="needs 2 channels .*grey ↔ RGB"):
        create_dataset("digits", preprocess=Preprocess(input_size=(2, 8, 8)))


def test_the_report_says_it_converted(tmp_path):
    from tests.support.cli import CKPT, SPEC

    rgb_npz(tmp_path / "rgb.npz", n=64)
    args = ["trace", str(CKPT), "--spec", str(SPEC), "--data", f"npz:{tmp_path / 'rgb.npz'}", "--samples", "64",
            "--probes-max", "2", "--no-layers", "-q"]
    table = RUNNER.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "RGB → grey (luminance" in " ".join(table.stdout.split())
    data = json.loads(RUNNER.invoke(app, args + ["--json", "-"]).stdout)["data"]
    assert data["channels"].startswith("RGB → grey (luminance")


def test_an_rgb_image_folder_for_a_grey_model_says_it_converted(tmp_path):
    from PIL import Image

    from flatcheck.data.preprocess import Preprocess
    from flatcheck.data.registry import create_dataset

    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        Image.new("RGB", (8, 8), (200, 100, 50)).save(tmp_path / label / "0.png")
    ds = create_dataset(f"imagefolder:{tmp_path}", preprocess=Preprocess(input_size=(1, 8, 8)))
    assert ds.channel_conversion.startswith("RGB → grey") and ds.sample_shape == (1, 8, 8)
    assert create_dataset(f"imagefolder:{tmp_path}", preprocess=Preprocess(input_size=(3, 8, 8))).channel_conversion \
        is None


@pytest.mark.parametrize("columns, width", [(None, 200), ("120", 120), ("60", 60)])
def test_off_a_terminal_tables_take_the_log_s_width(monkeypatch, columns, width):
    """In a CI log (stdout a pipe) rich would wrap every table at 80 columns, cutting rule
    names mid-word (`max_increas`/`e 20%`): off a terminal the width is $COLUMNS, else wide."""
    from flatcheck.commands.kit import LOG_WIDTH, console

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr("sys.stdout", io.StringIO())  # not a terminal
    out = console()
    assert out.width == width and (columns is not None or width == LOG_WIDTH)
    rule = "max_increase 20% over the baseline's upper bound, per layer and in total"
    table = Table("probe", "rule", "verdict")
    table.add_row("trace", rule, "passed")
    out.print(table)
    text = out.file.getvalue()
    assert (rule in text) == (width >= 120), text
