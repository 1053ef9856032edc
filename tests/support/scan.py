"""`flatcheck scan` as the tests run it: timm's tiny test models on 8 synthetic samples, and the
scan file read back line by line."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.cli import invoke


FAST = ["--data", "synthetic", "--samples", "8", "--batch-size", "8", "-q"]
CHEAP = ["test_resnet", "test_convnext", "test_efficientnet", "test_byobnet"]


def models_file(folder: Path, names: list[str]) -> Path:
    path = folder / "models.txt"
    path.write_text("# tiny timm models\n" + "\n".join(names) + "\n")
    return path


def lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]  # every line is whole JSON


def scan(*args):
    return invoke("scan", *FAST, *args)


def subprocess_env(**extra) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}
    env.pop("FLATCHECK_DATA_ROOT", None)
    return env
