"""The first line a run command writes, before torch is imported (entry.py), and which commands
load a model: what entry's early checks and that line need, kept apart from the progress
display so that reading them imports nothing heavy."""

from __future__ import annotations

import functools
import os

from .progress import PREFIX

# what a checkpoint's file name ends with (models/checkpoint.py reads these)
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")


def starting_line(argv: list[str]) -> str | None:
    """The first line of a run command, written before anything heavy is imported (entry.py):
    what is being loaded. None for commands that load no model (help, list-probes, report …),
    under --quiet, and on ranks other than 0."""
    if len(argv) < 2 or any(a in ("-q", "--quiet", "-h", "--help") for a in argv[1:]):
        return None
    if os.environ.get("RANK", "0") != "0":
        return None
    command = argv[1]
    if command not in run_commands():
        return None
    # a required option left out is an error the parser gives at once: no loading to announce
    needed = REQUIRED.get(command)
    if needed and not any(a == needed or a.startswith(needed + "=") for a in argv[2:]):
        return None
    models = [a for a in argv[2:] if a.lower().endswith(CHECKPOINT_SUFFIXES)]
    what = ", ".join(models[:3]) + (" …" if len(models) > 3 else "") if models else "the model"
    return f"{PREFIX} {command}: starting · importing torch, then loading {what} and the data"


# run commands with a required option (commands/gate.py, commands/scan.py)
REQUIRED = {"gate": "--config", "scan": "--out"}


@functools.cache  # read on every start (entry's early checks, then the progress line): once is enough
def run_commands() -> frozenset[str]:
    """Commands that load a model: every probe's own command and the multi-probe commands. A
    probe's command is named for the module that registers it, found by its `@register_probe`
    line so that nothing is imported (the package also holds the registry, the gating protocol,
    the catalogue and the probes' shared kit, which are no commands)."""
    folder = os.path.join(os.path.dirname(os.path.dirname(__file__)), "probes")
    names = set()
    for f in os.listdir(folder):
        if f.endswith(".py") and not f.startswith("_"):
            with open(os.path.join(folder, f), encoding="utf-8") as fh:
                if any(line.startswith("@register_probe") for line in fh):
                    names.add(f[:-3].replace("_", "-"))
    return frozenset(names | {"probe", "gate", "scan", "invariance", "track"})
