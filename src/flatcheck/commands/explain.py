"""What flatcheck offers, without running anything: `flatcheck explain PROBE` (what a probe
measures, its definition, units, how to read it, the source paper, its cost in products, and
its knobs, which are the command's own flags), `list-probes` and `version`.

They read the probes' catalogue (probes/catalogue.py), not the probes, so that they answer
without importing torch.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .kit import command, console, guarded


@command("explain", help="Explain a probe: what it measures, its definition and units, what a large or small "
                         "value means and what moves it, the source paper, its cost and its options.")
def explain_cmd(
    probe: Annotated[str, typer.Argument(help="a probe's name, as list-probes shows it", show_default=False)],
) -> None:
    guarded(False, lambda: print(explanation_text(probe)))


@command("list-probes", help="List the probes flatcheck offers.")
def list_probes_cmd() -> None:
    from rich.table import Table

    from ..probes.catalogue import current

    table = Table("probe", "what it measures")
    for name, entry in sorted(current().items()):
        table.add_row(name, entry["summary"])
    console().print(table)


@command("version", help="Print the flatcheck version.")
def version_cmd() -> None:
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    try:  # torch's version as installed, without importing it
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "not installed"
    print(f"flatcheck {__version__} (torch {torch_version})")


def explanation_text(name: str) -> str:
    from ..errors import ConfigError
    from ..probes.catalogue import current
    from ..probes.explanations import EXPLANATIONS

    catalogue = current()
    if name not in catalogue:
        raise ConfigError(f"explain: no probe {name!r}; the probes are {', '.join(sorted(catalogue))}")
    entry, text = catalogue[name], EXPLANATIONS[name]
    sections = [
        (f"{name}", entry["summary"]),
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
    knobs = "\n".join(_knob(option) for option in entry["options"]) or "  none"
    out.append(f"Options\n{_indent(f'flags of `flatcheck {name}`; in `flatcheck probe`: -o {name}.KEY=VALUE')}\n"
               + knobs)
    return "\n\n".join(out)


def _knob(option: dict[str, Any]) -> str:
    shown, help = option["default"], option["help"]
    flags = " / ".join(option["flags"]) if option["flags"] is not None else "no flag of its own"
    # a None default is described by the help's own "[default: …]"
    default = "" if shown is None and "[default" in help else f", default {shown}"
    return _indent(f"{flags} (key {option['key']}{default}): {help}", hang=4)


def _indent(text: str, hang: int = 0) -> str:
    import shutil
    import textwrap

    width = min(shutil.get_terminal_size((80, 24)).columns, 100) - 2
    return textwrap.fill(text, width=width, initial_indent="  ", subsequent_indent=" " * (2 + hang),
                         break_on_hyphens=False)
