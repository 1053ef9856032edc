"""Smoke test of benchmarks/bench_gpu_throughput.py on the CPU: every product loop gives a row
on a tiny timm ViT, the FLOPs scaled from the counted warm-up equal a direct count, and the
peak table names the float32 peak it divides by (none for a device it does not know)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.workflow  # whole workflows, seconds each: make test-all only


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_gpu_throughput as bench  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("throughput")
    # as many samples as the counted run: its count is the timed run's, and one count is the
    # least work (the extrapolation from two has its own test below)
    rows = bench.main(["--device", "cpu", "--models", "test_vit", "--samples", "2", "--products", "2",
                       "--lanczos", "2", "--count-samples", "2", "--out", str(out / "t.md"),
                       "--jsonl", str(out / "t.jsonl")])
    return rows, out


def test_every_loop_gives_a_row(smoke):
    rows, out = smoke
    assert [r.loop for r in rows] == [lp.name for lp in bench.loops(2, 2)]
    for r in rows:
        assert r.error is None, f"{r.loop}: {r.error}"
        assert r.products >= 1 and r.seconds > 0 and r.flops > 0 and r.batch == 128
        assert r.products_per_s == pytest.approx(r.products / r.seconds)
        assert r.peak_fraction is None  # a CPU has no float32 peak in the table
    hessian = [r for r in rows if r.extra["per_product"]]
    assert all(r.products == 2 for r in hessian if r.loop != "lmax")  # fixed counts: no early stop
    assert all(r.samples_per_s == pytest.approx(2 * r.products / r.seconds) for r in hessian)
    assert all(r.flops == r.counted[0][1] * (r.products / r.counted[0][2] if r.extra["per_product"] else 1)
               for r in rows)
    lines = (out / "t.jsonl").read_text().splitlines()
    assert [json.loads(line)["loop"] for line in lines] == [r.loop for r in rows]
    table = (out / "t.md").read_text()
    assert "none for a CPU: no fraction" in table and table.count("| test_vit |") == len(rows)


def test_scaled_flops_equal_a_direct_count():
    """A Hessian loop's FLOPs per product are affine in the samples (each product passes over
    every sample, and the vector algebra over the parameters is per product), so the counts on
    2 and 4 samples extrapolated to 6 are the count on 6: matrix products only, whose formulas
    are exact integers."""
    import torch

    case = bench.SMOKE[0]
    model = case.build().eval()
    loop = bench.loops(2, 2)[0]
    kw = dict(samples=6, batch=None, device=torch.device("cpu"), dtype="float32", repeat=1)
    scaled = bench.measure_loop(case, model, loop, count_samples=2, **kw)
    direct = bench.measure_loop(case, model, loop, count_samples=6, **kw)
    assert scaled.error is None and direct.error is None
    assert [n for n, _, _ in scaled.counted] == [2, 4] and [n for n, _, _ in direct.counted] == [6]
    assert direct.flops == direct.counted[0][1]
    assert scaled.flops == pytest.approx(direct.flops, rel=1e-12)
    # one count alone is taken as all per sample: it misses the fixed part
    assert bench.scaled_flops(scaled.counted[:1], 6, 2, True) != pytest.approx(direct.flops, rel=1e-3)


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 PCIe", 51.2e12), ("NVIDIA H100 80GB HBM3", 66.9e12),
                                        ("NVIDIA H100 NVL", 60.0e12), ("NVIDIA H200", 66.9e12)])
def test_the_peak_is_the_non_tf32_float32_one(name, peak):
    flops, what = bench.peak_flops(name)
    assert flops == peak and "non-TF32" in what


def test_an_unknown_device_gets_no_fraction():
    flops, what = bench.peak_flops("NVIDIA GeForce RTX 3090")
    assert flops is None and "no fraction" in what
    row = bench.Row("m", "l", "cuda", "float32", 4, products=2, seconds=1.0, flops=1e12)
    assert row.flops_per_s == 1e12 and row.peak_fraction is None
    row.peak_flops = 2e12
    assert row.peak_fraction == 0.5


def test_the_preset_timing_projects_a_line_through_two_sample_counts():
    import bench_realsize

    rows = [{"model": "vit", "row": "mls", "samples": n, "seconds": 3.0 + 0.5 * n, "exit": 0} for n in (16, 32, 64)]
    rows += [{"model": "vit", "row": "lmax", "samples": 16, "seconds": 9.0, "exit": 0},  # one count: no line
             {"model": "vit", "row": "lmax", "samples": 32, "seconds": 1.0, "exit": 1}]  # failed rows do not count
    (p,) = bench_realsize.projection(rows, 1000)
    assert p["from"] == (16, 32) and p["fixed_s"] == pytest.approx(3.0) and p["per_sample_s"] == pytest.approx(0.5)
    assert p["projected_s"] == pytest.approx(503.0)
    assert "| vit | **all rows above** | | | | 503 | 8.4 |" in bench_realsize.projection_table(rows, 1000)


def test_the_compile_costs_row(monkeypatch, tmp_path):
    """The --compile-costs path on the CPU, torch.compile stood in for by the eager function
    (compiling takes minutes here): every cost is a time, and on a CPU compiling is never chosen."""
    import torch

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    (row,) = bench.main(["--device", "cpu", "--models", "test_vit", "--samples", "2", "--compile-costs",
                         "--out", str(tmp_path / "c.md")])
    assert "error" not in row, row.get("error")
    assert all(row[k] > 0 for k in ("autograd_s", "func_eager_s", "func_compiled_s")) and row["compile_s"] >= 0
    assert row["compile_chosen"] is False and "CUDA device only" in row["reason"]
    assert "| test_vit | 2 |" in (tmp_path / "c.md").read_text()


def test_the_tf32_bench_on_a_cpu_where_tf32_changes_nothing():
    import bench_tf32

    (row,) = bench_tf32.main(["--device", "cpu", "--models", "demo", "--probes", "lmax", "--samples", "64"])
    assert "note" not in row, row.get("note")
    assert row["tf32_vs_f32"] == 0.0  # a CPU has no TF32: the same float32 run twice
    # float32 against float64: within the float32 run's own error bound
    assert row["error"] and row["f32_vs_f64"] <= row["error"]
