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
from tests.support.cli import invoke
from tests.support.records import record, write_jsonl

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


def test_pearson_of_three_models_says_why_it_has_no_interval():
    # the CI column showed "—" beside an interval column that said "Fisher z" (stranger test)
    got = {c.method: c for c in correlate([1.0, 2.0, 3.0], [2.0, 1.0, 5.0], n_boot=200)}
    assert got["pearson"].low is None and got["pearson"].interval.startswith("none: n ≤ 3")
    assert {c.method: c for c in correlate([1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 5.0, 4.0], n_boot=200)}[
        "pearson"].interval == "Fisher z"


def test_rank_correlations_of_few_models_or_a_perfect_ranking_get_no_bootstrap_interval():
    # 4 models in perfect order: the bootstrap said [1, 1] beside p = 0.083 (stranger test)
    got = {c.method: c for c in correlate([1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 5.0, 9.0], n_boot=200)}
    for m in ("spearman", "kendall"):
        assert got[m].r == 1 and got[m].low is None and got[m].high is None
        assert got[m].interval == "none: n < 10" and got[m].p_value > 0.05
    x = np.arange(12.0)
    got = {c.method: c for c in correlate(x, x ** 3, n_boot=200)}
    assert got["spearman"].low is None and got["spearman"].interval.startswith("none: a bootstrap of |r| = 1")
    x, y = known_data(n=12)
    got = {c.method: c for c in correlate(x, y, n_boot=200)}
    assert got["kendall"].low < got["kendall"].r < got["kendall"].high  # 12 models, imperfect: an interval


def test_degenerate_input_gives_no_correlation():
    (p, *_) = correlate([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0])
    assert math.isnan(p.r) and p.low is None


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


@pytest.mark.workflow
def test_report_plot_is_a_png(shards, tmp_path):
    out, *_ = shards
    png = tmp_path / "scatter.png"
    res = invoke("report", out, "--x", "sharp.value", "--y", "mls.details.normalized", "--plot", png, "--logx",
                 "--correlate", "mls.normalized", "-q")
    assert res.exit_code == 0, res.stderr
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


@pytest.mark.workflow
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


# ---------------------------------------------------------------- settings, labels, CSV, warnings


def scan_record(model, x, y, *, samples=8, seed=0, rho=5e-4, input_size=(3, 32, 32), xerr=None):
    """A record as `flatcheck scan` writes it, with its run settings."""
    rec = record(model, x, y)
    rec["results"]["sharp"].update(label="adaptive sharpness S_ρ", stderr=0.1 * x if xerr is None else xerr)
    rec["results"]["mls"]["label"] = "MLS"
    rec["settings"] = {"data": "synthetic", "data_root": None, "split": "train", "samples": samples, "batch_size": 8,
                       "dtype": "float32", "bn_mode": "eval", "seed": seed, "params": [], "backend": "autograd",
                       "probes": [["sharp", {"rho": rho}], ["mls", {"output": "logits"}]]}
    # the synthetic data's own fingerprint follows the model's input size: not a setting
    rec["meta"] = {"seed": seed, "dtype": "float32", "bn_mode": "eval", "backend": "autograd",
                   "model": {"params_filter": None, "input_size": list(input_size)},
                   "data": {"name": "synthetic", "split": "train", "samples": samples, "batch_size": 8,
                            "fingerprint": f"fp{input_size[-1]}"}}
    return rec


@pytest.mark.parametrize("change, named", [({"samples": 16}, "samples 8 vs 16"), ({"seed": 3}, "seed 0 vs 3"),
                                           ({"rho": 0.05}, "probe_options")])
def test_report_refuses_results_of_other_settings(tmp_path, change, named):
    recs = [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i) for i in range(3)]
    recs.append(scan_record("deit_x", 4.0, 5.0, **change))
    src = write_jsonl(tmp_path / "s.jsonl", recs)
    res = invoke("report", src, "--x", "sharp", "--y", "mls.normalized")
    assert res.exit_code == 2 and named in res.stderr and "--mixed-settings" in res.stderr
    assert res.stderr.count("\n") == 1
    res = invoke("report", src, "--x", "sharp", "--y", "mls.normalized", "--mixed-settings", "--json", "-",
                 "--bootstrap", "100")
    assert res.exit_code == 0 and named in res.stderr and "warning" in res.stderr
    assert len(json.loads(res.stdout)["models"]) == 4


def test_reports_of_models_measured_with_other_probes_are_compared_on_what_they_share(tmp_path, monkeypatch):
    """Two models measured with [trace] and [trace, gini] were refused as "probes … vs …":
    which probes ran is not a setting, a probe one lacks is a blank cell (session 12's note)."""
    monkeypatch.chdir(tmp_path)
    a = write_json(tmp_path / "a.json", plain_report("a.safetensors", "aa", trace=36.8))
    b = write_json(tmp_path / "b.json", plain_report("b.safetensors", "bb", trace=50.0, gini=0.2))
    res, rows = report_json(a, b)
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    assert [(m["model"], m["values"]["trace"]["value"], m["values"]["gini"]["value"]) for m in rows] == [
        ("a", 36.8, None), ("b", 50.0, 0.2)]
    # other data still is another setting
    c = write_json(tmp_path / "c.json", {**plain_report("c.safetensors", "cc", trace=1.0),
                                         "data": {"name": "cifar10", "split": "train", "samples": 256}})
    res, _ = report_json(a, c)
    assert res.exit_code == 2 and "data" in res.stderr and "--mixed-settings" in res.stderr


def test_scan_records_with_other_probes_split_only_on_a_shared_probes_options(tmp_path):
    recs = [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i) for i in range(3)]
    extra = scan_record("deit_x", 4.0, 5.0)
    extra["settings"]["probes"].append(["trace", {"probes_max": 100}])
    extra["results"]["trace"] = {"value": 3.0, "stderr": 0.1, "label": "trace", "details": {}}
    src = write_jsonl(tmp_path / "s.jsonl", [*recs, extra])
    res = invoke("report", src, "--x", "sharp", "--y", "mls.normalized", "--json", "-", "--bootstrap", "100")
    assert res.exit_code == 0 and res.stderr == "", res.stderr
    assert len(json.loads(res.stdout)["models"]) == 4
    # the shared probe run with other options is still refused, and named
    recs[0]["settings"]["probes"][0][1]["rho"] = 0.05
    src = write_jsonl(tmp_path / "t.jsonl", [*recs, extra])
    res = invoke("report", src, "--x", "sharp", "--y", "mls.normalized")
    assert res.exit_code == 2 and "probe_options" in res.stderr and "sharp" in res.stderr
    # a probe only one record ran splits nothing, whatever its options
    extra["settings"]["probes"][-1][1]["probes_max"] = 7
    src = write_jsonl(tmp_path / "u.jsonl", [*recs[1:], extra])
    assert invoke("report", src, "--x", "sharp", "--y", "mls.normalized", "--json", "-",
                  "--bootstrap", "100").exit_code == 0


def test_report_refusal_shows_where_long_settings_differ(tmp_path):
    # the probe options differ far into their JSON text: cut alike from the start, both sides
    # read the same ('{"sharp": {"option_00", …') and the line says nothing
    long = {f"option_{i:02d}": i for i in range(12)}
    recs = [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i) for i in range(2)] + [scan_record("deit_x", 4.0, 5.0)]
    for rec, value in zip(recs, (0.0005, 0.0005, 0.05)):
        rec["settings"]["probes"] = [["mls", {"output": "logits"}], ["sharp", {**long, "rho": value}]]
    res = invoke("report", write_jsonl(tmp_path / "s.jsonl", recs), "--x", "sharp", "--y", "mls.normalized")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    left, right = res.stderr.split("probe_options ", 1)[1].split(" (")[0].split(" vs ")
    assert left != right and '"rho": 0.0005' in left and '"rho": 0.05' in right, res.stderr
    assert left.startswith("…") and len(left) <= 62 and len(right) <= 62


def test_report_merges_a_family_of_input_sizes(tmp_path):
    recs = [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i, input_size=(3, s, s)) for i, s in enumerate((224, 384, 518))]
    res = invoke("report", write_jsonl(tmp_path / "s.jsonl", recs), "--x", "sharp", "--y", "mls.normalized",
                 "-q", "--bootstrap", "100")
    assert res.exit_code == 0, res.stderr


def test_report_warns_when_x_values_are_within_their_errors(tmp_path):
    close = [scan_record(f"vit_{i}", 1.0 + 0.01 * i, 2.0 + i, xerr=0.1) for i in range(5)]
    res = invoke("report", write_jsonl(tmp_path / "c.jsonl", close), "--x", "sharp", "--y", "mls.normalized",
                 "--bootstrap", "100")
    assert res.exit_code == 0 and "10 of 10 pairs of sharp values lie within 2 standard errors" in res.stderr
    apart = [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i, xerr=0.1) for i in range(5)]
    res = invoke("report", write_jsonl(tmp_path / "a.jsonl", apart), "--x", "sharp", "--y", "mls.normalized",
                 "--bootstrap", "100")
    assert res.exit_code == 0 and "standard errors" not in res.stderr


@pytest.mark.workflow
def test_report_axes_use_the_field_labels_and_points_their_names(tmp_path, monkeypatch):
    import flatcheck.report.scatter as scatter

    seen = {}
    real = scatter.write_scatter
    monkeypatch.setattr(scatter, "write_scatter", lambda *a, **kw: seen.update(kw) or real(*a, **kw))
    src = write_jsonl(tmp_path / "s.jsonl", [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i) for i in range(3)])
    sizes = []
    for extra in ([], ["--labels"]):
        png = tmp_path / f"p{len(extra)}.png"
        res = invoke("report", src, "--x", "sharp", "--y", "mls.normalized", "--plot", png, "-q", *extra)
        assert res.exit_code == 0, res.stderr
        sizes.append(png.read_bytes())
    assert seen["xlabel"] == "adaptive sharpness S_ρ  [sharp]" and seen["ylabel"] == "MLS: normalized  [mls.normalized]"
    assert seen["labels"] is True and sizes[0] != sizes[1]  # the names are drawn


def test_report_writes_csv_atomically(tmp_path):
    import csv

    recs = [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i) for i in range(3)] + [record("vit_bad", 0, 0, status="error")]
    out = tmp_path / "table.csv"
    res = invoke("report", write_jsonl(tmp_path / "s.jsonl", recs), "--fields", "sharp,mls.normalized", "--csv", out,
                 "--json", "-", "-q")
    assert res.exit_code == 0, res.stderr
    rows = list(csv.DictReader(out.open()))
    table = json.loads(res.stdout)["models"]
    assert [r["model"] for r in rows] == [m["model"] for m in table]
    for row, m in zip(rows, table):
        for f in ("sharp", "mls.normalized"):
            v, se = m["values"][f]["value"], m["values"][f]["stderr"]
            assert row[f] == ("" if v is None else repr(v)) and row[f"{f}.stderr"] == ("" if se is None else repr(se))
    assert rows[-1]["status"] == "error" and rows[-1]["error"] == "boom" and rows[-1]["sharp"] == ""
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
    res = invoke("report", tmp_path / "s.jsonl", "--csv", tmp_path / "nope" / "t.csv")
    assert res.exit_code == 2 and res.stderr.startswith("error: --csv")


def test_report_outputs_whose_folder_goes_are_rescued_and_the_table_printed(tmp_path, monkeypatch):
    """--csv's and --json's folder removed after the checks: both are written to temporary
    files the one error line names, the table is printed, exit 2."""
    import flatcheck.commands.report as report_cmd
    from tests.support.outputs import lose_folder_after

    # the folder goes after the checks of the paths, before the outputs are written
    folder, spare = lose_folder_after(monkeypatch, report_cmd, "_correlations", tmp_path)
    recs = [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i) for i in range(3)]
    res = invoke("report", write_jsonl(tmp_path / "s.jsonl", recs), "--fields", "sharp,mls.normalized",
                 "--csv", folder / "t.csv", "--json", folder / "r.json")
    assert res.exit_code == 2, res.stderr
    assert "vit_2" in res.stdout
    kept = {p.suffix: p for p in spare.iterdir()}
    [line] = res.stderr.strip().splitlines()
    for flag, name in (("--csv", "t.csv"), ("--json", "r.json")):
        assert f"{flag} {folder / name}: cannot write" in line and f"in {kept[Path(name).suffix]} instead" in line
    assert [m["model"] for m in json.loads(kept[".json"].read_text())["models"]] == ["vit_0", "vit_1", "vit_2"]
    assert kept[".csv"].read_text().splitlines()[0].startswith("model,")


# ---------------------------------------------------------------- along a training run


def track_record(run, step, lmax, jac, lr):
    return {"model": run, "kind": "flatcheck.track", "fingerprint": run, "status": "ok", "error": None,
            "step": step, "epoch": None, "extra": {"lr": lr},
            "results": {"lmax": {"value": lmax, "stderr": None, "label": "λmax(H)", "details": {}},
                        "jacobian": {"value": jac, "stderr": 0.01, "label": "‖J‖_F", "details": {}}}}


def test_report_draws_fields_along_the_steps(tmp_path, monkeypatch):
    import flatcheck.report.plots as plots

    recs = [track_record(f"gd_lr{lr}", s, 2 / lr * (1 - 0.5 ** (s / 10 + 1)), 1 + s / 100, lr)
            for lr in (0.1, 0.05) for s in (30, 0, 10, 20)]  # out of order on purpose
    src = write_jsonl(tmp_path / "track.jsonl", recs)
    seen = {}
    real = plots.plot_trajectories
    monkeypatch.setattr(plots, "plot_trajectories", lambda *a, **kw: seen.update(series=a[1], **kw) or real(*a, **kw))
    png = tmp_path / "track.png"
    res = invoke("report", src, "--x", "step", "--y", "lmax", "--y", "jacobian", "--y", "extra.lr", "--lr", "0.1",
                 "--lr", "0.05", "--log-y", "--plot", png, "--json", "-")
    assert res.exit_code == 0, res.stderr
    assert png.read_bytes().startswith(PNG_MAGIC)
    table = json.loads(res.stdout)["models"]
    assert [(m["model"], m["step"]) for m in table] == [(r, s) for r in ("gd_lr0.05", "gd_lr0.1") for s in (0, 10, 20, 30)]
    lmax = {s.run: s for s in seen["series"] if s.field == "lmax"}
    assert lmax["gd_lr0.1"].x == [0, 10, 20, 30] and lmax["gd_lr0.1"].y == [r["results"]["lmax"]["value"] for r in
                                                                           sorted(recs[:4], key=lambda r: r["step"])]
    assert seen["lrs"] == [0.1, 0.05] and seen["logy"] and seen["ylabels"]["lmax"] == "λmax(H)  [lmax]"
    assert seen["ylabels"]["extra.lr"] == "lr  [extra.lr]"


@pytest.mark.parametrize("args, said", [(["--x", "sharp", "--y", "a", "--y", "b"], "--y given 2 times"),
                                        (["--x", "sharp", "--y", "mls.normalized", "--lr", "0.1"], "--lr"),
                                        (["--x", "step", "--y", "lmax", "--lr", "0"], "--lr must be positive")])
def test_report_trajectory_options_are_checked(tmp_path, args, said):
    src = write_jsonl(tmp_path / "s.jsonl", [record("vit_a", 1.0, 2.0)])
    res = invoke("report", src, *args)
    assert res.exit_code == 2 and said in res.stderr


def test_a_field_no_record_has_is_refused_naming_it(shards):
    """`--y nonexist` was a column of blanks and "too few distinct points", exit 0 (stranger test)."""
    out, *_ = shards
    res = invoke("report", out, "--x", "sharp", "--y", "nonexist")
    assert res.exit_code == 2 and "field 'nonexist' is in no record" in res.stderr and "mls, sharp" in res.stderr
    res = invoke("report", out, "--fields", "sharp,mls.details.nope")
    assert res.exit_code == 2 and "'mls.details.nope'" in res.stderr
    assert invoke("report", out, "--x", "sharp", "--y", "mls.normalized", "-q", "--bootstrap", "200").exit_code == 0


# ---------------------------------------------------------------- p-values at small n


def test_spearman_p_value_at_small_n_is_the_exact_permutation_one():
    """At n = 7 a perfect ranking was printed p = 0.0 (scipy's t approximation); no ordering of
    7 points is rarer than 2/7! (stranger test)."""
    import itertools

    x = np.arange(7.0)
    got = {c.method: c for c in correlate(x, x ** 3, n_boot=100)}
    assert got["spearman"].p_value == pytest.approx(2 / math.factorial(7))
    # on data with ties, against ρ itself from scipy over every ordering of y (|ρ| ≥ observed)
    a, b = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0]), np.array([2.0, 7.0, 1.0, 8.0, 2.0, 8.0])
    observed = abs(stats.spearmanr(a, b).statistic)
    null = [abs(stats.spearmanr(a, b[list(order)]).statistic) for order in itertools.permutations(range(len(a)))]
    (spear,) = [c for c in correlate(a, b, n_boot=100) if c.method == "spearman"]
    assert spear.p_value == pytest.approx(np.mean([v >= observed - 1e-12 for v in null]))


def test_no_p_value_is_printed_as_zero(tmp_path):
    recs = [record(f"vit_{i}", float(i + 1), float(i + 1)) for i in range(30)]  # r = 1 exactly
    src = write_jsonl(tmp_path / "s.jsonl", recs)
    res = invoke("report", src, "--x", "sharp", "--y", "mls.normalized", "--bootstrap", "100", "--json", "-", "-q")
    assert res.exit_code == 0, res.stderr
    assert all(c["p_value"] > 0 for c in json.loads(res.stdout)["correlations"])
    res = invoke("report", src, "--x", "sharp", "--y", "mls.normalized", "--bootstrap", "100", "-q")
    assert "< 1e-4" in res.stdout and " 0.0 " not in res.stdout


# ---------------------------------------------------------------- which records are one model


def plain_report(ckpt: str, sha: str, *, samples=256, **values) -> dict:
    """A `flatcheck trace CKPT --json` report: no fingerprint, the checkpoint as given."""
    return {"schema_version": "2.1", "model": {"arch": "demo", "spec_sha256": "s", "params_filter": None},
            "checkpoint": {"path": ckpt, "sha256": sha, "format": "safetensors"}, "seed": 0, "dtype": "float32",
            "bn_mode": "eval", "backend": "autograd",
            "data": {"name": "digits", "split": "train", "samples": samples, "batch_size": 128},
            "results": {p: {"value": v, "stderr": 0.1, "label": p, "details": {}} for p, v in values.items()}}


def write_json(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def report_json(*args):
    res = invoke("report", *args, "--json", "-", "--bootstrap", "100")
    return res, (json.loads(res.stdout)["models"] if res.exit_code == 0 else None)


def test_reports_of_two_models_with_one_file_name_are_two_rows(tmp_path, monkeypatch):
    """r1/model.safetensors and r2/model.safetensors were one row, the last one (stranger test)."""
    monkeypatch.chdir(tmp_path)
    a = write_json(tmp_path / "r1" / "rep.json", plain_report("r1/model.safetensors", "aa", trace=36.8))
    b = write_json(tmp_path / "r2" / "rep.json", plain_report("r2/model.safetensors", "bb", trace=118.1))
    res, rows = report_json(a, b)
    assert res.exit_code == 0, res.stderr
    assert [(m["model"], m["values"]["trace"]["value"]) for m in rows] == [("r1/model.safetensors", 36.8),
                                                                           ("r2/model.safetensors", 118.1)]
    assert {m["family"] for m in rows} == {"model"}
    # one path, other weights (retrained in place): other models too, told apart by their files
    c = write_json(tmp_path / "c.json", plain_report("r1/model.safetensors", "cc", trace=50.0))
    res, rows = report_json(a, c)
    assert res.exit_code == 0 and [m["model"] for m in rows] == [f"model ({a})", f"model ({c})"]


def test_reports_of_one_model_with_other_probes_are_one_row(tmp_path, monkeypatch):
    """`report trace.json lmax.json` showed lmax only (stranger test)."""
    monkeypatch.chdir(tmp_path)
    t = write_json(tmp_path / "js" / "trace.json", plain_report("demo.safetensors", "aa", trace=36.8))
    lm = write_json(tmp_path / "js" / "lmax.json", plain_report("./demo.safetensors", "aa", lmax=13.7))
    res, rows = report_json(t, lm)
    assert res.exit_code == 0, res.stderr
    assert [(m["model"], m["values"]["trace"]["value"], m["values"]["lmax"]["value"]) for m in rows] == [
        ("demo", 36.8, 13.7)]
    # the same file twice is read once
    res, rows = report_json(t, tmp_path / "js" / ".." / "js" / "trace.json")
    assert res.exit_code == 0 and len(rows) == 1


def test_reports_of_one_model_under_other_settings_are_refused_like_scans(tmp_path, monkeypatch):
    """256 against 512 samples of one checkpoint showed one row, by argument order, and no refusal."""
    monkeypatch.chdir(tmp_path)
    a = write_json(tmp_path / "trace.json", plain_report("demo.safetensors", "aa", trace=36.8))
    b = write_json(tmp_path / "release.json", plain_report("demo.safetensors", "aa", samples=512, trace=27.5))
    res, _ = report_json(a, b)
    assert res.exit_code == 2 and "samples 256 vs 512" in res.stderr and "--mixed-settings" in res.stderr
    assert f"demo ({a}) vs demo ({b})" in res.stderr and res.stderr.count("\n") == 1
    res, rows = report_json(a, b, "--mixed-settings")
    assert res.exit_code == 0 and [m["values"]["trace"]["value"] for m in rows] == [36.8, 27.5]
    # what it let through is said as every command says a warning
    assert res.stderr.startswith("flatcheck: warning: "), res.stderr


def test_two_reports_of_one_measurement_are_refused_naming_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a = write_json(tmp_path / "a.json", plain_report("demo.safetensors", "aa", trace=36.8, gini=0.1))
    b = write_json(tmp_path / "b.json", plain_report("demo.safetensors", "aa", trace=36.9))
    res, _ = report_json(a, b)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"{a} and {b} both hold trace of demo.safetensors" in res.stderr


def test_a_resumed_scan_reports_each_model_once_the_latest(tmp_path):
    """A checkpoint changed, a broken one fixed, then `scan --resume`: report counted both records
    of each and correlated the stale one (stranger test)."""
    old = [scan_record(f"vit_{i}", 1.0 + i, 2.0 + i) for i in range(4)]
    old[3].update(status="error", error="not a valid safetensors file", results={})
    for i, r in enumerate(old):
        r.update(checkpoint=f"ck/vit_{i}.safetensors", fingerprint=f"old{i}")
    changed = {**scan_record("vit_1", 10.0, 20.0), "checkpoint": "ck/vit_1.safetensors", "fingerprint": "new1"}
    fixed = {**scan_record("vit_3", 4.0, 5.0), "checkpoint": "ck/vit_3.safetensors", "fingerprint": "new3"}
    added = {**scan_record("vit_9", 9.0, 9.5), "checkpoint": "ck/vit_9.safetensors", "fingerprint": "new9"}
    src = write_jsonl(tmp_path / "scan.jsonl", [*old, changed, fixed, added])
    res, rows = report_json(src, "--x", "sharp", "--correlate", "mls.normalized")
    assert res.exit_code == 0, res.stderr
    assert [(m["model"], m["status"], m["values"]["sharp"]["value"]) for m in rows] == [
        ("vit_0", "ok", 1.0), ("vit_1", "ok", 10.0), ("vit_2", "ok", 3.0), ("vit_3", "ok", 4.0), ("vit_9", "ok", 9.0)]
    assert "left out 2 superseded records" in res.stderr and f"vit_1 ({src}:2)" in res.stderr
    assert json.loads(res.stdout)["correlations"][0]["n"] == 5
    # a record of other settings is another data point, not a newer one: refused, as before
    other = {**scan_record("vit_0", 1.5, 2.5, samples=16), "checkpoint": "ck/vit_0.safetensors"}
    res, _ = report_json(write_jsonl(tmp_path / "s2.jsonl", [*old, other]))
    assert res.exit_code == 2 and "samples 8 vs 16" in res.stderr and "superseded" not in res.stderr
    # two scan files of the same models: not a resume's superseded record (the note blamed a
    # changed checkpoint); said as what it is, the later file's records shown
    again = [{**r, "results": {**r["results"], "sharp": {**r["results"]["sharp"], "value": 7.0}}} for r in old[:3]]
    a, b = write_jsonl(tmp_path / "a.jsonl", old[:3]), write_jsonl(tmp_path / "b.jsonl", again)
    res, rows = report_json(a, b)
    assert res.exit_code == 0 and "superseded" not in res.stderr, res.stderr
    assert f"{b} measures 3 models of {a} again with the same settings" in res.stderr
    assert [m["values"]["sharp"]["value"] for m in rows] == [7.0, 7.0, 7.0]


def test_an_existing_file_is_told_by_its_bytes(tmp_path):
    """What an output path holds decides whether a command may write over it (report.io)."""
    import pickle

    import numpy as np

    from flatcheck.report.io import _SNIFF_BYTES, sniff_kind

    def kind(name: str, data: bytes | str) -> str:
        path = tmp_path / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return sniff_kind(path)

    assert kind("a", b"") == "empty"
    assert kind("r.json", json.dumps({"schema_version": "2.5", "results": {}}, indent=2)) == "json"
    record = json.dumps({"model": "m", "status": "ok", "results": {}})
    assert kind("one.jsonl", record + "\n") == "scan" and kind("two.jsonl", record + "\n" + record + "\n") == "scan"
    assert kind("t.csv", "model,trace,trace.stderr\nm,1,0.1\n") == "csv"
    assert kind("n.txt", "notes about a run\n") == "text"
    assert kind("s.yaml", "source: timm\narch: resnet18\n") == "spec"
    assert kind("p.pkl", pickle.dumps({"w": 1}, protocol=4)) == "pickle"
    np.savez(tmp_path / "d.npz", x=np.zeros(3))
    assert sniff_kind(tmp_path / "d.npz") == "data"
    assert kind("png", b"\x89PNG\r\n\x1a\n" + b"\0" * 16) == "figure"
    # an indented report larger than what is read is still JSON, not text
    big = json.dumps({"note": "x" * _SNIFF_BYTES}, indent=2)
    assert len(big) > _SNIFF_BYTES and kind("big.json", big) == "json"
