"""Tracker: curvature measured as training runs, one JSONL record per tracked step.

    with flatcheck.Tracker(model, (x, y), every=10, out="track.jsonl") as tracker:
        for step in range(steps):
            ...  # the training step
            tracker.step(step, lr=lr, loss=loss.item())

The output is held (locked) from the first step until close(), the end of the `with` block,
or the tracker's collection, whichever comes first.

Everything that does not change between tracked steps is built once, when the tracker is
made: the samples (read and held once), the parameter layout, the backend and whatever it
traces. What does change — the weights — invalidates the backend's per-weights caches
through the version counters the optimiser's in-place updates bump (backends/state.py), so
no product ever reuses a graph of older weights, and no product of an earlier call is reused
(it was taken on other weights). λmax starts warm from a block (linalg/warm_block.py): the
previous tracked step's top eigenvector carried one step on, v_t + (v_t − v_{t−1}) with the
signs aligned, while the last two overlap by EXTRAPOLATE_OVERLAP or more, else v_t (between
steps a few apart, as the edge-of-stability curves of Cohen et al. 2021 are measured, the top
eigenvector moves little, and steadily enough that the line through the last two is the better
guess: benchmarks/results/tracker.md), and beside it the previous next eigenvector, carried on
the same way, whose Ritz value gives the gap the certified bound needs. The block keeps a random
part that can bring a top eigenvalue which crossed the old ones into view; one that crossed by a
small gap can hide behind them for a while, so every `cold_every`-th tracked step starts cold
(recorded as such) and bounds how long.

Records use the scan's schema (results_io.new_record, kind "flatcheck.track"), so
`flatcheck report` plots a tracker's file and a scan of checkpoints alike. A step that fails
(a diverged run's NaN weights) is an error record and training goes on, unless strict=True.
Restarted from an earlier step, the tracker drops the records of that step and later ones.

A record file that goes bad while training runs (removed, its folder removed, a write that
fails) loses no record: every record is also kept in memory (`tracker.records`), and the file's
records go to a new file beside it, else in the temporary folder, else in the working directory
(report.io.write_spare, as a scan's lost output does), which takes the next records too; one
stderr line names it. Training goes on.
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import json
import math
import os
import sys
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError, ModelError, first_line
from ..live import is_finite, measure, preserved, refuse_unknown_keywords
from .results_io import HeldOutput, check_records_file, new_record, repair_tail, write_record

RECORD_KIND = "flatcheck.track"
# a cold λmax every this many tracked steps (the first is cold anyway): bounds how long a top
# eigenvalue that crossed the old one by a small gap can go unseen behind a warm start
COLD_EVERY = 10
# the last two eigenvectors' overlap from which the start is extrapolated from them: below it
# the top eigenvector changed (at the edge of stability the top two swap, overlaps 0.08–0.5)
# and a line through two different eigenvectors points nowhere in particular
EXTRAPOLATE_OVERLAP = 0.9
DEFAULT_PROBES = ("lmax", "trace", "jacobian")
# λmax alone, as the edge-of-stability curves plot it; other options keep the probes' defaults
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {"lmax": {"k": 1}}
# the trackers of this process by the (device, inode) of the output each holds, so that a
# second tracker on that file is told which one holds it (a notebook cell run again)
_HOLDERS: "weakref.WeakValueDictionary[tuple[int, int], Tracker]" = weakref.WeakValueDictionary()


class Tracker:
    """Measures `probes` on `model` over `data` every `every`-th step and appends a record to
    `out` (None: keep no file). `data` is what flatcheck.measure takes, read once here: a
    fixed set of tracking samples. probes, options and the other keywords are measure's (probes
    may map each name to its options); options are merged over DEFAULT_OPTIONS (λmax with k=1). strict=True raises a failed step's error instead of
    recording it. warm_start=False starts every λmax cold; otherwise every `cold_every`-th
    tracked step does (None: only the first). Each tracked step writes one line to stderr
    (step, values, seconds, products); quiet=True keeps it silent."""

    def __init__(self, model: nn.Module, data: Any, probes: Any = DEFAULT_PROBES, *, every: int = 10,
                 out: str | os.PathLike | None = "track.jsonl", options: dict[str, dict[str, Any]] | None = None,
                 strict: bool = False, name: str | None = None, warm_start: bool = True,
                 cold_every: int | None = COLD_EVERY, quiet: bool = False, **measure_kwargs: Any):
        from ..live import open_live_session, probe_options
        from ..models.spec import TRACKER

        # what open_live_session would refuse in its own name: measure's keywords, less those a
        # tracker takes itself or has no use for (progress: each tracked step writes its line)
        refuse_unknown_keywords("Tracker", measure_kwargs, tracker_keywords())
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"every must be a positive integer (measure every K-th step), got {every!r}")
        if cold_every is not None and (isinstance(cold_every, bool) or not isinstance(cold_every, int)
                                       or cold_every < 1):
            raise ConfigError(f"cold_every must be a positive integer (a cold λmax every N-th tracked step) "
                              f"or None, got {cold_every!r}")
        self.cold_every, self._tracked = cold_every, 0
        self.quiet = quiet
        # per warm-start key: the converged eigenvector before the latest, and the start handed
        # out for the latest call (to tell a call that converged from one that failed)
        self._previous: dict[Any, torch.Tensor] = {}
        self._handed: dict[Any, torch.Tensor] = {}
        self.model, self.every, self.strict = model, every, strict
        self.name = name or type(model).__name__
        if out is not None and not isinstance(out, (str, os.PathLike)):
            raise ConfigError(f"out: expected a .jsonl path (str or pathlib.Path) or None, got {type(out).__name__}")
        self.out = None if out is None else Path(out)
        if self.out is not None and (self.out.is_dir() or not self.out.parent.is_dir()):
            raise ConfigError(f"out {self.out}: give a .jsonl file in an existing folder")
        names, chosen = probe_options(probes, options)
        merged = {p: {**DEFAULT_OPTIONS.get(p, {}), **chosen.get(p, {})} for p in names}
        self.session = open_live_session(model, data, probes=names, options=merged, call=TRACKER, **measure_kwargs)
        self.session.warm = {} if warm_start else None
        config = self.session.config
        self.probes = [r.name for r in config.probes]
        self.settings = json.loads(json.dumps(_settings(config), default=str))
        blob = json.dumps({"model": self.name, "data": self.session.samples.fingerprint, "run": self.settings},
                          sort_keys=True)
        self.fingerprint = hashlib.sha256(blob.encode()).hexdigest()[:16]
        self._held: HeldOutput | None = None
        self._started = False
        # this tracker's records, kept whatever becomes of the file (a lost one is rescued from them)
        self.records: list[dict[str, Any]] = []
        if self.out is not None:
            # held from here, not from the first step: a second tracker on the file is refused
            # where it is made, not inside the training loop of the first
            check_records_file(self.out, "out", action="a tracker restarting in it")
            self._take(_hold(self.out))

    # ------------------------------------------------------------------ the two lines

    def step(self, step: int, **extra: Any) -> dict[str, float | None] | None:
        """On every `every`-th step: measure, append one record (flushed to disk), write one
        line to stderr (unless quiet=True) and return {probe: value}: each probe's headline
        value as a float (λmax for lmax, the trace's estimate for trace, …), None for each probe
        of a failed step. The full results (standard errors, bounds, products) are in the
        record, also kept as `tracker.last_record`. Other steps: None, no work.

        `extra` (lr=, loss=, …) goes into the record's "extra"; epoch= is the record's epoch."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"step must be a non-negative integer, got {step!r}")
        if getattr(self, "_closed", False):  # it would measure and record nowhere
            raise ConfigError(f"Tracker.step({step}) after close(): the tracker writes no more records; make a new "
                              "Tracker (on the same out it continues the file)")
        if not self._started:
            self._start(step)
        if step % self.every:
            return None
        t0 = time.perf_counter()
        epoch = extra.pop("epoch", None)
        record = new_record(self.name, kind=RECORD_KIND, fingerprint=self.fingerprint, origin="tracker",
                            settings=self.settings, step=step, epoch=epoch if isinstance(epoch, int) else None,
                            extra={k: _plain(v) for k, v in extra.items()})
        values: dict[str, float | None] = {p: None for p in self.probes}
        probe_seconds = 0.0
        cold = self.cold_every is not None and self._tracked % self.cold_every == 0
        if cold and self.session.warm:
            self.session.warm.clear()  # the guard's cold start: nothing carried from before
            self._previous.clear()
            self._handed.clear()
        self._extrapolate()
        self._tracked += 1
        try:
            report = self._measure(step)
            record["results"] = {name: r.to_dict() for name, r in report.results.items()}
            values = {name: r.value for name, r in report.results.items()}
            probe_seconds = sum(r.seconds for r in report.results.values())
        except Exception as exc:  # noqa: BLE001 - a failed step must not end the training run
            if self.strict:
                raise
            record.update(status="error", error=first_line(exc) or type(exc).__name__)
        seconds = time.perf_counter() - t0
        record["seconds"] = round(seconds, 6)
        record["tracker"] = {"every": self.every, "probe_seconds": round(probe_seconds, 6),
                             "overhead_seconds": round(max(seconds - probe_seconds, 0.0), 6),
                             "products": sum(r.get("matvecs") or 0 for r in record["results"].values())}
        self._keep(record)
        self.last_record = record
        if not self.quiet:
            _say(step, values, record)
        return values

    def close(self) -> None:
        """Let go of `out` (another tracker or scan may then write it). Leaving a `with` block
        does this, and so does the collector once the tracker is no longer referenced."""
        self._closed = True
        if self._held is not None and not self._held.still_named():
            self._rescue(_lost(self._held.path), None)  # after the last step: the descriptor held it
        self._let_go()

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _extrapolate(self) -> None:
        """Replace each λmax warm start (k = 1: the top eigenvector, alone or with the next one
        as the gap vector of a block) by its extrapolation from the last two converged ones
        (extrapolated_block). A key whose vectors are still the start handed out last time (that
        call failed) keeps its history: no extrapolation from an extrapolation."""
        warm = self.session.warm
        for key, latest in list((warm or {}).items()):
            if latest is self._handed.get(key):
                continue
            previous = self._previous.get(key)
            self._previous[key] = latest
            if previous is None or key[-1] != 1 or previous.shape != latest.shape:
                continue
            warm[key] = self._handed[key] = extrapolated_block(previous, latest)

    def _keep(self, record: dict[str, Any]) -> None:
        """`record` into memory and the held file; a file that took it but no longer has a path
        (removed, or its folder), or a write that failed, is rescued (_rescue)."""
        self.records.append(record)
        if self._held is None:
            return
        try:
            self._held.append(record)
        except OSError as exc:
            self._rescue(f"cannot write ({exc.strerror or exc})", record)
            return
        if not self._held.still_named():
            self._rescue(_lost(self._held.path), None)

    def _rescue(self, why: str, unwritten: dict[str, Any] | None) -> None:
        """Let go of the held file, which lost its path (or a write), and put its records, then
        `unwritten`, in a spare file named after `out` (report.io.write_spare), held from then on
        for the next records; one stderr line says where, even with quiet=True. No spare: the
        records stay in memory alone, and the line says that."""
        from ..report.io import write_spare

        held = self._held
        try:
            data = held.contents()
            data = data[:data.rfind(b"\n") + 1]  # a short write's fragment is no record
            pending = [unwritten] if unwritten is not None else []
        except OSError:  # not even readable: this run's records, from memory
            data, pending = b"", list(self.records)
        self._let_go()
        spare = write_spare(self.out, data)
        if spare is not None:
            try:
                self._take(_hold(Path(spare)))
                for record in pending:
                    self._held.append(record)
            except (OSError, ConfigError) as exc:
                self._let_go()
                why += f"; the rescue file {spare} failed too ({getattr(exc, 'strerror', None) or exc})"
                spare = None
        if spare is not None:
            n = data.count(b"\n") + len(pending)
            where = f"its records so far ({n}) are in {spare} instead, and the next ones go there"
        else:
            where = ("no file takes its records (beside it, the temporary folder, the working directory); this run's "
                     f"records ({len(self.records)}) are kept in memory alone, as tracker.records")
        sys.stderr.write(f"flatcheck track: out {held.path}: {why}; {where}\n")
        sys.stderr.flush()

    def _measure(self, step: int):
        from ..api import run

        session = self.session
        if session.model is not self.model:
            _copy_weights(self.model, session.model)  # measured on a copy in another device/dtype
        if not is_finite(session.model):
            raise ModelError(f"step {step}: the model's weights are not finite (the training run diverged)")
        with preserved(self.model, session.device):
            return run(session.config, None, session)

    def _start(self, step: int) -> None:
        """Drop this run's records of `step` and later ones (a restarted run). Another run's
        records in the same file (another name, data or settings: another fingerprint) stay."""
        self._started = True
        if self._held is None:
            return
        repair_tail(self.out)
        records = []
        for i, line in enumerate(self.out.read_text(encoding="utf-8", errors="replace").split("\n"), 1):
            try:
                records += [json.loads(line)] if line.strip() else []
            except ValueError:
                raise ConfigError(f"out {self.out}:{i}: not a JSON record; a restarted tracker rewrites the file, "
                                  "which would drop that line: mend it or give another out") from None

        def restarted(r: dict[str, Any]) -> bool:
            return isinstance(r.get("step"), int) and r["step"] >= step

        kept = [r for r in records if not (r.get("fingerprint") == self.fingerprint and restarted(r))]
        others = sorted({r["step"] for r in kept if r.get("model") == self.name and restarted(r)})
        if others:
            warnings.warn(f"out {self.out}: holds records of another run also named {self.name!r} (other data or "
                          f"settings) at steps {others[0]}–{others[-1]}; they are kept beside this run's: pass "
                          "name= to tell the runs apart")
        if len(kept) < len(records):
            _rewrite(self.out, kept)
            self._let_go()  # the rewrite made a new file: hold that one
            self._take(_hold(self.out))

    def _let_go(self) -> None:
        if self._held is not None:
            self._release()  # closes the held file; the finalizer will not run again
            self._held = None
            if _HOLDERS.get(self._held_key) is self:
                del _HOLDERS[self._held_key]

    def _take(self, held: HeldOutput) -> None:
        self._held = held
        # a descriptor is not closed by dropping the int that holds it: without this a tracker
        # deleted without close() (a notebook cell run again) would hold the file until exit
        self._release = weakref.finalize(self, held.close)
        st = os.fstat(held.fd)
        self._held_key = (st.st_dev, st.st_ino)
        _HOLDERS[self._held_key] = self


def tracker_keywords() -> list[str]:
    """The keywords Tracker(...) takes: its own and those it hands on to measure's session."""
    own = [p for p in inspect.signature(Tracker.__init__).parameters if p not in ("self", "model", "data",
                                                                                   "measure_kwargs")]
    handed = [p.name for p in inspect.signature(measure).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in own and p.name != "progress"]
    return own + handed


def _hold(path: Path) -> HeldOutput:
    """`path` held for this tracker, else a ConfigError naming what holds it."""
    try:
        return HeldOutput(path, "out")
    except ConfigError:
        # a tracker of this process dropped in a reference cycle lets go when collected
        gc.collect()
    try:
        return HeldOutput(path, "out")
    except ConfigError:
        raise ConfigError(f"out {path}: {_holder(path)}") from None


def _lost(path: Path) -> str:
    """How a held file lost its path while the tracker ran."""
    if not path.parent.is_dir():
        return f"its folder {path.parent} was removed while the tracker ran"
    if os.path.lexists(path):
        return "another file took its place while the tracker ran"
    return "removed while the tracker ran"


def _holder(path: Path) -> str:
    """Who holds `path`'s lock, and what to do about it."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    tracker = None if st is None else _HOLDERS.get((st.st_dev, st.st_ino))
    if tracker is not None:
        return (f"tracker {tracker.name!r} of this process holds this file; close() it (or make it with "
                f"`with flatcheck.Tracker(...) as tracker:`), or give another out")
    wait = "wait for it to end, or give another out"
    pid = None if st is None else _lock_pid(st)
    if pid == os.getpid():
        return f"a scan in this process holds this file and is still writing it; {wait}"
    if pid is not None:
        return f"process {pid} ({_command(pid)}) holds this file: a flatcheck scan or tracker still writing it; {wait}"
    return f"another process holds this file: a flatcheck scan or tracker still writing it; {wait}"


def _lock_pid(st: os.stat_result) -> int | None:
    """The process that took the flock on the file `st` describes, from Linux's /proc/locks
    (flock itself does not say); None where it cannot be told."""
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
                    return int(fields[4])
    except OSError:
        pass
    return None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return "command unknown"
    command = " ".join(" ".join(w.decode(errors="replace").split()) for w in words if w)  # one line
    return command if len(command) <= 80 else command[:77] + "..."


def _say(step: int, values: dict[str, float | None], record: dict[str, Any]) -> None:
    """One stderr line per tracked step: what was measured, how long it took, and with how
    many products (a training loop's own prints stay on stdout)."""
    shown = ", ".join(f"{name} {'failed' if v is None else format(v, '.5g')}" for name, v in values.items())
    cold = [r.get("details", {}).get("warm_start") for r in record.get("results", {}).values()]
    start = " (cold start)" if False in cold else ""
    error = f": {record['error']}" if record.get("status") == "error" else ""
    sys.stderr.write(f"flatcheck track step {step}: {shown}{error} · {record['seconds']:.1f} s, "
                     f"{record['tracker']['products']} products{start}\n")
    sys.stderr.flush()


def extrapolated_start(previous: torch.Tensor, latest: torch.Tensor) -> torch.Tensor:
    """v_t + (v_t − v_{t−1}) for the unit rows v_{t−1} = previous, v_t = latest (shape (1, P)),
    v_{t−1}'s sign taken to match v_t's (an eigenvector's sign is arbitrary); v_t itself when
    they overlap by less than EXTRAPOLATE_OVERLAP."""
    a = previous / torch.linalg.vector_norm(previous)
    b = latest / torch.linalg.vector_norm(latest)
    overlap = float((a * b).sum())
    if abs(overlap) < EXTRAPOLATE_OVERLAP:
        return latest
    return 2 * b - math.copysign(1.0, overlap) * a


def extrapolated_block(previous: torch.Tensor, latest: torch.Tensor) -> torch.Tensor:
    """A k = 1 warm start's rows (the top eigenvector, and the next one where the block carries
    it) each carried one step on from the last two converged blocks by extrapolated_start. The
    next eigenvector drifts as the top one does; the nearer its row starts to it, the smaller the
    residual that the gap estimate subtracts (linalg/certify.py), so the sooner r²/δ certifies."""
    return torch.cat([extrapolated_start(previous[i:i + 1], latest[i:i + 1]) for i in range(latest.shape[0])])


def _rewrite(path: Path, records: list[dict[str, Any]]) -> None:
    """The file holding just `records`, replaced in one rename (a crash leaves old or new)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        for record in records:
            write_record(fd, record, tmp)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _settings(config) -> dict[str, Any]:
    from .scan import run_settings

    return run_settings(config)


def _copy_weights(source: nn.Module, target: nn.Module) -> None:
    with torch.no_grad():
        for (_, a), (_, b) in zip(_state(source), _state(target)):
            b.copy_(a)


def _state(model: nn.Module):
    return [*model.named_parameters(), *model.named_buffers()]


def _plain(value: Any) -> Any:
    """A caller's value as JSON: tensors and numpy scalars as numbers, non-finite as null."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)
