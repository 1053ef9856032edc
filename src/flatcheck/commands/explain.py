"""`flatcheck explain PROBE`: what a probe measures, its definition, units, how to read it, the
source paper, its cost in products, and its knobs (read from the probe's Options, so the list is
the command's own flags)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from ..cli import app, guarded


@app.command("explain", help="Explain a probe: what it measures, its definition and units, what a large or small "
                             "value means and what moves it, the source paper, its cost and its options.")
def explain_cmd(
    probe: Annotated[str, typer.Argument(help="a probe's name, as list-probes shows it", show_default=False)],
) -> None:
    guarded(False, lambda: print(explanation_text(probe)))


def explanation_text(name: str) -> str:
    from ..errors import ConfigError
    from ..probes._explain import EXPLANATIONS
    from ..probes.registry import get_probe_class, list_probes

    names = list_probes()
    if name not in names:
        raise ConfigError(f"explain: no probe {name!r}; the probes are {', '.join(names)}")
    cls, text = get_probe_class(name), EXPLANATIONS[name]
    sections = [
        (f"{name}", cls.summary),
        ("What it measures", text.measures),
        ("Definition", text.definition),
        ("Units", text.units),
        ("Large", text.large),
        ("Small", text.small),
        ("What moves it", text.moves),
        ("Source", text.source),
        ("Cost", text.cost),
    ]
    out = [f"{title}\n{_indent(body)}" for title, body in sections]
    knobs = "\n".join(_knob(f) for f in dataclasses.fields(cls.Options)) or "  none"
    out.append(f"Options\n{_indent(f'flags of `flatcheck {name}`; in `flatcheck probe`: -o {name}.KEY=VALUE')}\n"
               + knobs)
    return "\n\n".join(out)


def _knob(field: dataclasses.Field) -> str:
    from ..probes._kit import COMMAND, HELP, SHOW, flag_names

    meta = field.metadata
    shown: Any = meta.get(SHOW, field.default)
    help = meta.get(HELP, "")
    flags = " / ".join(flag_names(field)) if COMMAND not in meta else "no flag of its own"
    # a None default is described by the help's own "[default: …]"
    default = "" if shown is None and "[default" in help else f", default {shown}"
    return _indent(f"{flags} (key {field.name}{default}): {help}", hang=4)


def _indent(text: str, hang: int = 0) -> str:
    import shutil
    import textwrap

    width = min(shutil.get_terminal_size((80, 24)).columns, 100) - 2
    return textwrap.fill(text, width=width, initial_indent="  ", subsequent_indent=" " * (2 + hang),
                         break_on_hyphens=False)
