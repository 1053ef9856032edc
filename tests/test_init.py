"""The package's front: what `dir(flatcheck)` shows is what `__all__` says is public."""

from __future__ import annotations

import subprocess
import sys


def _public_dir(code: str) -> list[str]:
    # a fresh interpreter: this process has imported flatcheck's submodules already
    out = subprocess.run([sys.executable, "-c", code + "\nprint(' '.join(n for n in dir(flatcheck) if not "
                          "n.startswith('_')))"], capture_output=True, text=True, check=True).stdout
    return out.split()


def test_dir_lists_exactly_the_public_names():
    import flatcheck

    assert _public_dir("import flatcheck") == sorted(n for n in flatcheck.__all__ if not n.startswith("_"))


def test_dir_stays_the_public_names_after_a_lookup():
    # a lookup imports submodules, which bind themselves as attributes of the package
    import flatcheck

    names = _public_dir("import flatcheck\nflatcheck.measure, flatcheck.Tracker")
    assert names == sorted(n for n in flatcheck.__all__ if not n.startswith("_"))
    assert "annotations" not in names and "importlib" not in names
