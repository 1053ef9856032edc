"""`flatcheck PROBE`: one command per registered probe, generated from its Options dataclass.

Each field of the probe's Options (flatcheck.probes._kit.option) becomes one flag with the
field's default, help and aliases, so that `flatcheck trace --rtol X` and
`flatcheck probe --probes trace -o trace.rtol=X` read the same declaration and cannot drift.

The commands are built when first asked for (cli's command group), not when the CLI is
imported: building one imports its probe module, and with it torch, which `flatcheck --help`
of another command, `version` or `report` should not pay for.
"""

from __future__ import annotations

import dataclasses
import inspect
import pkgutil
import typing
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ..cli import lazy_commands

# typer understands these; Literal[...] becomes str (the Options' own check names the choices)
_SIMPLE = (bool, int, float, str)


def command_names() -> list[str]:
    """The probes' command names, from the probe modules' file names (probe `head-trace` lives
    in head_trace.py, which tests/test_options.py checks), without importing them."""
    folder = Path(__file__).resolve().parent.parent / "probes"
    return sorted(info.name.replace("_", "-") for info in pkgutil.iter_modules([str(folder)])
                  if info.name != "registry" and not info.name.startswith("_"))


def build(name: str) -> Any:
    """The click command of probe `name`."""
    from ..cli import Checkpoint, command_from
    from ..probes._kit import COMMAND, layers_field
    from ..probes.registry import get_probe_class

    cls = get_probe_class(name)
    fields = dataclasses.fields(cls.Options)
    fixed = {f.name: f.metadata[COMMAND] for f in fields if COMMAND in f.metadata}
    own = [inspect.Parameter("checkpoint", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Checkpoint)]
    hints = typing.get_type_hints(cls.Options)
    own += [option_parameter(f, hints[f.name]) for f in fields if f.name not in fixed]
    switch = layers_field(cls.Options)
    render_only = switch is None and getattr(cls, "shows_layers", False)
    if render_only:  # the table's parts are computed anyway: the switch only shows them
        own.append(inspect.Parameter(
            "layers", inspect.Parameter.KEYWORD_ONLY, default=True,
            annotation=Annotated[bool, typer.Option("--layers/--no-layers", help="show the per-layer parts")]))

    def command(checkpoint: Path, **values: Any) -> tuple:
        layers = values.pop("layers") if render_only else bool(values.get(switch, False)) if switch else False
        return [name], {name: {**given_only(values), **fixed}}, layers

    command.__signature__ = inspect.Signature(own)  # type: ignore[attr-defined]
    return command_from(command, name, getattr(cls, "command_help", None) or cls.summary, budget=True)


def given_only(values: dict[str, Any]) -> dict[str, Any]:
    """The options typed on the command line, without the ones left at their defaults: the
    Options dataclass has the same defaults, and its check of options that contradict each
    other (an estimator that ignores a flag) must see only what the user asked for, as with
    `-o` (registry.parse_options)."""
    from ..cli import TYPED

    typed = TYPED.get()
    return {k: v for k, v in values.items() if k in typed}


def option_parameter(field: dataclasses.Field, hint: Any) -> inspect.Parameter:
    """The typer parameter of one Options field: its flags, help, type and default."""
    from ..probes._kit import HELP, PARSE, SHOW, flag_names

    meta = field.metadata
    default = field.default
    if PARSE in meta:  # read as text and parsed by the field's own reader (registry.parse_options)
        kind: Any = Optional[str]
        default = meta.get(SHOW, default if default is None else str(default))
    else:
        kind = cli_type(hint)
    show = meta.get(SHOW)
    info = typer.Option(*flag_names(field), help=meta.get(HELP, ""),
                        **({"show_default": show} if show is not None else {}))
    return inspect.Parameter(field.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, info])


def cli_type(hint: Any) -> Any:
    """The type typer parses a field's value as: the field's own, Literal as str, Optional kept."""
    args = typing.get_args(hint)
    optional = type(None) in args
    if optional:
        hint = next(a for a in args if a is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        hint = str
    if hint not in _SIMPLE:
        raise TypeError(f"an Options field of type {hint!r} has no command-line form")
    return Optional[hint] if optional else hint


lazy_commands(command_names, build)
