"""`flatcheck report`: correlations against scipy, shard merging, the PNG scatter."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from flatcheck.workflows.stats import correlate
from test_cli import invoke

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def known_data(n=40, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.lognormal(size=n)
    return x, 0.6 * np.log(x) + rng.normal(scale=0.5, size=n)


def test_correlations_match_scipy():
    x, y = known_data()
    got = {c.method: c for c in correlate(x, y, n_boot=500, seed=1)}
    pr, sr, kt = stats.pearsonr(x, y), stats.spearmanr(x, y), stats.kendalltau(x, y)
    assert got["pearson"].r == pytest.approx(pr.statistic) and got["pearson"].p_value == pytest.approx(pr.pvalue)
    ci = pr.confidence_interval(0.95)  # scipy's is Fisher z too
    assert (got["pearson"].low, got["pearson"].high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert got["spearman"].r == pytest.approx(sr.statistic) and got["spearman"].p_value == pytest.approx(sr.pvalue)
    assert got["kendall"].r == pytest.approx(kt.statistic) and got["kendall"].p_value == pytest.approx(kt.pvalue)
    for c in got.values():
        assert c.low < c.r < c.high and c.n == len(x)
    again = {c.method: c for c in correlate(x, y, n_boot=500, seed=1)}
    assert again["kendall"].low == got["kendall"].low  # the bootstrap is seeded


def test_degenerate_input_gives_no_correlation():
    (p, *_) = correlate([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0])
    assert math.isnan(p.r) and p.low is None


def record(model, x, y, status="ok", **extra):
    res = {"sharp": {"value": x, "stderr": 0.1 * x, "details": {}},
           "mls": {"value": 1.0, "stderr": None, "details": {"normalized": y, **extra}}}
    return {"model": model, "fingerprint": "f", "status": status, "error": None if status == "ok" else "boom",
            "results": res if status == "ok" else {}}


def write_jsonl(path: Path, recs, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + tail)
    return path


@pytest.fixture
def shards(tmp_path):
    x, y = known_data(12)
    fams = ["vit", "deit", "eva"]
    recs = [record(f"{fams[i % 3]}_m{i}", float(a), float(b)) for i, (a, b) in enumerate(zip(x, y))]
    recs.append(record("vit_broken", 0, 0, status="error"))
    write_jsonl(tmp_path / "scan.jsonl.rank0", recs[0::2])
    # rank 1 was killed mid-write: its partial last line is ignored
    write_jsonl(tmp_path / "scan.jsonl.rank1", recs[1::2], tail='{"model": "vit_half", "sta')
    return tmp_path / "scan.jsonl", recs, x, y


def test_report_merges_shards_and_correlates(shards):
    out, recs, x, y = shards
    res = invoke("report", out, "--x", "sharp", "--y", "mls.normalized", "--json", "-", "--bootstrap", "200")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert {m["model"] for m in data["models"]} == {r["model"] for r in recs}
    assert "partial last line" in res.stderr
    pear = next(c for c in data["correlations"] if c["method"] == "pearson")
    assert pear["n"] == len(x) and pear["r"] == pytest.approx(stats.pearsonr(x, y).statistic)
    row = next(m for m in data["models"] if m["model"] == recs[0]["model"])
    assert row["values"]["sharp"]["stderr"] == pytest.approx(0.1 * x[0])


def test_report_plot_is_a_png(shards, tmp_path):
    out, *_ = shards
    png = tmp_path / "scatter.png"
    res = invoke("report", out, "--x", "sharp.value", "--y", "mls.details.normalized", "--plot", png, "--logx",
                 "--correlate", "mls.normalized", "-q")
    assert res.exit_code == 0, res.stderr
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


def test_report_overlays_spectral_densities(tmp_path):
    # both layouts: details.grid/density, and the spectrum probe's details.density.{grid, values}
    recs = [record(f"vit_{i}", 1.0 + i, 2.0 * i, grid=[0.0, 1.0, 2.0], density=[0.5, 0.3, 0.2]) for i in range(2)]
    recs += [record(f"eva_{i}", 1.0 + i, 2.0 * i, density={"sigma": 0.1, "grid": [0.0, 1.0], "values": [0.6, 0.4]})
             for i in range(2)]
    src = write_jsonl(tmp_path / "s.jsonl", recs)
    plain = write_jsonl(tmp_path / "p.jsonl", [record(f"vit_{i}", 1.0 + i, 2.0 * i) for i in range(4)])
    sizes = []
    for f in (plain, src):
        png = tmp_path / f"{f.stem}.png"
        assert invoke("report", f, "--x", "sharp", "--y", "mls.normalized", "--plot", png, "-q").exit_code == 0
        sizes.append(int.from_bytes(png.read_bytes()[16:20], "big"))  # PNG width from the IHDR chunk
    assert sizes[1] > 1.5 * sizes[0]  # a second panel


def test_report_bad_input(tmp_path, monkeypatch):
    res = invoke("report", tmp_path / "nope.jsonl")
    assert res.exit_code == 2 and res.stderr.startswith("error: ")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"model": "a", "results": {}}\nnot json\n{"model": "b", "results": {}}\n')
    res = invoke("report", bad)
    assert res.exit_code == 2 and "bad.jsonl:2" in res.stderr
    good = write_jsonl(tmp_path / "g.jsonl", [record("vit_a", 1.0, 2.0), record("vit_b", 2.0, 3.0)])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    res = invoke("report", good, "--x", "sharp", "--y", "mls.normalized", "--plot", tmp_path / "x.png")
    assert res.exit_code == 2 and "matplotlib" in res.stderr
