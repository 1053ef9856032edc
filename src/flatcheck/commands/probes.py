"""`flatcheck PROBE`: one command per registered probe, generated from its Options dataclass.

Each field of the probe's Options (flatcheck.probes.kit.option) becomes one flag with the
field's default, help and aliases, so that `flatcheck trace --rtol X` and
`flatcheck probe --probes trace -o trace.rtol=X` read the same declaration and cannot drift.

The commands are built when first asked for (cli's command group), not when the CLI is
imported: building one imports its probe module, and with it torch, which `flatcheck --help`
of another command, `version` or `report` should not pay for; their help lines come from the
probes' catalogue (probes/catalogue.py). `flatcheck probe` runs several probes in one pass.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from .kit import Checkpoint, TYPED, command_from, lazy_commands, probe_command

# typer understands these; Literal[...] becomes str (the Options' own check names the choices)
_SIMPLE = (bool, int, float, str)


def command_names() -> list[str]:
    """The probes' command names, from their catalogue: no probe is imported while it is
    current (else they are, once, and what they say is cached)."""
    from ..probes.catalogue import current

    return sorted(current())


def build(name: str) -> Any:
    """The click command of probe `name`."""
    from ..probes.kit import COMMAND, layers_field
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
    typed = TYPED.get()
    return {k: v for k, v in values.items() if k in typed}


def option_parameter(field: dataclasses.Field, hint: Any) -> inspect.Parameter:
    """The typer parameter of one Options field: its flags, help, type and default."""
    from ..probes.kit import HELP, PARSE, SHOW, flag_names

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


def describe(name: str) -> str | None:
    """Probe `name`'s command help line, from the stored catalogue (None when it is stale)."""
    from ..probes.catalogue import stored

    entry = (stored() or {}).get(name)
    return None if entry is None else entry["command_help"]


lazy_commands(command_names, build, describe)


@probe_command("probe", help="Run several probes in one pass, e.g. --probes trace,gini.", budget=True)
def probe_cmd(
    checkpoint: Checkpoint,
    probes: Annotated[str, typer.Option("--probes", help="comma-separated probe names (see list-probes); gap is "
                                         "skipped when the data has no second split")] = "trace,gini,gap",
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="PROBE.KEY=VALUE, repeatable, "
                                                          "e.g. -o trace.estimator=hutchpp")] = None,
    layers: Annotated[bool, typer.Option("--layers/--no-layers", help="per-layer parts: computed and shown "
                                         "(off: a probe's per-layer option, e.g. trace.parts, is off too "
                                         "unless -o sets it)")] = False,
):
    from ..config import parse_option_assignments, probe_names
    from ..probes.kit import layers_field
    from ..probes.registry import get_probe_class

    options = parse_option_assignments(option or [])
    # the one difference from the single-probe commands: parts are computed only when shown
    for name in probe_names(probes):
        switch = layers_field(get_probe_class(name).Options)
        if switch is not None:
            options.setdefault(name, {}).setdefault(switch, layers)
    return probes, options, layers
