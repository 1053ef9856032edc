"""Docstrings and comments cite papers by author and year: a reader of the repository has no
copy of the files the papers were first read from, so a pointer to one leads nowhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("src", "tests", "benchmarks", "tools")
# "seed 002" or "seeds 000" naming a paper file, and the files' own names (NNN_<16 hex digits>)
PAPER_FILE = re.compile(r"\bseeds? ?00\d\b|\b\d{3}_[0-9a-f]{16}\b|shared/seeds", re.IGNORECASE)


def _sources() -> list[Path]:
    files = [p for d in SCANNED for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in (".py", ".md", ".yaml", ".toml") and p.resolve() != Path(__file__).resolve()]
    return [p for p in files if ".egg-info" not in str(p)]


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
