"""The `flatcheck` command: the app that registers the commands of flatcheck.commands (each
module declares its own with flatcheck.commands.kit) and turns click's usage errors into the
CLI's one `error:` line.

Commands are thin: parse → RunConfig → api.run → render → exit code (commands/kit.py).
Results go to stdout; progress, warnings and errors to stderr. Exit codes: 0 ok,
1 gate failed, 2 bad input, 101 internal error (130 on Ctrl-C).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from . import commands
from .commands import kit
from .commands.coerce import plain_coercion
from .errors import interrupted

# called once a command is built, its modules imported: the process entry point (entry.main)
# turns the garbage collector back on here; a CLI runner in a test process adds nothing
WHEN_BUILT: list[Any] = []


class _Commands(TyperGroup):
    """The CLI's command group. Besides the commands registered on `app`, it serves commands
    that providers build only when first asked for (the probes' own commands, `flatcheck
    trace` …, generated from their Options by flatcheck.commands.probes), so that importing
    the CLI imports no probe and no torch. A provider registers itself with
    kit.lazy_commands; the list in --help reads each one's help without building it."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return names + [n for lazy in kit.LAZY for n in lazy.names() if n not in names]

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        if command is None:
            for lazy in kit.LAZY:
                if name in lazy.names():
                    command = _BUILT.get(name) or _BUILT.setdefault(name, lazy.build(name))
                    break
        for hook in WHEN_BUILT:  # the command's modules (torch with a probe's) are imported
            hook()
        return command if command is None else plain_coercion(command, ctx)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        plain_coercion(self, ctx)  # the group's own options (--help)
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # click cuts each command's help to ~45 characters or at its first period, mid-sentence
        # ("Run several probes in one pass, e.g."): the list shows the first paragraph whole, wrapped
        rows = []
        for name in self.list_commands(ctx):
            text = _lazy_help(name) if super().get_command(ctx, name) is None else None
            if text is None:
                command = self.get_command(ctx, name)
                if command is None or command.hidden:
                    continue
                text = command.short_help or (command.help or "").split("\n\n")[0].strip()
            rows.append((name, text))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


_BUILT: dict[str, Any] = {}


def _lazy_help(name: str) -> str | None:
    """A lazy command's help line as its provider gives it unbuilt (None: build it to see)."""
    for lazy in kit.LAZY:
        if name in lazy.names():
            return lazy.describe(name)
    return None


app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Loss-landscape geometry of trained checkpoints: Hessian trace, flatness and sensitivity probes. "
         "`flatcheck --version` prints the version.",
)


def _register_commands() -> None:
    """Each module of flatcheck.commands declares its commands (kit.command, kit.probe_command,
    kit.lazy_commands); they are listed in the modules' order, the registered ones first.

    The registered commands are built on first use too, as the probes' are: typer would build
    every command of the app (their options from their signatures, over a hundred) on each run,
    for the one that runs."""
    for info in pkgutil.iter_modules(commands.__path__):
        importlib.import_module(f"{commands.__name__}.{info.name}")
    kit.LAZY.insert(0, kit.Lazy(names=lambda: [r.name for r in kit.REGISTERED], build=_build_registered,
                                describe=_registered_help))


def _registered(name: str) -> kit.Registered:
    return next(r for r in kit.REGISTERED if r.name == name)


def _build_registered(name: str) -> Any:
    registered = _registered(name)
    return kit.click_command(registered.function, name, registered.help)


def _registered_help(name: str) -> str:
    return _registered(name).help.split("\n\n")[0].strip()


@app.callback()
def _group() -> None:
    # a typer app with no command registered on it is no group: the commands are its
    # group's (_Commands), built when asked for
    pass


_register_commands()


# typer ≥ 0.2x carries its own copy of click: its exception classes are those of the module
# that typer's public BadParameter comes from, whichever click that is
_click_errors = importlib.import_module(typer.BadParameter.__module__)


def main() -> int:
    """Run the command; returns its exit code. click's usage errors (a bad value, a missing or
    unknown option or command) become the CLI's one `error:` line, exit 2."""
    if sys.argv[1:] == ["--version"]:  # said here: an option of the app would have typer check every command's
        from .commands.explain import version_cmd

        version_cmd()
        return 0
    try:
        code = app(standalone_mode=False)
    except getattr(_click_errors, "NoArgsIsHelpError", ()) as exc:  # bare `flatcheck`: the help
        exc.show()
        return exc.exit_code
    except _click_errors.UsageError as exc:
        kit.error_line(_usage_message(exc))
        return exc.exit_code
    except _click_errors.ClickException as exc:
        kit.error_line(f"error: {exc.format_message()}")
        return exc.exit_code
    except typer.Abort:  # click's end of input at a prompt (flatcheck asks none): a user stopping it
        return interrupted()
    # non-standalone click returns typer.Exit's code, or else the command's return value
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def _usage_message(exc: Exception) -> str:
    """click's Usage/Try/Error lines as one: the flag at fault, what was wrong, where help is."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    param = getattr(exc, "param", None)
    if isinstance(exc, _click_errors.MissingParameter) or param is None or not exc.message:
        what = exc.format_message()
    else:
        what = f"{kit.param_flag(param)}: {exc.message}"
    what = what.rstrip(".")
    return f"error: {what[:1].lower()}{what[1:]}{where}"
