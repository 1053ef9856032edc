"""Which named data sets read files under a data root, and which files, known without
importing torch: a run missing its root or the files under it is told so before the seconds
of importing torch and loading the model."""

from __future__ import annotations

import os
from pathlib import Path

ROOT_ENV = "FLATCHECK_DATA_ROOT"
ROOT_HELP = f"then pass --data-root or set {ROOT_ENV}"
# the built-in sources (data.builtin) that read a downloaded copy under the root
NEEDS_ROOT = ("cifar10", "cifar100", "mnist", "fashion-mnist", "svhn")
# the built-in sources that read one path, and what it must be
PATH_KINDS = {"imagefolder": "folder", "npz": "file"}


def missing_root(data: str, root: str | None, split: str = "train") -> str | None:
    """The one-line problem with `--data data --data-root root --split split`, or None: a
    source that reads under a root given none (nor $FLATCHECK_DATA_ROOT), a root that is no
    folder, a root that lacks the files the split is read from, or the folder or file of
    imagefolder:PATH or npz:PATH not there."""
    name, sep, path = data.strip().partition(":")
    name = name.lower().replace("_", "-")
    if sep and name in PATH_KINDS:  # said as the sources say it (data.builtin)
        found = os.path.expanduser(path)
        if path and not (os.path.isdir(found) if name == "imagefolder" else os.path.isfile(found)):
            return f"{data.strip()}: {PATH_KINDS[name]} {found} not found"
        return None
    if name not in NEEDS_ROOT:
        return None
    given = str(root) if root else os.environ.get(ROOT_ENV) or None
    if given is None:
        return f"data '{name}' needs a data root holding its downloaded files: {ROOT_HELP}"
    flag = "--data-root" if root else f"${ROOT_ENV}"
    if not os.path.isdir(os.path.expanduser(given)):
        what = "is not a folder" if os.path.exists(os.path.expanduser(given)) else "does not exist"
        return f"{flag} {given}: {what}"
    # a split the settings refuse is said by them, in their words
    return missing_files(name, Path(given).expanduser(), split) if split in ("train", "test") else None


def refuse_missing(data: str, root: str | os.PathLike | None, split: str = "train") -> None:
    """Raise missing_root's problem as a DataError: before a model is built and its checkpoint
    read, which on a large model takes seconds."""
    problem = missing_root(data, None if root is None else str(root), split)
    if problem is not None:
        from ..errors import DataError

        raise DataError(problem)


# what data.builtin reads under the root, by source: CIFAR's batch files by split, the idx
# files of MNIST-like sets (all four, whichever split: torchvision's reader wants them all,
# or its older processed/*.pt pair), SVHN's .mat file of the split
_CIFAR = {"cifar10": ("CIFAR10", "cifar-10-batches-py", {"train": [f"data_batch_{i}" for i in range(1, 6)],
                                                         "test": ["test_batch"]}),
          "cifar100": ("CIFAR100", "cifar-100-python", {"train": ["train"], "test": ["test"]})}
_IDX = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def missing_files(name: str, root: Path, split: str) -> str | None:
    """The files of source `name`'s split that `root` lacks, in data.builtin's words (its own
    check stays, for a library call and for a file removed meanwhile), or None."""
    if name in _CIFAR:
        tv_class, folder, files = _CIFAR[name]
        first = next((root / folder / f for f in files.get(split, ()) if not (root / folder / f).is_file()), None)
        return None if first is None else f"data '{name}': expected {first} (not found); {download_hint(tv_class)}, {ROOT_HELP}"
    if name in _IDX:
        raw, legacy = root / _IDX[name] / "raw", root / _IDX[name] / "processed"
        missing = [f for f in IDX_FILES if not (raw / f).is_file()]
        if not missing or all((legacy / f).is_file() for f in ("training.pt", "test.pt")):
            return None
        gz = " (found .gz files: decompress them)" if (raw / (missing[0] + ".gz")).is_file() else ""
        return (f"data '{name}': expected {', '.join(str(raw / f) for f in missing)} (not found){gz}; "
                f"{download_hint(_IDX[name])}, {ROOT_HELP}")
    if name == "svhn":
        mat = root / f"{split}_32x32.mat"
        return None if mat.is_file() else (f"data 'svhn': expected {mat} (not found); "
                                           f"{download_hint('SVHN', f'split={split!r}, ')}, {ROOT_HELP}")
    return None


def download_hint(tv_class: str, split: str = "") -> str:
    """How to get torchvision's files of `tv_class` (`split`: its split argument and a comma)."""
    return f"download it once with torchvision.datasets.{tv_class}(root, {split}download=True) on a machine with network"


def argv_data_problem(argv: list[str]) -> str | None:
    """missing_root for a command line's --data, --data-root and --split (either `--flag V`
    or `--flag=V`); None when it names no --data."""
    values: dict[str, str] = {}
    for i, arg in enumerate(argv):
        for flag in ("--data", "--data-root", "--split"):
            if arg == flag and i + 1 < len(argv):
                values[flag] = argv[i + 1]
            elif arg.startswith(flag + "="):
                values[flag] = arg[len(flag) + 1:]
    if "--data" not in values:
        return None
    return missing_root(values["--data"], values.get("--data-root"), values.get("--split", "train"))
