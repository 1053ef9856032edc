"""Scan records made by hand, for `flatcheck report` and the result readers."""

from __future__ import annotations

import json
from pathlib import Path


def record(model, x, y, status="ok", **extra):
    res = {"sharp": {"value": x, "stderr": 0.1 * x, "details": {}},
           "mls": {"value": 1.0, "stderr": None, "details": {"normalized": y, **extra}}}
    return {"model": model, "fingerprint": "f", "status": status, "error": None if status == "ok" else "boom",
            "results": res if status == "ok" else {}}


def write_jsonl(path: Path, recs, tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + tail)
    return path
