"""The package's shape: a top level a newcomer can read and no import cycles.

Imports are read from the source with `ast`, function-local ones included: a cycle hidden in
a function body still means two modules that cannot be understood (or moved) one at a time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "flatcheck"


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return mods


def import_graph() -> dict[str, set[str]]:
    """module -> the flatcheck modules its import statements name (anywhere in the file)."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, (f, is_pkg) in mods.items():
        here = m.split(".") if is_pkg else m.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                named = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                named = [a.name for a in node.names]
            else:
                continue
            edges[m].update(n for n in named if n in mods and n != m)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_top_level_holds_at_most_eight_modules():
    top = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 8, top


@pytest.mark.parametrize("old, new", [
    ("flatcheck.gate", "flatcheck.workflows.gate"),
    ("flatcheck.inputjac", "flatcheck.probes._inputjac"),
    ("flatcheck.backends.layout", "flatcheck.layout"),
])
def test_a_moved_module_keeps_its_old_path_for_a_release(old, new):
    # a fresh interpreter: the warning is given once, on the first import of the old path
    code = (f"import warnings, importlib\nwarnings.simplefilter('error', DeprecationWarning)\n"
            f"new = importlib.import_module({new!r})\n"
            f"try:\n    importlib.import_module({old!r})\nexcept DeprecationWarning as w:\n    print(w)\n"
            f"warnings.simplefilter('ignore')\nimport sys\nprint(importlib.import_module({old!r}) is new)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert f"{old} moved to {new}" in out and out.strip().endswith("True")


def test_specs_that_name_the_zoo_still_import():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import flatcheck.zoo.demo_cnn  # noqa: F401  shipped and users' specs name flatcheck.zoo.*
