"""Regenerate src/flatcheck/data/assets/digits.npz from scikit-learn's digits.csv.gz.

The embedded `digits` data set is the UCI ML hand-written digits test set (1797 images,
8x8, values 0..16) exactly as scikit-learn ships it. flatcheck must not depend on
scikit-learn, so the numbers are copied once into a small npz inside the package:

    python3 -m venv /tmp/skvenv && /tmp/skvenv/bin/pip install scikit-learn
    /tmp/skvenv/bin/python tools/make_digits_asset.py            # finds sklearn's copy
    python tools/make_digits_asset.py --csv path/to/digits.csv.gz  # or any copy of it

Only numpy and the standard library are used to read the csv; scikit-learn is merely
where the file is found. The npz is written with fixed zip timestamps so that the same
csv always gives the same bytes and a regenerated asset shows no spurious git diff.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "src" / "flatcheck" / "data" / "assets" / "digits.npz"
# sha256 of digits.csv.gz as shipped by scikit-learn 1.9.1 (unchanged for many releases);
# a different file is accepted only with --any-csv so a silent upstream change cannot
# slip into the asset.
KNOWN_CSV_SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"


def find_sklearn_csv() -> Path:
    from importlib.resources import files

    return Path(str(files("sklearn.datasets") / "data" / "digits.csv.gz"))


def read_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(path, "rt") as fh:
        table = np.loadtxt(fh, delimiter=",", dtype=np.int64)
    if table.shape != (1797, 65):
        raise SystemExit(f"{path}: expected 1797 rows of 65 integers, got {table.shape}")
    pixels, labels = table[:, :64], table[:, 64]
    if pixels.min() < 0 or pixels.max() > 16 or labels.min() < 0 or labels.max() > 9:
        raise SystemExit(f"{path}: pixel values must lie in 0..16 and labels in 0..9")
    return pixels.reshape(-1, 8, 8).astype(np.uint8), labels.astype(np.int64)


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, help="digits.csv.gz (default: the copy inside scikit-learn)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--any-csv", action="store_true", help="accept a csv whose sha256 is not the known one")
    args = ap.parse_args()

    csv = args.csv or find_sklearn_csv()
    digest = hashlib.sha256(csv.read_bytes()).hexdigest()
    if digest != KNOWN_CSV_SHA256 and not args.any_csv:
        raise SystemExit(f"{csv}: sha256 {digest} is not the known {KNOWN_CSV_SHA256}; pass --any-csv to use it anyway")
    x, y = read_csv(csv)
    write_npz(args.out, {"x": x, "y": y})
    print(f"wrote {args.out}: x {x.shape} {x.dtype}, y {y.shape} {y.dtype}, from {csv} (sha256 {digest[:12]})")


if __name__ == "__main__":
    main()
