"""Docstrings, comments and the documentation point only at what the repository holds.

Papers are cited by author and year: a reader of the repository has no copy of the files the papers
were first read from, so a pointer to one leads nowhere. For the same reason no comment, docstring or
page points at the specification, the issue tracker or design notes the repository does not hold
("SPEC probe 1", "issue 16 §5", "interfaces §1"): the reason itself belongs in the text.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src", "tests", "benchmarks", "tools")
# "seed 002" or "seeds 000" naming a paper file, and the files' own names (NNN_<16 hex digits>)
PAPER_FILE = re.compile(r"\bseeds? ?00\d\b|\b\d{3}_[0-9a-f]{16}\b|shared/seeds", re.IGNORECASE)
# the specification by name (not the SPEC metavar of `--spec SPEC`, `SPEC.yaml`), an issue by number,
# a section of design notes, or a paper file by its number ("003 §5.1")
OUTSIDE = re.compile(r"(?<!--spec )\bSPEC\b(?![._=-]\w)|\bissues? ?#?\d|\binterfaces? §|\b0\d\d ?§")
# prose a reader is sent to: the docs, the README, examples and the benchmarks' own notes (the result
# records under benchmarks/results are what past runs printed, kept as they were)
PROSE = ("README.md", "docs", "examples", "model_specs", "benchmarks/README.md", "Makefile", ".ci/run",
         "mkdocs.yml", "pyproject.toml")


def _sources() -> list[Path]:
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in (".py", ".md", ".yaml", ".toml") and p.resolve() != Path(__file__).resolve()]
    return [p for p in files if ".egg-info" not in str(p)]


def _explanations(path: Path) -> list[tuple[int, str]]:
    """The lines of a Python file that explain rather than run: its comments and the string
    statements (docstrings included), as (line number, text)."""
    text = path.read_text(encoding="utf-8")
    lines: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            lines.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines += [(node.lineno + i, line) for i, line in enumerate(node.value.value.splitlines())]
    return lines


def _prose_files() -> list[Path]:
    out: list[Path] = []
    for name in PROSE:
        path = ROOT / name
        if path.is_dir():
            out += [p for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in (".md", ".yaml", ".yml", ".py")]
        elif path.is_file():
            out.append(path)
    return out


def _outside_pointers() -> list[str]:
    found = []
    code = [p for p in _sources() if p.suffix == ".py" and "benchmarks/results" not in p.as_posix()]
    shell = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*.sh"))]
    for path in code:
        found += [(path, n, line) for n, line in _explanations(path) if OUTSIDE.search(line)]
    prose = [p for p in _prose_files() if p not in code]
    for path in prose + shell:
        lines = path.read_text(encoding="utf-8").splitlines()
        if path.suffix == ".py":
            numbered = _explanations(path)
        elif path.suffix in (".md",):
            numbered = list(enumerate(lines, 1))
        else:  # YAML, shell, Makefile, TOML: their comments
            numbered = [(n, line[line.index("#"):]) for n, line in enumerate(lines, 1) if "#" in line]
        found += [(path, n, line) for n, line in numbered if OUTSIDE.search(line)]
    return [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p, n, line in found]


def test_no_paper_is_cited_by_a_file_the_repository_does_not_hold():
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in _sources()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if PAPER_FILE.search(line)]
    assert not found, "cite these by author and year:\n" + "\n".join(found)


def test_the_pattern_finds_what_it_is_for():
    hits = ["(seed 002 App. F)", "Seed 000's decomposition", "see 004_cecf6a5d295c11d1.txt",
            "/work/shared/seeds/001.txt"]
    misses = ["seed 0 and seed 1", "--seed 42", "Chen et al. 2023 App. F", "seeds 0-19"]
    assert all(PAPER_FILE.search(s) for s in hits)
    assert not any(PAPER_FILE.search(s) for s in misses)


@pytest.mark.workflow
def test_no_comment_docstring_or_page_points_at_a_document_the_repository_does_not_hold():
    found = _outside_pointers()
    assert not found, "say the reason here instead of pointing elsewhere:\n" + "\n".join(found)


def test_the_outside_pattern_finds_what_it_is_for():
    hits = ['"""Probe 1 (SPEC): Tr(H)', "(SPEC probe 7)", 'SPEC "Diagnostics"', "the SPEC defines A",
            "issue 16 §5", "(issue 19)", "issues 16 and 17", "issue #7", "the callback of interfaces §1",
            "as in 003 §5.1", "SPEC §4"]
    misses = ["flatcheck gate CKPT --spec SPEC --data DATA", "--spec SPEC.yaml", "SPEC_FIELDS",
              "Chen et al. 2023 §4.3, App. F", "Granziol 2020 §3.2", "an issue with the data",
              "pytorch/pytorch#196700", "spec file"]
    assert all(OUTSIDE.search(s) for s in hits), [s for s in hits if not OUTSIDE.search(s)]
    assert not any(OUTSIDE.search(s) for s in misses), [s for s in misses if OUTSIDE.search(s)]


def test_comments_and_docstrings_are_found_but_code_is_not(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Module (issue 1)."""\nSPEC = 1  # a comment, SPEC probe 2\n'
                    'def f():\n    """f\'s docstring\n    second line"""\n    return "issue 3"\n', encoding="utf-8")
    lines = dict(_explanations(path))
    assert lines[1] == "Module (issue 1)." and "SPEC probe 2" in lines[2] and lines[5].strip() == 'second line'
    assert not any("issue 3" in text for text in lines.values())


def test_the_readme_is_a_front_page_whose_links_lead_somewhere():
    """The README says what flatcheck is and where to read on; the manual is docs/ (built by
    `make docs`, whose strict build checks the pages' own links). The README's links are checked
    here, since no build reads it."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"^[a-z]+:", t)]
    assert local, "the README links no page"
    assert not [t for t in local if not (ROOT / t).exists()], "README links to missing files"
    for command in ("make demo", "make test", "make test-all"):
        assert command in text
