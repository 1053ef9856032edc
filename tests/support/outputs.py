"""An output path that goes bad while a run is in flight: its folder removed once a step of the
command is done, and the temporary folder the rescued outputs land in (report.io.write_or_rescue)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def lose_folder_after(monkeypatch, module, name: str, tmp_path: Path) -> tuple[Path, Path]:
    """`module.name` runs, then removes a fresh output folder; rescued outputs go to a fresh
    temporary folder. Returns (the output folder, the temporary folder)."""
    folder, spare = tmp_path / "out", tmp_path / "spare"
    folder.mkdir()
    spare.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spare))
    real = getattr(module, name)

    def then_remove(*args, **kwargs):
        result = real(*args, **kwargs)
        shutil.rmtree(folder, ignore_errors=True)
        return result

    monkeypatch.setattr(module, name, then_remove)
    return folder, spare
