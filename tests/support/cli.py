"""The command line as the tests drive it: one CliRunner (stdout and stderr apart, fixed width),
the demo checkpoint and spec, and the assertions every CLI test makes of a result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from flatcheck.cli import app
from flatcheck.probes.registry import list_probes


ROOT = Path(__file__).resolve().parents[2]  # the repository
CKPT = ROOT / "demo" / "digits_cnn.safetensors"
SPEC = ROOT / "model_specs" / "demo_digits.yaml"
SMALL = ["--samples", "64", "--batch-size", "32"]
BOX = tuple("┏┃┡│└┗┠┣━─")  # characters a rich table line starts with


def make_runner() -> CliRunner:
    """A runner with stdout and stderr kept apart.

    click < 8.2 mixes them unless mix_stderr=False; click >= 8.2 dropped the argument and
    always keeps result.stdout / result.stderr separate (result.output is the mix).
    Colour is switched off and the width fixed so that tables render the same everywhere.
    """
    env = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "COLUMNS": "120", "FLATCHECK_DATA_ROOT": None}
    try:
        return CliRunner(mix_stderr=False, env=env)  # type: ignore[call-arg]
    except TypeError:
        return CliRunner(env=env)


RUNNER = make_runner()


def invoke(*args: str):
    return RUNNER.invoke(app, [str(a) for a in args])


def ok(result) -> None:
    assert result.exit_code == 0, f"exit {result.exit_code}\nstderr: {result.stderr}\nstdout: {result.stdout}"
    assert "Traceback" not in result.stderr


def as_json(result) -> dict:
    ok(result)
    return json.loads(result.stdout)  # fails if anything but the JSON is on stdout


VOLATILE = ("created", "seconds", "limit_bytes", "graph_allowance_bytes", "memory_limit_bytes")


def strip_volatile(obj):
    """The report minus what differs between identical runs: the wall clock, and the memory
    limit (and what it allows the graphs) that --max-memory's default reads off the free memory."""
    if isinstance(obj, dict):
        return {k: strip_volatile(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [strip_volatile(v) for v in obj]
    return obj


def assert_only_tables(stdout: str) -> None:
    """stdout holds rich tables, their titles and per-probe note lines ("  trace: ..."),
    nothing else (no progress, no messages)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, "nothing on stdout"
    probe_names = set(list_probes())
    lines = [line for line in lines if not (line.startswith("  ") and line.strip().split(":")[0] in probe_names)]
    title_pending = False
    for line in lines:
        if line.lstrip().startswith(BOX):
            if title_pending:
                assert line.lstrip().startswith("┏"), f"title not followed by a table: {line!r}"
            title_pending = False
        else:
            title_pending = True  # a table title: the next box line must open a table
    assert not title_pending, f"stdout ends with a non-table line: {lines[-1]!r}"
    assert lines[-1].lstrip().startswith("└")


def bad(result, *names: str, code: int = 2) -> str:
    """Assert the contract for a refused input and return the message."""
    assert result.exit_code == code, f"exit {result.exit_code}\nstderr: {result.stderr}\nstdout: {result.stdout}"
    assert "Traceback" not in result.stderr + result.stdout
    # progress lines ("flatcheck …": a probe that ended before the error) may come first
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("flatcheck") for line in lines[:-1]), f"more than one line on stderr:\n{result.stderr}"
    err = lines[-1] if lines else ""
    assert err, "nothing on stderr"
    assert err.startswith("error:" if code == 2 else "internal error:"), err
    for name in names:
        assert name in err, f"{name!r} not in {err!r}"
    assert result.stdout == "", f"stdout not empty: {result.stdout!r}"
    return err


# a probe run at its smallest, its report as JSON on stdout
FAST_JSON = ["--samples", "16", "--batch-size", "16", "--probes-max", "2", "--no-layers", "--quiet", "--json", "-"]


def run_json(*args) -> dict:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refused(*args) -> str:
    """The one error line of a command that must exit 2."""
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    return lines[0]


def copy_demo(folder: Path, name: str = "net.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(CKPT, folder / name))
