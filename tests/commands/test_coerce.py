"""What a command run costs before it runs: plain option values coerced without pydantic
(flatcheck.commands.coerce) — the same values, types and messages as typer's own coercion, and
a whole run that never imports pydantic — and only the command that runs built (flatcheck.cli)."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Optional

import pytest
import typer
import typer.main

from flatcheck.commands import coerce
from tests.support.cli import CKPT as DEMO, SPEC as DEMO_SPEC
from tests.support.proc import HANG_GUARD

pytestmark = pytest.mark.skipif(coerce.RuntimeParam is None, reason="this typer has no pydantic coercion layer")


def _command():
    def cmd(name: Optional[str] = None, count: int = 3, rate: float = 0.5, path: Optional[Path] = None,
            flag: bool = False, sets: Optional[list[str]] = None, bounded: int = typer.Option(2, min=1)) -> None:
        """The option types of flatcheck's commands, and one typer must coerce (a range)."""

    app = typer.Typer(add_completion=False)
    app.command()(cmd)
    command = typer.main.get_command(app)
    return command, typer.Context(command)


def _outcome(runtime, value, param, ctx):
    """(type, value) that coercion gives, or the message it refuses with."""
    try:
        out = runtime.coerce(value, param=param, ctx=ctx)
    except typer.BadParameter as exc:
        return "refused", exc.format_message()
    # a float by its text: NaN equals itself and -0.0 differs from 0.0
    return type(out), repr(out) if isinstance(out, float) else out


def _decimals(n: int, seed: int = 0) -> list[str]:
    """Decimal texts of many lengths and exponents: where a parse could round differently."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25)))
        cut = rng.randint(0, len(digits))
        text = f"{'-' if rng.random() < 0.3 else ''}{digits[:cut]}.{digits[cut:]}".rstrip(".") or "0"
        if rng.random() < 0.5:
            text += f"e{rng.randint(-330, 310)}"
        out.append(text)
    return out


VALUES = {
    "name": [None, "", "abc", " spaced ", "-", "ünïcode"],
    "count": [None, 3, "0", "-12", "007", "+7", "1_000", "7.0", " 7", "x", "1e3", "9" * 30],
    "rate": [None, 0.5, 2, "0.05", "1e-3", ".5", "5.", "-0", "1E5", "inf", "nan", "1e400", "0x10", "", "1_0.5",
             *_decimals(500)],
    "path": [None, "", "a//b/", "~/x", "-", ".", "model_specs/demo_digits.yaml", Path("p")],
    "flag": [None, True, False, "1"],
    "sets": [None, (), ("a=1", "b=2"), ["x"]],
    "bounded": [None, 2, "5", "0"],
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(VALUES))
def test_plain_coercion_gives_what_typer_gives(name):
    command, ctx = _command()
    param = next(p for p in command.params if p.name == name)
    kind = coerce._plain_kind(param)
    assert (kind is None) == (name == "bounded")  # a range stays typer's to check
    if kind is None:
        return
    own = coerce.build_runtime_param(param.type_descriptor)
    plain = coerce.PlainRuntimeParam(param, kind)
    for value in VALUES[name]:
        assert _outcome(plain, value, param, ctx) == _outcome(own, value, param, ctx), value


@pytest.mark.unit
def test_every_option_of_a_command_and_its_help_get_the_plain_coercion_but_a_range():
    command, ctx = _command()
    coerce.plain_coercion(command, ctx)
    kinds = {p.name: type(p._runtime_param).__name__ for p in command.get_params(ctx)}
    assert kinds.pop("bounded") == "NoneType"  # built by typer when first needed
    assert set(kinds.values()) == {"PlainRuntimeParam"} and "help" in kinds


@pytest.mark.process
def test_a_probe_run_imports_no_pydantic():
    """typer's coercion imports pydantic; the demo trace's options never need it."""
    import subprocess

    code = ("import sys, atexit; atexit.register(lambda: print('pydantic imported:', 'pydantic' in sys.modules)); "
            f"sys.argv = ['flatcheck', 'trace', {str(DEMO)!r}, '--spec', {str(DEMO_SPEC)!r}, '--data', 'digits', "
            "'--samples', '64', '--probes-max', '2', '--no-layers', '-q']; from flatcheck.entry import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "Tr(H)" in proc.stdout and proc.stdout.strip().endswith("pydantic imported: False"), proc.stdout[-300:]


@pytest.mark.unit
def test_the_app_builds_a_command_only_when_it_is_asked_for():
    """Running one command builds that command's options alone (typer would build every
    registered command's): the group holds none built, lists each in order, builds on request."""
    from flatcheck.cli import app
    from flatcheck.commands.kit import REGISTERED

    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    assert group.commands == {}
    names = group.list_commands(ctx)
    assert names[:len(REGISTERED)] == [r.name for r in REGISTERED] and "trace" in names
    gate = group.get_command(ctx, "gate")
    assert gate.name == "gate" and "--config" in {o for p in gate.params for o in p.opts}
    assert group.get_command(ctx, "gate") is gate  # built once
    assert {type(p._runtime_param).__name__ for p in gate.get_params(ctx) if p.name == "help"} == {
        "PlainRuntimeParam"}
