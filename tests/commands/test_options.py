"""One source of truth for options: every probe's command is generated from its
Options dataclass, so `flatcheck PROBE --flag` and `flatcheck probe -o PROBE.key=` take the
same keys with the same defaults; and --budget reaches every probe command."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest
import typer

from flatcheck.cli import app
from flatcheck.commands.kit import CommandResult, shared_options
from flatcheck.settings import flag_of
from flatcheck.commands.probes import command_names
from flatcheck.config import RunConfig, probe_requests
from flatcheck.errors import ConfigError
from flatcheck.probes.kit import COMMAND, PARSE
from flatcheck.probes.registry import get_probe_class, list_probes, parse_options

# the options every probe command shares (data, model, output …) and the budget
SHARED = {name for name, _, _ in shared_options(budget=True)}


def command(name: str):
    group = typer.main.get_command(app)
    cmd = group.get_command(group.context_class(group), name)
    assert cmd is not None, f"no command {name}"
    return cmd


def own_options(name: str) -> dict[str, click.Option]:
    """The command's options that are not shared by every probe command (name → click option)."""
    # param_type_name, not isinstance: typer may carry its own copy of click
    return {p.name: p for p in command(name).params
            if p.param_type_name == "option" and p.name not in SHARED}


@pytest.mark.parametrize("name", list_probes())
def test_every_probe_has_a_command_whose_options_are_its_o_keys_with_the_same_defaults(name):
    cls = get_probe_class(name)
    fields = {f.name: f for f in dataclasses.fields(cls.Options)}
    flags = own_options(name)
    render_only = {"layers"} if getattr(cls, "shows_layers", False) else set()
    fixed = {n for n, f in fields.items() if COMMAND in f.metadata}
    assert set(flags) - render_only == set(fields) - fixed
    for key, opt in flags.items():
        if key in render_only:
            continue
        # the command's default, read as -o would read it, is the dataclass's default
        given = {} if opt.default is None else {key: opt.default}
        assert getattr(parse_options(name, given), key) == fields[key].default, key
    # a fixed value is what `-o` could set, and differs from the default on purpose
    for key in fixed:
        assert parse_options(name, {key: fields[key].metadata[COMMAND]})


def test_command_names_come_from_the_probe_files_and_name_every_registered_probe():
    assert command_names() == list_probes()
    for name in list_probes():
        assert get_probe_class(name).__module__.rsplit(".", 1)[1] == name.replace("-", "_")


def test_the_aliases_and_the_layers_switch_are_kept():
    trace = own_options("trace")
    assert trace["probes_max"].opts == ["--probes-max", "--max-probes"]
    assert trace["parts"].opts == ["--layers"] and trace["parts"].secondary_opts == ["--no-layers"]
    assert own_options("adaptive-sharpness")["probes_max"].opts == ["--probes-max", "--max-probes"]
    assert own_options("head-trace")["layers"].default is True
    assert own_options("spectrum")["sigma"].default == "auto"


def test_probe_leaves_per_layer_parts_off_unless_layers():
    from flatcheck.commands.probes import probe_cmd

    names, options, layers = probe_cmd(Path("x"), probes="trace,gini", option=None, layers=False)
    assert options["trace"]["parts"] is False and "gini" not in options and not layers
    _, options, _ = probe_cmd(Path("x"), probes="trace", option=None, layers=True)
    assert options["trace"]["parts"] is True
    _, options, _ = probe_cmd(Path("x"), probes="trace", option=["trace.parts=true"], layers=False)
    assert options["trace"]["parts"] == "true"  # -o wins over the switch


def test_parsed_fields_read_the_same_text_from_a_flag_and_from_o():
    assert parse_options("spectrum", {"sigma": "auto"}).sigma is None
    assert parse_options("spectrum", {"sigma": "0.5"}).sigma == 0.5
    assert parse_options("trace", {"rtol": "none"}).rtol is None
    assert _cli_words(lambda: parse_options("spectrum", {"sigma": "wide"})).startswith("--sigma must be")
    for name in list_probes():
        for f in dataclasses.fields(get_probe_class(name).Options):
            if PARSE in f.metadata:
                assert callable(f.metadata[PARSE])


def test_trace_stops_at_5_percent_by_default_but_not_for_fixed_count_estimators():
    assert parse_options("trace", {}).rtol == 0.05
    assert parse_options("trace", {"estimator": "hutchpp"}).rtol is None
    assert parse_options("trace", {"estimator": "exact"}).rtol is None
    with pytest.raises(ConfigError, match="rtol needs estimator hutchinson.*hutchpp takes a fixed probes_max"):
        parse_options("trace", {"estimator": "hutchpp", "rtol": "0.1"})
    # not "a fixed --probes-max": that flag is refused with exact
    with pytest.raises(ConfigError, match="rtol needs estimator hutchinson.*exact has no sampling error"):
        parse_options("trace", {"estimator": "exact", "rtol": "0.1"})


def test_options_an_estimator_would_ignore_are_refused_only_when_given():
    # the exact GGN trace takes no probes, Hutch++ no running stop: a flag for them did nothing
    for given, flag in (({"estimator": "exact", "probes_max": "10"}, "--probes-max"),
                        ({"estimator": "exact", "block_size": "4"}, "--block-size"),
                        ({"estimator": "hutchpp", "min_probes": "20"}, "--min-probes")):
        assert re.search(f"{flag} .*has no effect with --estimator {given['estimator']}",
                         _cli_words(lambda: parse_options("trace", given)))
    assert re.search("--min-probes 50 .* more than --probes-max 10",
                     _cli_words(lambda: parse_options("trace", {"min_probes": "50", "probes_max": "10"})))
    assert re.search("--noise-draws .*has no effect with --method second-order: .*; leave it out or use --method both",
                     _cli_words(lambda: parse_options("adaptive-sharpness", {"method": "second-order",
                                                                             "noise_draws": "64"})))
    assert re.search("--probes-max .*has no effect with --method mc", _cli_words(
        lambda: parse_options("adaptive-sharpness", {"method": "mc", "probes_max": "64"})))
    # a Python caller reads the keywords
    with pytest.raises(ConfigError, match=r"^probes_max \(trace.probes_max\) has no effect with estimator exact"):
        parse_options("trace", {"estimator": "exact", "probes_max": "10"})
    assert parse_options("adaptive-sharpness", {"method": "both", "noise_draws": "64", "probes_max": "8"})
    # the defaults are not the user's: a short run below the default floor is fine
    assert parse_options("trace", {"probes_max": "5"}).min_probes == 10
    assert parse_options("trace", {"estimator": "exact"}).probes_max == 100
    assert parse_options("trace", {"min_probes": "10", "probes_max": "10"}).min_probes == 10


def test_a_probe_command_passes_only_the_flags_typed(tmp_path):
    from typer.testing import CliRunner

    demo = Path(__file__).resolve().parents[2] / "demo" / "digits_cnn.safetensors"
    no_spec = tmp_path / "missing.yaml"  # refused after the options are read: nothing runs
    runner = CliRunner()
    res = runner.invoke(app, ["trace", str(demo), "--spec", str(no_spec), "--estimator", "exact", "--probes-max", "10"])
    assert res.exit_code == 2 and "--probes-max (trace.probes_max) has no effect with --estimator exact" in res.output
    # the defaults it leaves (--probes-max 100, --min-probes 10) pass: the spec is what is missing
    res = runner.invoke(app, ["trace", str(demo), "--spec", str(no_spec), "--estimator", "exact"])
    assert res.exit_code == 2 and "has no effect" not in res.output and "missing.yaml" in res.output


def test_gates_keep_fixed_counts():
    from flatcheck.workflows.gate import parse_gate_config

    gate = parse_gate_config({"rules": [{"field": "trace.value", "max": 1.0}]})
    assert gate.probes["trace"]["rtol"] is None
    gate = parse_gate_config({"probes": {"trace": {"probes_max": 30}}, "rules": [{"field": "trace.value", "max": 1}]})
    assert gate.probes["trace"]["rtol"] is None and gate.probes["trace"]["probes_max"] == 30
    with pytest.raises(ConfigError, match="rtol"):
        parse_gate_config({"probes": {"trace": {"rtol": 0.05}}, "rules": [{"field": "trace.value", "max": 1}]})
    # gate has no budget: its --budget is hidden and only says why
    assert all(p.hidden for p in command("gate").params if p.name == "budget")


def test_budget_must_be_positive():
    requests = probe_requests("gini")
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        # in code the setting is named; the CLI says its flag
        with pytest.raises(ConfigError, match="^budget must be a positive number of seconds") as refused:
            RunConfig(checkpoint=None, spec=Path("s.yaml"), probes=requests, budget=bad)
        assert refused.value.worded(flag_of).startswith("--budget must be a positive number of seconds")
    assert RunConfig(checkpoint=None, spec=Path("s.yaml"), probes=requests, budget=1.5).budget == 1.5


def test_every_probe_command_and_probe_take_budget():
    for name in [*list_probes(), "probe"]:
        assert "budget" in {p.name for p in command(name).params}, name


def test_results_that_render_themselves_are_command_results():
    from flatcheck.workflows.gate import GateOutcome
    from flatcheck.workflows.invariance import InvarianceReport

    for cls in (GateOutcome, InvarianceReport):
        assert {"render", "to_dict", "exit_code"} <= set(dir(cls)), cls
    assert not isinstance(object(), CommandResult)
    assert inspect.isclass(CommandResult)


def _cli_words(call) -> str:
    """The ConfigError `call` raises, worded as the CLI says it (settings as flags)."""
    from flatcheck.settings import flag_of

    with pytest.raises(ConfigError) as caught:
        call()
    return caught.value.worded(flag_of)
