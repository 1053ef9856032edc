"""What TF32 does to each probe's value: every probe in float64 (the reference), float32 and
float32 with TF32 matrix products (--allow-tf32), on the demo DigitsCNN and timm's test_vit.

TF32 rounds the inputs of matrix products to 10 mantissa bits. Whether that matters is a
question of size against each probe's own error: the table gives |TF32 − float32| (same seed,
same draws, so the difference is TF32's alone), and both against float64, each in units of
the probe's reported error (stderr, or the error bound of an iteration) where it has one,
with the seconds each took. On a CPU TF32 does nothing: the smoke run checks the code paths
and that its column is zero.

    python benchmarks/bench_tf32.py --device cuda --out results/tf32_effect.md --jsonl results/tf32_effect.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VARIANTS = (("float64", False), ("float32", False), ("float32", True))


def _demo():
    """The demo DigitsCNN with its shipped weights, and digits data (train and test split)."""
    from safetensors.torch import load_file

    from flatcheck.data.registry import create_dataset
    from flatcheck.zoo.demo_cnn import DigitsCNN

    model = DigitsCNN()
    model.load_state_dict(load_file(str(ROOT / "demo" / "digits_cnn.safetensors")))
    return model.eval(), create_dataset("digits", split="train"), create_dataset("digits", split="test")


def _test_vit():
    import timm
    import torch
    from timm.layers import set_fused_attn

    set_fused_attn(False)  # fused attention has no double backward
    torch.manual_seed(0)
    model = timm.create_model("test_vit", pretrained=False, num_classes=10, img_size=32).eval()
    g = torch.Generator().manual_seed(0)
    x, x_test = torch.randn(2, 256, 3, 32, 32, generator=g)
    y, y_test = torch.randint(0, 10, (2, 256), generator=g)
    return model, (x, y), (x_test, y_test)


MODELS = {"demo": _demo, "test_vit": _test_vit}


def _error(result) -> float | None:
    """The probe's own error: its standard error, else an iteration's bound; None when exact."""
    for e in (result.stderr, result.error_bound):
        if e is not None and math.isfinite(e) and e > 0:
            return float(e)
    return None


def measure_variant(model, data, test, probe: str, samples: int, device: str, dtype: str, tf32: bool) -> dict:
    import torch

    import flatcheck

    row: dict[str, Any] = {"dtype": dtype, "tf32": tf32}
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        start = time.perf_counter()
        res = flatcheck.measure(model, data, probes=probe, samples=samples, device=device, dtype=dtype,
                                test_data=test, seed=0).results[probe]
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        row.update(value=res.value, error=_error(res), seconds=res.seconds, wall=time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - a row records what went wrong
        row["failed"] = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    return row


def compare(model_name: str, probe: str, variants: list[dict]) -> dict:
    """One row: the three values, and the differences in units of the probe's error."""
    ref, f32, tf = variants
    row = {"model": model_name, "probe": probe, "variants": variants}
    values = [v.get("value") for v in variants]
    if any(v is None or not math.isfinite(v) for v in values):
        row["note"] = next((v["failed"] for v in variants if "failed" in v), "no value")
        return row
    err = f32.get("error")  # the float32 run's own error: what a user of it would be told
    row.update(error=err, f32_vs_f64=abs(f32["value"] - ref["value"]), tf32_vs_f64=abs(tf["value"] - ref["value"]),
               tf32_vs_f32=abs(tf["value"] - f32["value"]))
    scale = abs(ref["value"]) or 1.0
    for key in ("f32_vs_f64", "tf32_vs_f64", "tf32_vs_f32"):
        row[key + "_rel"] = row[key] / scale
        row[key + "_in_errors"] = None if not err else row[key] / err
    if f32.get("seconds") and tf.get("seconds"):
        row["tf32_speedup"] = f32["seconds"] / tf["seconds"]
    return row


def table(rows: list[dict], device_name: str, argv: list[str]) -> str:
    fmt = lambda v, f="{:.3g}": "" if v is None else f.format(v)  # noqa: E731
    lines = [f"# TF32's effect on each probe's value, {device_name}", "",
             f"`python benchmarks/bench_tf32.py {' '.join(argv)}`. Defaults of every probe, seed 0; float64 is the "
             "reference. 'in errors': the difference over the float32 run's own error (stderr, or an iteration's "
             "bound; blank when the value is exact). TF32 − float32 shares the draws, so it is TF32's alone.", "",
             "| model | probe | float64 | float32 | TF32 | float32−f64 (rel) | TF32−f64 (rel) | TF32−f32 (rel) "
             "| TF32−f32 in errors | s f32 | s TF32 | speed-up | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        v = r["variants"]
        lines.append(f"| {r['model']} | {r['probe']} | {fmt(v[0].get('value'), '{:.8g}')} | {fmt(v[1].get('value'), '{:.8g}')} | "
                     f"{fmt(v[2].get('value'), '{:.8g}')} | {fmt(r.get('f32_vs_f64_rel'))} | {fmt(r.get('tf32_vs_f64_rel'))} | "
                     f"{fmt(r.get('tf32_vs_f32_rel'))} | {fmt(r.get('tf32_vs_f32_in_errors'))} | "
                     f"{fmt(v[1].get('seconds'), '{:.2f}')} | {fmt(v[2].get('seconds'), '{:.2f}')} | "
                     f"{fmt(r.get('tf32_speedup'), '{:.2f}')} | {str(r.get('note', '')).replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> list[dict]:
    import torch

    from flatcheck.probes.registry import list_probes

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="demo,test_vit")
    ap.add_argument("--probes", default=None, help="comma-separated [default: every registered probe]")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--jsonl", type=Path, default=None)
    args = ap.parse_args(argv)
    probes = args.probes.split(",") if args.probes else list(list_probes())
    device_name = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "CPU"
    rows: list[dict] = []
    for name in args.models.split(","):
        model, data, test = MODELS[name]()
        for probe in probes:
            variants = [measure_variant(model, data, test, probe, args.samples, args.device, d, t) for d, t in VARIANTS]
            rows.append(compare(name, probe, variants))
            r = rows[-1]
            print(f"{name} {probe}: TF32−f32 {r.get('tf32_vs_f32_rel', float('nan')):.3g} rel, "
                  f"{r.get('tf32_vs_f32_in_errors') or float('nan'):.3g} errors {r.get('note', '')}",
                  file=sys.stderr, flush=True)
            if args.jsonl is not None:
                _write(args.jsonl, "".join(json.dumps(x, default=str) + "\n" for x in rows))
            if args.out is not None:
                _write(args.out, table(rows, device_name, argv))
    print(table(rows, device_name, argv))
    return rows


if __name__ == "__main__":
    main()
