"""`scan --resume` and the schema that wrote a record (reviewer23: a resume after an upgrade kept
the older flatcheck's records as done, schema 2.6 float32 curvature of saturated models beside
2.7 records in one file, and `report` mixed them silently)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from flatcheck.report import SCHEMA_VERSION
from tests.support.cli import invoke
from tests.support.scan import FAST, lines, scan

pytestmark = pytest.mark.workflow  # scans, seconds each: make test-all only

MODELS = ["--timm", "test_resnet", "--timm", "test_convnext", "--probes", "gini"]
MAJOR, MINOR = (int(p) for p in SCHEMA_VERSION.split("."))
OLDER, NEWER = f"{MAJOR}.{MINOR - 1}", f"{MAJOR}.{MINOR + 1}"
LOUD = [a for a in FAST if a != "-q"]  # warnings are said without --quiet only


@pytest.fixture(scope="module")
def scanned(tmp_path_factory) -> bytes:
    """A real scan's file of two models, each test editing a copy of it."""
    out = tmp_path_factory.mktemp("schema") / "s.jsonl"
    res = scan(*MODELS, "--out", out)
    assert res.exit_code == 0, res.stderr
    return out.read_bytes()


def edited(scanned: bytes, folder: Path, schemas: dict[str, str], gini: float | None = None,
           error: bool = False) -> Path:
    """The scan's file with the records of `schemas`' models rewritten as of that schema (and,
    to tell them apart, that gini value, or as a failure), as another flatcheck would have left them."""
    records = [json.loads(line) for line in scanned.decode().splitlines()]
    for rec in records:
        if rec["model"] in schemas:
            rec["schema_version"] = schemas[rec["model"]]
            if gini is not None:
                rec["results"]["gini"]["value"] = gini
            if error:
                rec.update(status="error", error="RuntimeError: out of memory", results={})
    out = folder / "s.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in records))
    return out


def resume(out: Path):
    """A loud `scan --resume`, and the warnings it gave (the CLI says each as one stderr line)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        res = invoke("scan", *LOUD, *MODELS, "--out", out, "--resume")
    return res, [str(w.message) for w in said if "--resume:" in str(w.message)]


def test_a_record_of_an_older_schema_is_measured_again_and_superseded(scanned, tmp_path):
    out = edited(scanned, tmp_path, {"test_resnet": OLDER, "test_convnext": OLDER}, gini=12345.0)
    before = out.read_bytes()
    res, said = resume(out)
    assert res.exit_code == 0, res.stderr
    assert said == [f"--resume: 2 records in {out} are of schema {OLDER}, older than this flatcheck's "
                    f"{SCHEMA_VERSION}, whose numbers may differ from this version's: 2 are measured again, the "
                    "new record superseding the old"]
    # the older lines stay as they were; the new ones follow them
    assert out.read_bytes().startswith(before)
    recs = lines(out)
    assert [(r["model"], r["schema_version"]) for r in recs] == [
        ("test_resnet", OLDER), ("test_convnext", OLDER), ("test_resnet", SCHEMA_VERSION),
        ("test_convnext", SCHEMA_VERSION)]
    # the scan's summary counts what it measured now, none of the older records as done
    summary = " ".join(res.stdout.split())
    assert "2 ok, 0 error, 0 skipped" in summary and "already done" not in summary
    # and `report` shows the new records only, saying it left the older ones out
    rep = invoke("report", out, "--fields", "gini", "--json", "-")
    assert rep.exit_code == 0, rep.stderr
    rows = json.loads(rep.stdout)["models"]
    assert sorted((m["model"], m["values"]["gini"]["value"]) for m in rows) == sorted(
        (r["model"], r["results"]["gini"]["value"]) for r in recs[2:])
    assert all(m["values"]["gini"]["value"] != 12345.0 for m in rows)
    assert "left out 2 superseded records" in rep.stderr and "older schema" in rep.stderr
    # measured again, the models are done: a further resume redoes nothing and says nothing
    after = out.read_bytes()
    res, said = resume(out)
    assert res.exit_code == 0 and said == [] and out.read_bytes() == after, res.stderr


def test_a_record_of_the_current_schema_is_skipped_beside_an_older_one(scanned, tmp_path):
    """Only the older record is measured again: a schema in the fingerprint would have redone
    every record of the file, and a resume that ignores it redoes none."""
    out = edited(scanned, tmp_path, {"test_convnext": OLDER})
    res, said = resume(out)
    assert res.exit_code == 0, res.stderr
    assert len(said) == 1 and said[0].startswith(f"--resume: 1 record in {out} is of schema {OLDER}, older"), said
    assert "1 is measured again" in said[0]
    recs = lines(out)
    assert [(r["model"], r["schema_version"]) for r in recs] == [
        ("test_resnet", SCHEMA_VERSION), ("test_convnext", OLDER), ("test_convnext", SCHEMA_VERSION)]
    assert recs[0] == json.loads(scanned.decode().splitlines()[0])  # the current record, kept as done
    assert "1 ok, 0 error, 0 skipped; 1 already done (1 ok, 0 error, 0 skipped)" in " ".join(res.stdout.split())


@pytest.mark.parametrize("retry", [[], ["--retry-errors"]])
def test_a_record_of_a_newer_schema_refuses_the_resume(scanned, tmp_path, retry):
    """A newer flatcheck's file is left as it wrote it: exit 2, one line, before any model runs;
    its failed record too, which --retry-errors would otherwise measure again over it."""
    out = edited(scanned, tmp_path, {"test_convnext": NEWER}, error=bool(retry))
    before = out.read_bytes()
    res = scan(*MODELS, "--out", out, "--resume", *retry)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert res.stderr == (f"error: --resume: {out} holds 1 record of schema {NEWER} (the first at line 2), newer "
                          f"than this flatcheck's {SCHEMA_VERSION}; continue that scan with the flatcheck that "
                          "wrote it, or give another --out\n")
    assert out.read_bytes() == before


def test_older_records_of_models_the_scan_does_not_name_are_said_to_stay():
    """set_aside_older on its own: records without a schema count as older, and those of models
    this resume does not measure are said to stay (report would still show them)."""
    from flatcheck.workflows.scan import set_aside_older
    from flatcheck.workflows.scan_sources import Entry

    def rec(model, schema):
        return {"model": model, "fingerprint": "f", "step": None, "epoch": None,
                **({"schema_version": schema} if schema else {})}

    done = {(m, "f", None, None): rec(m, s) for m, s in
            (("a", None), ("b", OLDER), ("c", SCHEMA_VERSION), ("gone", OLDER))}
    mine = [Entry(m, "timm", make_spec=lambda: None, describe={}) for m in ("a", "b", "c")]
    said = set_aside_older(done, mine, Path("s.jsonl"))
    assert list(done) == [("c", "f", None, None)]
    assert said == (f"--resume: 3 records in s.jsonl are of schema {OLDER} or none, older than this flatcheck's "
                    f"{SCHEMA_VERSION}, whose numbers may differ from this version's: 2 are measured again, the "
                    "new record superseding the old; 1 more of models this scan does not name stays as written")
    assert set_aside_older(done, mine, Path("s.jsonl")) is None
    # a resume that names none of the older records' models measures none of them again
    done = {("gone", "f", None, None): rec("gone", OLDER)}
    assert set_aside_older(done, mine, Path("s.jsonl")) == (
        f"--resume: 1 record in s.jsonl is of schema {OLDER}, older than this flatcheck's {SCHEMA_VERSION}, whose "
        "numbers may differ from this version's: 1 of models this scan does not name stays as written")
