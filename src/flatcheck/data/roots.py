"""Which named data sets read files under a data root, known without importing torch: a run
missing its root is told so before the seconds of importing torch and loading the model."""

from __future__ import annotations

import os

ROOT_ENV = "FLATCHECK_DATA_ROOT"
ROOT_HELP = f"then pass --data-root or set {ROOT_ENV}"
# the built-in sources (data.builtin) that read a downloaded copy under the root
NEEDS_ROOT = ("cifar10", "cifar100", "mnist", "fashion-mnist", "svhn")
# the built-in sources that read one path, and what it must be
PATH_KINDS = {"imagefolder": "folder", "npz": "file"}


def missing_root(data: str, root: str | None) -> str | None:
    """The one-line problem with `--data data --data-root root`, or None: a source that reads
    under a root given none (nor $FLATCHECK_DATA_ROOT), a root that is no folder, or the
    folder or file of imagefolder:PATH or npz:PATH not there."""
    name, sep, path = data.strip().partition(":")
    name = name.lower().replace("_", "-")
    if sep and name in PATH_KINDS:  # said as the sources say it (data.builtin)
        found = os.path.expanduser(path)
        if path and not (os.path.isdir(found) if name == "imagefolder" else os.path.isfile(found)):
            return f"{data.strip()}: {PATH_KINDS[name]} {found} not found"
        return None
    if name not in NEEDS_ROOT:
        return None
    given = root if root else os.environ.get(ROOT_ENV) or None
    if given is None:
        return f"data '{name}' needs a data root holding its downloaded files: {ROOT_HELP}"
    flag = "--data-root" if root else f"${ROOT_ENV}"
    if not os.path.isdir(os.path.expanduser(given)):
        what = "is not a folder" if os.path.exists(os.path.expanduser(given)) else "does not exist"
        return f"{flag} {given}: {what}"
    return None


def argv_data_problem(argv: list[str]) -> str | None:
    """missing_root for a command line's --data and --data-root (either `--flag V` or
    `--flag=V`); None when it names no --data."""
    values: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for flag in ("--data", "--data-root"):
            if arg == flag and i + 1 < len(argv):
                values[flag] = argv[i + 1]
            elif arg.startswith(flag + "="):
                values[flag] = arg[len(flag) + 1:]
    return None if "--data" not in values else missing_root(values["--data"], values.get("--data-root"))
