"""The package's shape: a top level a newcomer can read and no import cycles.

Imports are read from the source with `ast`, function-local ones included: a cycle hidden in
a function body still means two modules that cannot be understood (or moved) one at a time.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
import warnings
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "flatcheck"


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return mods


@functools.cache  # parsed once per process: several tests walk the same trees
def _tree(f: Path) -> ast.Module:
    return ast.parse(f.read_text())


@functools.cache  # parsed once per process: several tests read the same graph, none changes it
def import_graph() -> dict[str, frozenset[str]]:
    """module -> the flatcheck modules its import statements name (anywhere in the file)."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, (f, is_pkg) in mods.items():
        here = m.split(".") if is_pkg else m.split(".")[:-1]
        for node in ast.walk(_tree(f)):
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
    return {m: frozenset(targets) for m, targets in edges.items()}


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


def test_top_level_holds_at_most_ten_modules():
    # the entry points (api, live, cli, entry), the floors (errors, settings, problem) and
    # the few modules every layer shares (config, losses, operators)
    top = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= 10, top


def test_specs_that_name_the_zoo_still_import():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import flatcheck.zoo.demo_cnn  # noqa: F401  shipped and users' specs name flatcheck.zoo.*


# The package's units (a top-level module or a subpackage) from the bottom up: each imports
# only units below it (zoo: the shipped models, plain torch). The floors (errors, settings, problem) hold what every layer shares —
# the error tree, the declared settings, the problem products are taken on — so that engines
# and backends, probes and the CLI build on them and never on each other's internals.
LAYERS = ["flatcheck", "zoo", "errors", "linalg", "report", "data", "settings", "models", "losses", "problem",
          "engines", "backends", "operators", "probes", "config", "api", "live", "workflows", "commands",
          "cli", "entry", "__main__"]
# what a floor may import, function-local imports included
FLOORS = {
    "flatcheck": set(),  # the package root names its API lazily (PEP 562)
    "flatcheck.errors": set(),
    "flatcheck.settings": {"flatcheck.errors", "flatcheck.linalg", "flatcheck.linalg.memory"},
    "flatcheck.problem": {"flatcheck.errors", "flatcheck.settings", "flatcheck.linalg", "flatcheck.linalg.reduce",
                          "flatcheck.models", "flatcheck.models.spec"},  # the loss spec's type only
}
MAX_LINES = 600


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(edges: dict[str, set[str]], layers: list[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(layers)}
    return sorted(f"{m} -> {t}" for m, targets in edges.items() for t in targets
                  if unit(m) != unit(t) and rank[unit(t)] > rank[unit(m)])


def test_every_unit_has_a_layer():
    assert {unit(m) for m in import_graph()} <= set(LAYERS)


def test_the_layer_check_finds_an_upward_import():
    edges = {"flatcheck.problem": {"flatcheck.backends.base"}, "flatcheck.backends.base": {"flatcheck.problem"}}
    assert upward_imports(edges, LAYERS) == ["flatcheck.problem -> flatcheck.backends.base"]


def test_no_upward_imports():
    assert upward_imports(import_graph(), LAYERS) == []


def test_floors_import_only_floors():
    edges = import_graph()
    for floor, allowed in FLOORS.items():
        assert edges[floor] <= allowed, (floor, sorted(edges[floor] - allowed))


def test_engines_and_backends_share_the_problem_from_its_floor():
    edges = import_graph()
    for m, targets in edges.items():
        if unit(m) == "engines":
            assert not any(unit(t) == "backends" for t in targets), m
    # the problem is defined on its floor, not by the backends
    assert "class Problem" in (PKG / "problem.py").read_text()
    assert "class Problem" not in (PKG / "backends" / "base.py").read_text()


def test_what_other_packages_import_is_public():
    """`_name` means private: no module imports a private module or name of another unit."""
    found = []
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        here = parts[:-1] if is_pkg else parts
        me = ".".join(here)
        for node in ast.walk(_tree(f)):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = here[: len(here) - node.level] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            if not target.startswith("flatcheck") or unit(target) == unit(me):
                continue
            private = [x for x in target.split(".") if x.startswith("_") and not x.startswith("__")]
            private += [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private:
                found.append(f"{me} imports {target}: {private}")
    assert found == []


def test_modules_stay_small():
    big = {str(f.relative_to(SRC)): n for f in PKG.rglob("*.py") if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert big == {}


def test_the_cli_the_settings_and_the_probe_catalogue_import_no_torch():
    code = ("import sys, flatcheck.settings, flatcheck.config, flatcheck.cli, flatcheck.probes.catalogue, "
            "flatcheck.probes.explanations\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"



def test_what_probes_ask_a_backend_is_in_its_protocols():
    """Probes plan by a backend's `limit_memory` and fall back on its `hvp_error` through the
    protocols of backends.base, not by probing for attributes."""
    from flatcheck.backends.base import HvpFailure, LimitMemory
    from tests.support.dense import make_case

    backend = make_case("mlp").backend()
    assert isinstance(backend, LimitMemory) and isinstance(backend, HvpFailure)
    for f in (PKG / "probes").glob("*.py"):
        text = f.read_text()
        assert 'getattr(ctx.backend, "limit_memory"' not in text and 'getattr(ctx.backend, "hvp_error"' not in text, f
