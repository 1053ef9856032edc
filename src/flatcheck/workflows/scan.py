"""Scan many models with the same probes, one JSONL record per model, crash-safe.

Each record is appended as soon as its model is done (results_io.write_record: one
write, fsync), so an interrupted scan loses at most the model in flight. `resume` skips
models whose (name, fingerprint) is already in the file; the fingerprint hashes everything
that changes the numbers (model, weights, data, samples, probes and their options, seed …),
so a scan resumed with other settings redoes the models rather than mixing results. The
code that measured is the record's schema_version: a record an older flatcheck wrote is
measured again too, and one a newer flatcheck wrote refuses the resume.

Under torchrun (RANK/WORLD_SIZE set), or as shard I of `--shard I/N`, rank r takes models
i ≡ r (mod world) and writes its own shard OUT.rank{r}; the ranks never talk to each other,
and `flatcheck report` merges. Each model runs in a child process; a model that fails — bad
spec, load error, MemoryError, a child the kernel kills, non-finite result — becomes a record
with status "error" (and the child's peak memory in `process`) and the scan goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..config import RunConfig
from ..errors import ConfigError
from ..report.pulse import listening
from . import child_process
from .results_io import (HeldOutput, Loaded, check_records_file, describe_difference, load_results, new_record,
                         record_key, repair_tail, schema_tuple, shard_path)
from .scan_sources import Entry, in_scan_words, offline, shared_refusal

RECORD_KIND = "flatcheck.scan"


@dataclass(frozen=True)
class Placement:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "Placement":
        try:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            rank = int(os.environ.get("RANK", "0"))
            local = int(os.environ.get("LOCAL_RANK", str(rank)))
        except ValueError:
            raise ConfigError("RANK/WORLD_SIZE/LOCAL_RANK must be integers") from None
        if world < 1 or not 0 <= rank < world:
            raise ConfigError(f"RANK {rank} is not within WORLD_SIZE {world}")
        return cls(rank, world, local)

    @classmethod
    def from_shard(cls, text: str) -> "Placement":
        """--shard I/N: for schedulers that start N independent processes (a Slurm job array,
        N plain shells); shard I takes models i ≡ I (mod N) and writes OUT.rankI, as rank I of
        a torchrun would, so `flatcheck report` merges them the same way."""
        if _under_torchrun():
            raise ConfigError(f"--shard {text}: torchrun shards the scan already (RANK/WORLD_SIZE are set); "
                              "leave --shard out under torchrun")
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not m:
            raise ConfigError(f"--shard expects I/N (shard I of N, counted from 0), got {text!r}")
        rank, world = int(m.group(1)), int(m.group(2))
        if world < 1:
            raise ConfigError(f"--shard {text}: N, the number of shards, must be at least 1")
        if rank >= world:
            raise ConfigError(f"--shard {text}: I must be from 0 to N-1 (shards are counted from 0)")
        return cls(rank, world, 0)

    def mine(self, entries: list[Entry]) -> list[Entry]:
        return [e for i, e in enumerate(entries) if i % self.world_size == self.rank]


def _under_torchrun() -> bool:
    return any(k in os.environ for k in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK"))


def run_settings(base: RunConfig) -> dict[str, Any]:
    """What changes the numbers besides the model (results_io.SETTINGS_FIELDS)."""
    return {
        "data": base.data, "data_root": str(base.data_root) if base.data_root else None, "split": base.split,
        "samples": base.samples, "batch_size": base.batch_size, "dtype": base.dtype, "bn_mode": base.bn_mode,
        "seed": base.seed, "params": list(base.params), "backend": base.backend,
        "probes": [[r.name, dataclasses.asdict(r.options)] for r in base.probes],
        # a budget stops iterative probes early (their values then depend on the machine's
        # speed): records made with one are not those of a run without. Only when given, so
        # that earlier scans' fingerprints (and --resume over them) stay as they were.
        **({"budget": base.budget} if base.budget is not None else {}),
        # TF32 products move some values past their error bars; likewise only when on
        **({"allow_tf32": True} if base.allow_tf32 else {}),
    }


def fingerprint(entry: Entry, base: RunConfig) -> str:
    blob = json.dumps({"model": entry.name, **entry.describe, "run": run_settings(base)}, sort_keys=True,
                      default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class ScanHooks:
    """How a scan reports progress; all optional, the library itself prints nothing."""

    start: Callable[[int, int, Entry], None] | None = None  # (index in this rank, total, entry)
    done: Callable[[dict[str, Any]], None] | None = None
    probe_progress: Callable[[str, int, int], None] | None = None


@dataclass
class ScanSummary:
    out: Path
    total: int  # models of this rank
    already: int  # found in the file (resume)
    records: list[dict[str, Any]]  # written by this run
    repaired_bytes: int = 0
    # the records in the file of this rank's models that this run did not redo (resume): with
    # `records`, the latest record of every model of the scan, which its exit code is about
    earlier: list[dict[str, Any]] = field(default_factory=list)
    # what became of the records when --out lost its path during the scan (keep_records), in
    # words, and whether they are now elsewhere than --out
    moved: str | None = None
    elsewhere: bool = False

    def counts(self, records: list[dict[str, Any]] | None = None) -> dict[str, int]:
        c = {"ok": 0, "error": 0, "skipped": 0}
        for r in self.records if records is None else records:
            c[r["status"]] = c.get(r["status"], 0) + 1
        return c

    def latest(self) -> list[dict[str, Any]]:
        return self.earlier + self.records


def check_output(out: Path) -> None:
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a folder; give a .jsonl file path")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: folder {out.parent} does not exist")


def prepare_output(out: HeldOutput, *, resume: bool, overwrite: bool, retry_errors: bool) -> tuple[dict, int]:
    """The records already done, by record_key, and the bytes of a partial last line cut off."""
    path = out.path
    check_records_file(path, "--out", action="--overwrite" if overwrite else "a scan appending to it")
    if path.stat().st_size > 0 and not (resume or overwrite):
        raise ConfigError(f"--out {path} exists; pass --resume to continue that scan or --overwrite to start over")
    if overwrite and not resume:
        out.truncate()
        return {}, 0
    cut = repair_tail(path)
    if not path.stat().st_size:
        return {}, cut
    loaded = load_results([path])
    refuse_newer_schema(loaded, path)
    done = {record_key(r): r for r in loaded.records if not (retry_errors and r.get("status") == "error")}
    return done, cut


def refuse_newer_schema(loaded: Loaded, target: Path) -> None:
    """A record a newer flatcheck wrote may mean other things by the same keys: this one would
    count it done, or supersede it with its own numbers, in a file it does not understand."""
    from ..report.result import SCHEMA_VERSION

    now = schema_tuple(SCHEMA_VERSION)
    newer = [(r.get("schema_version"), where) for r, where in zip(loaded.records, loaded.sources)
             if (schema_tuple(r.get("schema_version")) or now) > now]
    if newer:
        versions = ", ".join(sorted({str(v) for v, _ in newer}))
        line = newer[0][1][len(str(target)) + 1:] or 1  # FILE:LINE, or FILE alone for a one-line file
        raise ConfigError(f"--resume: {target} holds {_count(len(newer), 'record')} of schema {versions} (the first "
                          f"at line {line}), newer than this flatcheck's {SCHEMA_VERSION}; continue that scan with "
                          "the flatcheck that wrote it, or give another --out")


def set_aside_older(done: dict[tuple, dict[str, Any]], mine: list[Entry], target: Path) -> str | None:
    """Take out of `done` the records an older flatcheck wrote (a schema_version below this one's,
    or none): their numbers may be ones this version no longer gives (2.7: float32 curvature
    where the softmax saturates), so their models are measured again, as after a changed
    checkpoint, and load_results lets the new line supersede the old. Returns the line to say."""
    from ..report.result import SCHEMA_VERSION

    now = schema_tuple(SCHEMA_VERSION)
    older = [k for k, r in done.items() if (schema_tuple(r.get("schema_version")) or (0, 0)) < now]
    if not older:
        return None
    versions = " or ".join(sorted({str(done[k].get("schema_version") or "none") for k in older}))
    ours = {(e.name, e.step, e.epoch) for e in mine}
    again = sum((k[0], *k[2:]) in ours for k in older)
    for k in older:
        del done[k]
    rest = len(older) - again
    said = (f"--resume: {_count(len(older), 'record')} in {target} {'is' if len(older) == 1 else 'are'} of schema "
            f"{versions}, older than this flatcheck's {SCHEMA_VERSION}, whose numbers may differ from this version's")
    if again:
        said += f": {again} {'is' if again == 1 else 'are'} measured again, the new record superseding the old"
    if rest:  # report still shows these beside the new records: say so
        said += (f"{';' if again else ':'} {rest}{' more' if again else ''} of models this scan does not name "
                 f"{'stays' if rest == 1 else 'stay'} as written")
    return said


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# settings that change no number a report compares (results_io.run_settings_of leaves them out)
_NOT_COMPARED = ("data_root", "batch_size")


def check_same_settings(records: Iterable[dict[str, Any]], settings: dict[str, Any], target: Path) -> None:
    """A resume continues one scan: records under other run settings would be measured again
    beside the old ones, and `report` then refuses the file as mixed. Refused up front."""
    def comparable(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k not in _NOT_COMPARED}

    now = comparable(settings)
    for rec in records:
        then = rec.get("settings")
        if isinstance(then, dict) and comparable(then) != now:
            raise ConfigError(f"--resume: {target} holds records made with other run settings "
                              f"({describe_difference(comparable(then), now)}); a resume continues the same "
                              "scan: give another --out, or --overwrite to start over")


def check_same_shard(records: Iterable[dict[str, Any]], placement: Placement, target: Path) -> None:
    """A resume under another --shard I/N deals the models out otherwise: the file's records are
    another shard's models, and this run would measure its own again beside them."""
    now = (placement.rank, placement.world_size)
    for rec in records:
        then = (rec.get("rank"), rec.get("world_size"))
        if isinstance(then[1], int) and then != now:
            raise ConfigError(f"--resume: {target} holds the records of shard {then[0]}/{then[1]} (--shard "
                              f"{then[0]}/{then[1]}), not of shard {now[0]}/{now[1]}; a resume continues the same "
                              "sharding: give that --shard, another --out, or --overwrite to start over")


def run_scan(entries: list[Entry], base: RunConfig, out: Path, *, resume: bool = False, overwrite: bool = False,
             retry_errors: bool = False, placement: Placement = Placement(), hooks: ScanHooks = ScanHooks(),
             isolate: bool = True) -> ScanSummary:
    """Run `base`'s probes on each of this rank's entries, appending a record per model.

    Each model runs in a child process (child_process.run_in_child) unless `isolate` is off or
    the platform has no fork: a model the kernel kills is then an error record, with the
    signal and the child's peak memory, and the scan goes on. The rank's output file is held
    (results_io.HeldOutput) from before it is read until the last record is written: a second
    scan onto it is refused rather than both appending the same models; other ranks' shards
    are other files and do not wait on it."""
    target = shard_path(out, placement.rank, placement.world_size)
    check_output(target)
    refuse_shared_setup(entries, base, placement)
    settings = json.loads(json.dumps(run_settings(base), default=str))
    with HeldOutput(target, "--out") as held:
        done, cut = prepare_output(held, resume=resume, overwrite=overwrite, retry_errors=retry_errors)
        if resume:
            check_same_settings(done.values(), settings, target)
            check_same_shard(done.values(), placement, target)
        mine = placement.mine(entries)
        older = set_aside_older(done, mine, target) if resume else None
        if older:
            warnings.warn(older)  # the CLI's one `flatcheck: warning:` line
        keyed = [(e, fp, (e.name, fp, e.step, e.epoch)) for e in mine for fp in (fingerprint(e, base),)]
        todo = [(e, fp) for e, fp, key in keyed if key not in done]
        summary = ScanSummary(target, len(mine), len(mine) - len(todo), [], cut,
                              [done[key] for _, _, key in keyed if key in done])
        isolated = isolate and child_process.available() and child_process.fork_works()
        if isolate and not isolated:
            warnings.warn("scan: this process cannot fork a child that runs autograd (see child_process); the "
                          "models run in this process, so one the system kills for memory ends the scan — run "
                          "`flatcheck scan` as a command for isolation")
        with offline(), (child_process.parent_without_pool() if isolated else contextlib.nullcontext()) as threads:
            if isolated:
                _preload()
            for i, (entry, fp) in enumerate(todo):
                if hooks.start:
                    hooks.start(i, len(todo), entry)
                record = new_record(entry.name, kind=RECORD_KIND, fingerprint=fp, origin=entry.origin,
                                    settings=settings, step=entry.step, epoch=entry.epoch, run=entry.run)
                record.update(checkpoint=str(entry.checkpoint) if entry.checkpoint else None,
                              rank=placement.rank, world_size=placement.world_size)
                if entry.trajectory_from:
                    record["trajectory_from"] = dict(entry.trajectory_from)
                if isolated:
                    record = scan_isolated(entry, record, base, hooks.probe_progress, (held.fd,), threads)
                else:
                    record = scan_one(entry, record, base, hooks.probe_progress)
                held.append(record)
                summary.records.append(record)
                if hooks.done:
                    hooks.done(record)
        summary.moved, summary.elsewhere = keep_records(held)
    return summary


def refuse_shared_setup(entries: list[Entry], base: RunConfig, placement: Placement = Placement()) -> None:
    """A ConfigError for a refusal every model of this rank would meet alike (scan_sources.
    shared_refusal): one exit 2 before any model runs, rather than a record per model."""
    refusal = shared_refusal(placement.mine(entries), base.trust_packages)
    if refusal is not None:
        raise ConfigError(refusal)


def keep_records(held: HeldOutput) -> tuple[str | None, bool]:
    """The held file's records when its path no longer names it (it, or its folder, removed
    during the scan): written at the path again when nothing took its place, else to a new file
    beside it or in the temporary folder (report.io). Returns what to tell (None: nothing
    moved) and whether the records are elsewhere than the path."""
    from ..report.io import rescued_outputs, write_or_rescue, write_spare

    if held.still_named():
        return None, False
    data = held.contents()
    n = data.count(b"\n")
    if os.path.lexists(held.path):
        spare = write_spare(held.path, data)
        where = f"the scan's {n} records are in {spare} instead" if spare else \
            f"the scan's {n} records could not be written anywhere else"
        return f"--out {held.path}: another file took its place during the scan; {where}", True
    with rescued_outputs() as rescued:
        write_or_rescue(held.path, data, "--out")
    if not rescued:
        return f"--out {held.path} was removed during the scan; its {n} records are written there again", False
    return f"{rescued[0]} (the scan's {n} records, removed with it during the scan)", True


def _preload() -> None:
    # import once in the parent, so that every forked child starts with it imported
    from .. import api  # noqa: F401


def scan_isolated(entry: Entry, record: dict[str, Any], base: RunConfig,
                  progress: Callable[..., None] | None, close_in_child: tuple[int, ...],
                  threads: int | None = None) -> dict[str, Any]:
    """scan_one in a child process; the parent fills in what the child could not say."""
    t0 = time.perf_counter()

    def work(send) -> dict[str, Any]:
        if progress is None:
            return scan_one(entry, record, base, None)
        forward = _Forward(send)
        with listening(forward.within):  # the backends' counts within a product, to the parent too
            return scan_one(entry, record, base, forward)

    def on_message(msg) -> None:
        _deliver(progress, msg)

    outcome = child_process.run_in_child(work, on_message=on_message if progress is not None else None,
                                         close_in_child=close_in_child, threads=threads)
    result = outcome.result if outcome.result is not None else {
        **record, "status": "error", "error": f"{outcome.died}; peak resident memory "
                                              f"{_gib(outcome.peak_rss_bytes)}",
        "seconds": round(time.perf_counter() - t0, 3)}
    result["process"] = {"peak_rss_bytes": outcome.peak_rss_bytes, "exit_code": outcome.exit_code,
                         "signal": outcome.signal, "threads": outcome.threads}
    return result


class _Forward:
    """A scan child's progress listener: its call and every hook a display may have
    (report/progress_hooks: a probe's begin and end, a budget's stop and share; report/pulse:
    the counts within a product) sent to the parent as a message of its own kind, where
    scan_isolated hands each to the parent's listener."""

    def __init__(self, send: Callable[[Any], None]):
        self.send = send

    def __call__(self, desc: str, done: int, total: int, *, value: float | None = None,
                 stderr: float | None = None) -> None:
        self.send(["progress", desc, done, total, _finite_or_none(value), _finite_or_none(stderr)])

    def began(self, probe: str) -> None:
        self.send(["began", probe])

    def ended(self, probe: str, value: float | None, stderr: float | None, dof: int | None = None,
              bound: float | None = None) -> None:
        self.send(["ended", probe, _finite_or_none(value), _finite_or_none(stderr), dof, _finite_or_none(bound)])

    def stopped(self, desc: str, reason: str, planned: int | None = None) -> None:
        self.send(["stopped", desc, reason, planned])

    def budget(self, desc: str, seconds: float) -> None:
        self.send(["budget", desc, seconds])

    def within(self, done: int, total: int, vectors: int, built: float = 0.0, anew: bool = False,
               ahead: tuple[int, float] | None = None) -> None:
        self.send(["within", done, total, vectors, built, anew, ahead])


def _deliver(progress: Callable[..., None], msg: list) -> None:
    """A _Forward message, in the parent: the call or hook it stands for, on `progress` (a
    plain callback has none of the display's hooks, and is called only with counts)."""
    kind, *args = msg
    if kind == "progress":
        desc, done, total, value, stderr = args
        progress(desc, done, total, value=value, stderr=stderr)
        return
    hook = getattr(progress, kind, None)
    if hook is None:
        return
    if kind == "within":
        done, total, vectors, built, anew, ahead = args
        hook(done, total, vectors, built=built, anew=anew, ahead=None if ahead is None else tuple(ahead))
    else:
        hook(*args)


def _finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def scan_one(entry: Entry, record: dict[str, Any], base: RunConfig,
             progress: Callable[..., None] | None = None) -> dict[str, Any]:
    import torch

    from .. import api

    record = dict(record)
    if entry.skip_reason:
        return {**record, "status": "skipped", "error": entry.skip_reason}
    t0 = time.perf_counter()
    try:
        spec = entry.make_spec()
        config = dataclasses.replace(base, spec=spec, checkpoint=entry.checkpoint, extra_meta={})
        # random-init models (no checkpoint) must come out the same on every rank and on
        # resume; fork so the caller's RNG state is left as it was
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(base.seed)
            report = api.run(config, progress)
        data = report.to_dict()
        record["results"] = data.pop("results")
        record["meta"] = {k: v for k, v in data.items() if k != "schema_version"}
        bad = [n for n, r in report.results.items() if r.value is None or not math.isfinite(r.value)]
        if bad:
            record.update(status="error", error=f"non-finite value from {', '.join(bad)}")
    except Exception as exc:  # any model's failure is that model's record, never the scan's end
        record.update(status="error", error=in_scan_words(_one_line(exc), entry.checkpoint))
        _free_device_memory()
    record["seconds"] = round(time.perf_counter() - t0, 3)
    return record


def _one_line(exc: BaseException) -> str:
    from ..errors import FlatcheckError
    from ..settings import flag_of

    # a scan is a command: the settings a message names are its flags
    text = " ".join((exc.worded(flag_of) if isinstance(exc, FlatcheckError) else str(exc)).split())
    # flatcheck's own messages are written for users; anything else needs its type to be read
    return text if isinstance(exc, FlatcheckError) else f"{type(exc).__name__}: {text}"


def _free_device_memory() -> None:
    # after an OOM the caching allocator still holds the failed model's blocks
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
