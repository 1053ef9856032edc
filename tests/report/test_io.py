"""report.io.write_or_rescue: a target whose folder is gone is refused with one reason, the same
for a whole-file write and an append, and the output lands in the temporary folder instead."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from flatcheck.report.io import OutputRescued, write_bytes_atomic, write_or_rescue


@pytest.mark.parametrize("append", [False, True])
def test_a_target_in_a_missing_folder_is_rescued_with_the_folder_named(tmp_path, monkeypatch, append):
    spare_dir = tmp_path / "spare"
    spare_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spare_dir))
    target = tmp_path / "gone" / "summary.md"
    with pytest.raises(OutputRescued) as caught:
        write_or_rescue(target, "# verdict\n", "--summary", append=append)
    spare = Path(caught.value.spare)
    assert spare.parent == spare_dir and spare.name.startswith("flatcheck-summary-") and spare.suffix == ".md"
    assert spare.read_text() == "# verdict\n"
    assert str(caught.value) == (f"--summary {target}: cannot write (folder {tmp_path / 'gone'} does not exist); "
                                 f"the output is in {spare} instead")
    assert not target.parent.exists()


def test_append_adds_to_the_end_and_a_write_replaces(tmp_path):
    target = tmp_path / "summary.md"
    write_bytes_atomic(target, b"one\n")
    assert write_or_rescue(target, "two\n", "--summary", append=True) is None
    assert target.read_text() == "one\ntwo\n"
    assert write_or_rescue(target, "three\n", "--summary") is None
    assert target.read_text() == "three\n"
