"""`flatcheck explain PROBE`: every registered probe is explained, its knobs are its
Options' own fields and flags, and the text fits 80 columns."""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

from flatcheck.cli import app
from flatcheck.probes.explanations import EXPLANATIONS, Explanation
from flatcheck.probes.kit import flag_names
from flatcheck.probes.registry import get_probe_class, list_probes

RUNNER = CliRunner(env={"COLUMNS": "80", "FORCE_COLOR": None})
PAPERS = ("Anonymous 2025", "Granziol 2020", "Chen et al. 2023", "Taleghani et al. 2026", "MacDonald et al. 2023",
          "Petzka et al. 2021", "Kwon et al. 2021", "Hutchinson 1989", "Ghorbani et al. 2019", "Lanczos 1950")


def test_every_registered_probe_has_an_explanation_and_none_is_orphaned():
    assert set(EXPLANATIONS) == set(list_probes())


@pytest.mark.parametrize("name", list_probes())
def test_explain_every_probe(name):
    result = RUNNER.invoke(app, ["explain", name])
    assert result.exit_code == 0, result.output
    text = result.stdout
    for title in ("What it measures", "Definition", "Units", "Large", "Small", "What moves it", "Source", "Cost",
                  "Options"):
        assert f"\n{title}" in text, title
    entry = EXPLANATIONS[name]
    assert all(getattr(entry, f.name).strip() for f in dataclasses.fields(Explanation))
    assert any(paper in entry.source for paper in PAPERS), entry.source  # cited by author and year
    assert not re.search(r"seed[- ]?0\d\d", text, re.I)  # papers by author and year, not by file
    assert "product" in entry.cost or "pass" in entry.cost
    # the knobs: every Options field by its flag and key, from the dataclass itself
    options = get_probe_class(name).Options
    for field in dataclasses.fields(options):
        assert f"key {field.name}" in text, field.name
        assert flag_names(field)[0] in text or "no flag of its own" in text
    if not dataclasses.fields(options):
        assert text.rstrip().endswith("none")
    assert max(map(len, text.splitlines())) <= 80
    # every flag the prose names is one the probe's command takes ("--power-iters" outlived it)
    helped = RUNNER.invoke(app, [name, "--help"], env={"COLUMNS": "300"})
    assert helped.exit_code == 0, helped.output
    prose = " ".join(getattr(entry, f.name) for f in dataclasses.fields(Explanation))
    for flag in set(re.findall(r"--[a-z][a-z0-9-]*", prose)):
        assert re.search(rf"{flag}\b", helped.stdout), (name, flag)


def test_explain_an_unknown_probe_is_one_line_exit_2():
    result = RUNNER.invoke(app, ["explain", "sharpness"])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith("error: explain: no probe 'sharpness'") and "trace" in result.stderr
    assert "\n" not in result.stderr.strip()
