"""Reading and appending results: JSON reports, JSONL scans and their per-rank shards.

A scan file is append-only JSONL, one record per model. Each record is written with a
single write() of a whole line and fsynced, so a crash can leave at most one trailing
partial line; readers ignore it and `repair_tail` cuts it off before appending again.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import ConfigError, InputError

SHARD_SUFFIX = ".rank"  # scan.jsonl.rank0, scan.jsonl.rank1 … one per torchrun rank or --shard

# ---------------------------------------------------------------- the record

# Where a record sits on a training trajectory: top-level integer fields (absent or null when
# unknown). A scan of --checkpoints reads them from the checkpoint's name or its safetensors
# metadata; the training tracker writes the step it was called with. `report --x step` plots
# any field against them.
TRAJECTORY_FIELDS = ("step", "epoch")
# The run settings that decide what a number means (the scan's fingerprint fields, less the
# model): results whose settings differ are not points of one comparison.
SETTINGS_FIELDS = ("data", "data_root", "split", "samples", "batch_size", "dtype", "bn_mode", "seed", "params",
                   "backend", "probes", "budget", "allow_tf32")  # budget, allow_tf32: only when given / on


def new_record(model: str, *, kind: str, fingerprint: str, origin: str, settings: dict[str, Any],
               family: str | None = None, step: int | None = None, epoch: int | None = None,
               run: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One JSONL line of a scan or of a training tracker, before its results are filled in.

    status is "ok", "error" (with `error`, one line) or "skipped"; `results` maps a probe's
    name to its ProbeResult.to_dict(); `extra` holds what a tracker's caller passed (lr, loss).
    `run` names the training run a step belongs to, when the records of one run carry several
    model names (a folder of checkpoints); `report --x step` draws a line per run (else per model)."""
    from ..report.result import SCHEMA_VERSION
    from .scan_sources import family as family_of

    return {
        "schema_version": SCHEMA_VERSION, "kind": kind, "model": model, "family": family or family_of(model),
        "fingerprint": fingerprint, "origin": origin, "status": "ok", "error": None,
        "step": step, "epoch": epoch, "run": run, "settings": settings, "extra": dict(extra or {}),
        "seconds": 0.0, "results": {},
    }


def schema_tuple(version: Any) -> tuple[int, int] | None:
    """A schema_version as numbers to compare ("2.7" → (2, 7)); None for anything else, or none."""
    parts = version.split(".") if isinstance(version, str) else []
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 and all(p.isdigit() for p in parts) else None


def shard_path(out: Path, rank: int, world_size: int) -> Path:
    return out if world_size <= 1 else out.with_name(f"{out.name}{SHARD_SUFFIX}{rank}")


def write_record(fd: int, record: dict[str, Any], path: Path) -> None:
    """One os.write of a whole line, then fsync, so that no reader sees half a record."""
    line = (json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")
    written = os.write(fd, line)
    if written != len(line):  # a full disk; the next repair_tail drops the fragment
        raise OSError(f"short write to {path} ({written} of {len(line)} bytes)")
    os.fsync(fd)


class HeldOutput:
    """A JSONL output that one writer holds for as long as it is open.

    The lock is flock(LOCK_EX | LOCK_NB) on the output file itself, not a lock file holding
    a PID: the kernel drops it with the last descriptor, so a writer killed with SIGKILL
    leaves nothing stale. Records go through the held descriptor, so they land in the file
    that is locked even if the path is deleted and made again meanwhile.
    """

    def __init__(self, path: Path, flag: str):
        self.path = path
        self.fd = _open_locked(path, flag)

    def append(self, record: dict[str, Any]) -> None:
        write_record(self.fd, record, self.path)

    def truncate(self) -> None:
        os.ftruncate(self.fd, 0)

    def still_named(self) -> bool:
        """Whether the path still names the held file: it, or its folder, may be removed while a
        long scan runs, and its records would then go with the last descriptor."""
        try:
            return os.path.samestat(os.fstat(self.fd), os.stat(self.path))
        except OSError:  # gone, its folder now a file (NotADirectoryError), or unreadable
            return False

    def contents(self) -> bytes:
        size, parts, at = os.fstat(self.fd).st_size, [], 0
        while at < size and (part := os.pread(self.fd, size - at, at)):
            parts.append(part)
            at += len(part)
        return b"".join(parts)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "HeldOutput":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_locked(path: Path, flag: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"{flag} {path}: another scan holds this file and is still writing it; "
                             f"wait for it to end, or give another {flag}") from None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder before us deleted the file as we opened it: lock the new one


def check_records_file(path: Path, flag: str, *, action: str) -> None:
    """Refuse to cut or empty an existing file that is not a scan's or tracker's JSONL (a
    checkpoint, the data, a spec named as the output by mistake): `--overwrite` would empty
    it, a resume or a restarted tracker would cut its last line. A file whose only line is
    cut short is a record all the same when it starts as new_record's lines do."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 20)
    except FileNotFoundError:
        return
    if not head:
        return
    line, newline, _ = head.partition(b"\n")
    if newline:
        try:
            first = json.loads(line)
        except ValueError:
            first = None
        ok = isinstance(first, dict) and "fingerprint" in first and "status" in first
    else:
        ok = head.startswith(b'{"schema_version"')
    if not ok:
        raise ConfigError(f"{flag} {path}: exists and is not a flatcheck scan or tracker file (its first line is "
                          f"no record); {action} would destroy it: give another {flag}")


def repair_tail(path: Path) -> int:
    """Cut a trailing partial line (a crash mid-write); returns the bytes removed."""
    if not path.exists():
        return 0
    with open(path, "rb+") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        if size == 0:
            return 0
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return 0
        # read backwards in blocks until the last newline
        pos, keep = size, 0
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                keep = pos + nl + 1
                break
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
        return size - keep


@dataclass
class Loaded:
    records: list[dict[str, Any]]
    warnings: list[str]
    # where each record came from: FILE (a report), FILE:LINE (a scan's line), "A + B" (merged reports)
    sources: list[str] = field(default_factory=list)


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Each path plus its rank shards, so `report scan.jsonl` also reads scan.jsonl.rank*.
    A file named twice (a.json, ./a.json) is read once."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in paths:
        p = Path(p)
        shards = sorted(Path(s) for s in glob.glob(glob.escape(str(p)) + SHARD_SUFFIX + "*")
                        if s[len(str(p)) + len(SHARD_SUFFIX):].isdigit())
        if not p.exists() and not shards:
            raise InputError(f"{p}: no such file (nor shards {p.name}{SHARD_SUFFIX}N)")
        if p.is_dir():
            raise InputError(f"{p}: is a folder; give a .json report or a .jsonl scan")
        for q in ([p] if p.exists() else []) + shards:
            if q.resolve() not in seen:
                seen.add(q.resolve())
                out.append(q)
    return out


def load_results(paths: Iterable[str | Path]) -> Loaded:
    """Records from JSON reports and JSONL scans, one per model (and step or epoch).

    Scan and tracker records: a later record of the same model (name, checkpoint path, step,
    epoch) measured with the same `settings` supersedes the earlier one, in the earlier one's
    place. That is how `scan --resume` decides: the fingerprint hashes the name, the file's
    path, size and mtime, and the settings, so with the settings equal a new fingerprint means
    the checkpoint changed and was measured again (and --retry-errors repeats a fingerprint, as
    does a resume over a record an older flatcheck wrote: scan.set_aside_older).
    How many were left out is among the warnings. A record of other settings is another data
    point, kept; `report` refuses to mix those unless told.

    Plain `--json` reports: a model is its checkpoint (the path resolved against the current
    folder, with the file's sha256 and the spec's), or, without one (flatcheck.measure on a
    live model), the report file itself. Reports of one model whose settings (less the probes)
    agree are merged into one record, their probes side by side; two of them holding the same
    probe are refused, naming both files, since which one to show would be a guess."""
    kept: dict[tuple, tuple[dict[str, Any], str]] = {}
    notes: list[str] = []
    superseded: list[str] = []
    repeated: dict[tuple[str, str], list[str]] = {}  # (earlier file, later file) -> models
    for path in expand_paths(paths):
        for rec, where in _read_one(path, notes):
            key = _identity(rec, where)
            if key not in kept:
                kept[key] = (rec, where)
            elif _is_report(rec):
                kept[key] = _merge_reports(kept[key], (rec, where))
            else:
                before = kept[key][1].rsplit(":", 1)[0]
                if before == str(path):  # a later line of the same file: a resume measured it again
                    superseded.append(f"{kept[key][0].get('model')} ({kept[key][1]})")
                else:  # another file holds the model again: two scans of one family, say
                    repeated.setdefault((before, str(path)), []).append(str(kept[key][0].get("model")))
                kept[key] = (rec, where)
    if superseded:
        notes.append(f"left out {len(superseded)} superseded record{'s' if len(superseded) > 1 else ''}, each "
                     f"replaced by a later record of the same model with the same settings (a checkpoint "
                     f"changed, or the record was of an older schema, and `scan --resume` measured it again, or "
                     f"--retry-errors): "
                     f"{', '.join(superseded[:5])}{' …' if len(superseded) > 5 else ''}")
    for (before, after), models in repeated.items():
        notes.append(f"{after} measures {len(models)} model{'s' if len(models) > 1 else ''} of {before} again with "
                     f"the same settings; its record{'s are' if len(models) > 1 else ' is'} shown (the file given "
                     f"later): {', '.join(models[:5])}{' …' if len(models) > 5 else ''}")
    return Loaded([r for r, _ in kept.values()], notes, [w for _, w in kept.values()])


def record_key(rec: dict[str, Any]) -> tuple:
    """What `scan --resume` finds done: a model under one fingerprint, at one step or epoch."""
    return (rec.get("model"), rec.get("fingerprint"), *(rec.get(f) for f in TRAJECTORY_FIELDS))


def _is_report(rec: dict[str, Any]) -> bool:
    return "fingerprint" not in rec  # scan and tracker records carry one (new_record); a --json report does not


def checkpoint_path(rec: dict[str, Any]) -> str | None:
    """The checkpoint a record measured, as it was given: a scan record's `checkpoint`, a report's checkpoint.path."""
    ckpt = rec.get("checkpoint")
    path = ckpt.get("path") if isinstance(ckpt, dict) else ckpt
    return path if isinstance(path, str) and path else None


def _identity(rec: dict[str, Any], where: str) -> tuple:
    """The model (and the settings) a record stands for: records of one identity are one row."""
    ckpt = checkpoint_path(rec)
    resolved = os.path.abspath(ckpt) if ckpt else None
    if not _is_report(rec):
        return ("record", rec.get("model"), resolved, *(rec.get(f) for f in TRAJECTORY_FIELDS),
                json.dumps(rec.get("settings"), sort_keys=True, default=str))
    if resolved is None:
        return ("report", str(Path(where).resolve()))
    spec = (rec.get("model_info") or {}).get("spec_sha256")
    settings = {**run_settings_of(rec, with_options=False), "probes": None}  # other probes merge
    return ("checkpoint", resolved, rec["checkpoint"].get("sha256"), spec, json.dumps(settings, sort_keys=True,
                                                                                        default=str))


def _merge_reports(a: tuple[dict[str, Any], str], b: tuple[dict[str, Any], str]) -> tuple[dict[str, Any], str]:
    (old, old_where), (new, new_where) = a, b
    both = sorted(set(old.get("results", {})) & set(new.get("results", {})))
    if both:
        raise InputError(f"{old_where} and {new_where} both hold {', '.join(both)} of {checkpoint_path(new)} "
                         f"on the same model, data and run settings (their probe options may differ); give one "
                         "of them")
    return {**old, "results": {**old.get("results", {}), **new.get("results", {})}}, f"{old_where} + {new_where}"


def _read_one(path: Path, notes: list[str]) -> list[tuple[dict[str, Any], str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a text file (expected a JSON report or a JSONL scan)") from None
    stripped = text.lstrip()
    if stripped.startswith("{") and "\n{" not in stripped:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            return [(_as_record(obj, path), str(path))]
    out = []
    lines = text.split("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):  # no newline after it: a write cut short by a crash
                notes.append(f"{path}: ignored a partial last line (an interrupted scan)")
                continue
            raise InputError(f"{path}:{i}: not valid JSON") from None
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{i}: expected a JSON object per line")
        out.append((_as_record(obj, path), f"{path}:{i}"))
    return out


def _as_record(obj: dict[str, Any], path: Path) -> dict[str, Any]:
    """A plain `--json` report becomes a record named after its checkpoint (or the file); its
    own `model` section (arch, spec, params_filter) moves to `model_info`."""
    if "results" not in obj and "status" not in obj:
        raise InputError(f"{path}: not a flatcheck report (no 'results')")
    if "model" not in obj or not isinstance(obj.get("model"), str):
        ckpt = obj.get("checkpoint") or {}
        name = Path(ckpt["path"]).stem if isinstance(ckpt, dict) and ckpt.get("path") else path.stem
        info = obj["model"] if isinstance(obj.get("model"), dict) else {}
        obj = {**obj, "model": name, "model_info": info, "status": obj.get("status", "ok")}
    obj.setdefault("status", "ok")
    obj.setdefault("results", {})
    return obj


# ---------------------------------------------------------------- settings


def run_settings_of(rec: dict[str, Any], *, with_options: bool) -> dict[str, Any]:
    """The settings that must agree for two records to be points of one comparison: a scan
    record's `settings`, or what a plain report's meta says of them. Not the model's own
    input size (a family's models differ in it) nor where the data lie (data_root) or how
    they were batched; probe options only when every record carries them (`with_options`)."""
    meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else rec
    data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
    given = rec.get("settings") if isinstance(rec.get("settings"), dict) else {}
    # a plain report's model section is under model_info (_as_record), a scan record's under meta
    model = meta.get("model") if isinstance(meta.get("model"), dict) else rec.get("model_info")
    out = {
        "data": data.get("name", given.get("data")),
        "split": data.get("split", given.get("split")),
        "samples": data.get("samples", given.get("samples")),  # the count used, not the flag
        "seed": meta.get("seed", given.get("seed")),
        "dtype": meta.get("dtype", given.get("dtype")),
        "bn_mode": meta.get("bn_mode", given.get("bn_mode")),
        "backend": meta.get("backend", given.get("backend")),
        "params": model.get("params_filter") if isinstance(model, dict) else given.get("params"),
        "probes": sorted(rec.get("results", {})) if not given.get("probes") else sorted(p for p, _ in given["probes"]),
    }
    if not out["params"]:
        out["params"] = None
    out["budget"] = given.get("budget")  # a budgeted run stops early: not the same setting
    # TF32 products are not exact float32 ones; off and not recorded (older reports) read alike
    out["allow_tf32"] = True if meta.get("allow_tf32") is True or given.get("allow_tf32") is True else None
    if with_options:
        out["probe_options"] = {p: o for p, o in given["probes"]}
    return out


def settings_groups(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str]]]:
    """Records grouped by run_settings_of: (settings, model names) per distinct setting.
    Which probes a record holds is not a setting: a probe one record lacks is a blank cell of
    its row, and a field two records share was measured alike if its probe's options agree.
    So the probe set is left out, and a probe's options count only among the records that
    ran it: those that differ there are split by them."""
    ok = [r for r in records if r.get("status", "ok") == "ok"]
    with_options = bool(ok) and all(isinstance(r.get("settings"), dict) and r["settings"].get("probes") for r in ok)
    settings = [run_settings_of(r, with_options=with_options) for r in ok]
    split = set()  # probes whose options differ among the records that ran them
    if with_options:
        seen: dict[str, str] = {}
        for s in settings:
            for p, o in s["probe_options"].items():
                text = json.dumps(o, sort_keys=True, default=str)
                if seen.setdefault(p, text) != text:
                    split.add(p)
    groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for r, s in zip(ok, settings):
        s = {k: v for k, v in s.items() if k != "probes"}
        if with_options:
            s["probe_options"] = {p: o for p, o in s["probe_options"].items() if p in split}
        groups.setdefault(json.dumps(s, sort_keys=True, default=str), (s, []))[1].append(r.get("model", "?"))
    return list(groups.values())


def describe_difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = [k for k in {**a, **b} if a.get(k) != b.get(k)]
    return "; ".join("{} {} vs {}".format(k, *_apart(a.get(k), b.get(k))) for k in keys)


def _apart(u: Any, v: Any, width: int = 60) -> tuple[str, str]:
    """Two differing values as JSON, each cut to about `width` characters around where they
    first differ: cut at the same place from the start, two long option lists would read alike."""
    texts = [json.dumps(x, sort_keys=True, default=str) for x in (u, v)]
    if max(map(len, texts)) <= width:
        return texts[0], texts[1]
    same = len(os.path.commonprefix(texts))
    start = max(0, same - width // 3)  # a little of what they share, for context

    def cut(text: str) -> str:
        piece = text[start:start + width]
        return ("…" if start else "") + piece + ("…" if start + width < len(text) else "")

    return cut(texts[0]), cut(texts[1])


# ---------------------------------------------------------------- fields


class FieldMissing(KeyError):
    pass


def resolve_field(results: dict[str, Any], path: str) -> tuple[Any, Any]:
    """Value and standard error at a dotted path into `results` ("trace.value",
    "gini.details.accuracy"). Shorthands: "trace" means "trace.value", and "mls.normalized"
    falls back to "mls.details.normalized". The standard error is the sibling "stderr" of a
    "value", or the sibling "<name>_stderr"; None when there is none (an exact number)."""
    parent, node, last = _locate(results, path)
    stderr = parent.get("stderr" if last == "value" else f"{last}_stderr") if isinstance(parent, dict) else None
    return node, stderr


def field_sibling(results: dict[str, Any], path: str, suffix: str) -> Any:
    """The sibling "<name><suffix>" of the field at `path`, found as resolve_field finds the
    field ("mls.normalized_mls" → "mls.details.normalized_mls_error_bound"); None without one."""
    parent, _, last = _locate(results, path)
    return parent.get(f"{last}{suffix}") if isinstance(parent, dict) else None


def _locate(results: dict[str, Any], path: str) -> tuple[Any, Any, str]:
    """(parent, value, name) of a dotted path, with resolve_field's shorthands."""
    parts = [p for p in path.split(".") if p]
    if not parts:
        raise FieldMissing(path)
    candidates = [parts]
    if len(parts) >= 2 and parts[1] != "details":
        candidates.append([parts[0], "details", *parts[1:]])
    for cand in candidates:
        try:
            parent, node, last = _walk(results, cand)
        except FieldMissing:
            continue
        if isinstance(node, dict) and "value" in node:  # "trace" or "…layers.conv1"
            return node, node["value"], "value"
        return parent, node, last
    raise FieldMissing(path)


def record_value(record: dict[str, Any], path: str) -> tuple[Any, Any]:
    """A field of a whole record: "step"/"epoch" (TRAJECTORY_FIELDS), "extra.KEY" (what a
    tracker's caller passed), or a path into its results (resolve_field)."""
    if path in TRAJECTORY_FIELDS:
        if record.get(path) is None:
            raise FieldMissing(path)
        return record[path], None
    if path.startswith("extra."):
        _, node, _ = _walk(record.get("extra") or {}, [p for p in path.split(".")[1:] if p])
        return node, None
    return resolve_field(record.get("results", {}), path)


def field_label(records: Iterable[dict[str, Any]], path: str) -> str:
    """The words for an axis: the probe's own label ("adaptive sharpness S_ρ") for its
    headline value, "label: key" for a detail, the path itself when no record has a label."""
    if path in TRAJECTORY_FIELDS or path.startswith("extra."):
        return path.split(".", 1)[-1]
    parts = [p for p in path.split(".") if p]
    for rec in records:
        res = rec.get("results", {}).get(parts[0]) if parts else None
        if isinstance(res, dict) and isinstance(res.get("label"), str) and res["label"]:
            rest = [p for p in parts[1:] if p not in ("details", "value")]
            return res["label"] if not rest else f"{res['label']}: {'.'.join(rest)}"
    return path


def keys_near(results: dict[str, Any], path: str) -> str:
    """What a result holds where `path` stops matching, for a message about a misspelt field:
    the keys of the deepest mapping the path reaches below a probe's details (a layer's name
    among `trace.details.layers`), else the probe's top level and details."""
    parts = [p for p in path.split(".") if p]
    node: Any = results
    trail: list[str] = []
    i = 0
    while i < len(parts):
        j = next(iter(_key_runs(node, parts[i:])), None)
        if j is None:
            break
        key = ".".join(parts[i:i + j])
        node, i = node[key], i + j
        trail.append(key)
    if len(trail) > 2 and isinstance(node, dict):
        keys = sorted(map(str, node))
        return f"{'.'.join(trail)} holds {', '.join(keys[:12])}{' …' if len(keys) > 12 else ''}"
    probe = results.get(parts[0]) if parts else None
    details = (probe or {}).get("details") if isinstance(probe, dict) else None
    have = ", ".join(sorted(details)) if isinstance(details, dict) and details else "none"
    return f"top-level: value, stderr; details: {have}"


def _walk(obj: Any, parts: list[str]) -> tuple[Any, Any, str]:
    """(parent, value, key) at `parts` below `obj`. A key may itself hold dots — a layer named
    `features.0` or `layer1.0.conv1`, a parameter `features.0.weight` — so at each level the
    longest run of parts that is a key is tried first, then shorter ones."""
    for j in _key_runs(obj, parts):
        key = ".".join(parts[:j])
        if j == len(parts):
            return obj, obj[key], key
        try:
            return _walk(obj[key], parts[j:])
        except FieldMissing:
            continue
    raise FieldMissing(".".join(parts))


def _key_runs(obj: Any, parts: list[str]) -> list[int]:
    """The lengths j, longest first, for which parts[:j] joined by dots is a key of `obj`."""
    if not isinstance(obj, dict):
        return []
    return [j for j in range(len(parts), 0, -1) if ".".join(parts[:j]) in obj]


def as_number(x: Any) -> float | None:
    """JSON numbers, plus the "nan"/"inf" strings reports write for non-finite values."""
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str) and x.lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return float(x)
    return None
