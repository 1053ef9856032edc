"""The command line, and every (model, task, tool) row run in its own process."""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import multiprocessing as mp
import os
import pkgutil
import platform
import shlex
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

import peers
from peers import tool_curvlinops, tool_eigenthings, tool_flatcheck, tool_pyhessian
from peers.measure import sync
from peers.problem import ROOT, build_setup
from peers.report import markdown, print_tables, save
from peers.rows import Row, add_ratios, median_row, one_line
from peers.tasks import PEERS, ModelCfg, Task, plan

RESULTS = ROOT / "benchmarks" / "results"
SKIPPED_BACKENDS = ("distributed",)
# a peer's adapter names it in the rows (TITLE), in the import that says it is installed (MODULE)
# and in the versions of the report's header (DIST)
ADAPTERS = {"pyhessian": tool_pyhessian, "curvlinops": tool_curvlinops, "eigenthings": tool_eigenthings}
PEER_TITLES = {peer: ADAPTERS[peer].TITLE for peer in PEERS}
PEER_MODULES = {peer: ADAPTERS[peer].MODULE for peer in PEERS}
PEER_DISTS = {peer: ADAPTERS[peer].DIST for peer in PEERS}
TOOLS = {"flatcheck": tool_flatcheck.run, **{peer: ADAPTERS[peer].run for peer in PEERS}}


def run_row(model: ModelCfg, task: Task, tool: str, device: str, hints: dict) -> dict:
    """Build the problem, warm up, run one (tool, task) and return the Row as a dict."""
    warnings.filterwarnings("ignore")
    row = Row(model.key, task.title(), task.kind, display_name(tool))
    default_dtype = torch.get_default_dtype()
    try:
        if task.data.dtype == "float64":
            # PyHessian and the eigenthings draw random vectors in the default dtype
            torch.set_default_dtype(torch.float64)
        setup = build_setup(model, task.data, device)
        with torch.no_grad():  # lazy initialisation (oneDNN, cuDNN) outside every timing
            setup.model(setup.batches[0][0][:2])
        sync(setup.device)
        fn = TOOLS[tool.split(":")[0]]
        fn(row, setup, task, tool, hints)
    except Exception as exc:  # noqa: BLE001 — a failure is a row, not a crash
        row.error = one_line(exc)
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()
    finally:
        torch.set_default_dtype(default_dtype)  # rows may run in the caller's process (tests)
    return row.__dict__


def display_name(tool: str) -> str:
    if tool.startswith("flatcheck:"):
        return f"flatcheck[{tool.split(':', 1)[1]}]"
    if tool == "eigenthings:lanczos":
        return "hessian-eigenthings (Lanczos)"
    return PEER_TITLES.get(tool, tool)


def discover_backends() -> tuple[list[str], dict[str, str]]:
    """Import every module of flatcheck.backends (each registers itself) and list the backends.

    A module that fails to import is reported, not fatal.
    """
    import flatcheck.backends as fb
    from flatcheck.backends import list_backends

    broken = {}
    for info in pkgutil.iter_modules(fb.__path__):
        if info.name in ("base", "layout") or info.name in SKIPPED_BACKENDS:
            continue
        try:
            importlib.import_module(f"flatcheck.backends.{info.name}")
        except Exception as exc:  # noqa: BLE001
            broken[info.name] = one_line(exc)
    names = [b for b in list_backends() if b not in SKIPPED_BACKENDS]
    return names, {k: v for k, v in broken.items() if k not in names}


def peer_available(peer: str) -> str | None:
    """None when importable, else the reason."""
    try:
        importlib.import_module(PEER_MODULES[peer])
        return None
    except Exception as exc:  # noqa: BLE001
        return one_line(exc)


def tools_for(task: Task, backends: list[str], peers: list[str]) -> list[str]:
    tools = [f"flatcheck:{b}" for b in backends]
    if task.kind == "trace" and "autograd" in backends:
        # `flatcheck trace` with its per-layer table: parts need Hv, so HVPs (the plain rows
        # are `--no-layers`, the total alone, which takes vᵀHv by forward tangents)
        tools.insert(backends.index("autograd") + 1, "flatcheck:autograd+parts")
    if task.kind == "hvpgrad" and task.opts.get("compile") and "func" in backends:
        tools.append("flatcheck:func+compile")
    if task.kind in ("hvpgrad", "block", "ggn"):
        return tools
    for peer in peers:
        if peer not in task.peers:
            continue
        if peer == "eigenthings" and task.kind == "eig":
            tools += ["eigenthings", "eigenthings:lanczos"]
        else:
            tools.append(peer)
    if task.kind == "eig" and "eigenthings" in peers and "eigenthings:lanczos" in task.peers:
        tools.append("eigenthings:lanczos")  # Lanczos only (its power iteration is slow here)
    return tools


def _child(conn, model, task, tool, device, hints, threads):
    if threads:
        torch.set_num_threads(threads)
    try:
        conn.send(run_row(model, task, tool, device, hints))
    finally:
        conn.close()


class Runner:
    """Runs rows in fresh processes forked from a server with torch imported (or inline)."""

    def __init__(self, inline: bool, timeout: float, threads: int | None, preload: list[str] = ()):
        self.inline, self.timeout, self.threads = inline, timeout, threads
        if not inline:
            self.ctx = mp.get_context("forkserver")
            # imported once by the server (an ImportError there is ignored), not once per row
            self.ctx.set_forkserver_preload(["torch", "flatcheck.api", "flatcheck.linalg", *preload])

    def __call__(self, model: ModelCfg, task: Task, tool: str, device: str, hints: dict) -> Row:
        if self.inline:
            return Row(**run_row(model, task, tool, device, hints))
        parent, child = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_child, args=(child, model, task, tool, device, hints, self.threads))
        t0 = time.perf_counter()
        proc.start()
        child.close()
        result, error = None, None
        try:
            if parent.poll(self.timeout):
                result = parent.recv()
            else:
                error = f"timed out after {self.timeout:.0f} s (--row-timeout)"
        except EOFError:
            pass
        if proc.is_alive():
            proc.kill()
        proc.join()
        if result is not None:
            return Row(**result)
        if error is None:
            code = proc.exitcode
            error = f"process died (exit code {code}{'; out of memory?' if code in (-9, 137) else ''})"
        return Row(model.key, task.title(), task.kind, display_name(tool),
                   seconds=time.perf_counter() - t0, error=error)


def run_all(args, log: Callable[[str], None] = print,
            models: list[ModelCfg] | None = None,
            on_task: Callable[[list[ModelCfg], list[Row], dict], None] | None = None
            ) -> tuple[list[ModelCfg], list[Row], dict]:
    """Every (model, task, tool) row; `models` replaces the plan from --models/--full (tests).
    `on_task` sees the rows so far after every task: a run stopped from outside (a lease that
    ends, a timeout) still leaves the tasks it finished saved."""
    models = plan(args.models, args.full) if models is None else models
    backends, broken = discover_backends()
    if args.backends:
        backends = [b for b in backends if b in args.backends]
    peers = [p for p in args.peers if p in PEERS]
    missing = {p: peer_available(p) for p in peers}
    missing = {p: why for p, why in missing.items() if why}
    if args.tasks:
        for m in models:
            object.__setattr__(m, "tasks", tuple(t for t in m.tasks if t.kind in args.tasks))
    preload = [PEER_MODULES[p] for p in peers if p not in missing] + (["timm"] if "vit" in args.models else [])
    runner = Runner(args.inline, args.row_timeout, args.threads, preload)
    rows: list[Row] = []
    for m in models:
        for task in m.tasks:
            hints: dict[str, Any] = {}
            for name, why in broken.items():
                rows.append(Row(m.key, task.title(), task.kind, f"flatcheck[{name}]", error=f"backend did not import: {why}"))
            tools = []
            for tool in tools_for(task, backends, peers):
                peer = tool.split(":")[0]
                if peer in missing:
                    rows.append(Row(m.key, task.title(), task.kind, display_name(tool),
                                    error=f"not installed ({missing[peer]}); pip install '.[bench]'"))
                else:
                    tools.append(tool)
            # the repetitions take turns tool by tool, so a slow spell of the machine falls on
            # every tool alike instead of on whichever ran then
            runs: dict[str, list[Row]] = {tool: [] for tool in tools}
            for rep in range(args.repeat):
                for tool in tools:
                    row = runner(m, task, tool, args.device, hints)
                    runs[tool].append(row)
                    if row.is_flatcheck and row.error is None:
                        # peers get what flatcheck found where the comparison needs it (steps, boundaries)
                        hints.setdefault("steps", row.extra.get("steps"))
                        if "lo" in row.extra:
                            hints.setdefault("bounds", (row.extra["lo"], row.extra["hi"]))
                        hints = {k: v for k, v in hints.items() if v is not None}
                    log(f"  {m.key:<9} {task.title():<58} {row.tool:<24} "
                        + (f"{row.seconds:8.2f} s" if row.seconds is not None else " " * 10)
                        + (f"  (run {rep + 1}/{args.repeat})" if args.repeat > 1 else "")
                        + (f"  ERROR {row.error}" if row.error else ""))
            rows += [median_row(runs[tool]) for tool in tools]
            if on_task is not None:
                add_ratios(rows)
                on_task(models, rows, machine_info(args.device, args.threads))
    add_ratios(rows)
    machine = machine_info(args.device, args.threads)
    return models, rows, machine


def machine_info(device: str, threads: int | None) -> dict:
    from flatcheck.api import resolve_device

    dev = resolve_device(device)
    name = str(dev)
    if dev.type == "cuda":
        name += f" ({torch.cuda.get_device_name(dev)})"
    else:
        name += f" ({platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs)"
    versions = {}
    for dist in ("flatcheck", "torch", "timm", *PEER_DISTS.values()):
        try:
            from importlib.metadata import version

            versions[dist] = version(dist)
        except Exception:  # noqa: BLE001
            versions[dist] = "not installed"
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        load = "n/a"
    return {"device": name, "threads": threads or torch.get_num_threads(), "python": platform.python_version(),
            "load": load,
            "versions": versions, "date": _dt.datetime.now().isoformat(timespec="seconds")}


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {text!r}")
    return int(text)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=peers.__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    csv = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    ap.add_argument("--models", type=csv, default=["demo", "resnet18", "vit"], help="demo,resnet18,vit")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    ap.add_argument("--full", action="store_true", help="GPU-sized problems, and every peer on every task")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/latest.md (and .json)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    ap.add_argument("--backends", type=csv, default=None, help="flatcheck backends (default: all but distributed)")
    ap.add_argument("--peers", type=csv, default=list(PEERS), help="pyhessian,curvlinops,eigenthings (or none)")
    ap.add_argument("--tasks", type=csv, default=None, help="trace,eig,slq,hvpgrad,block,ggn (default: all)")
    ap.add_argument("--repeat", type=positive_int, default=1,
                    help="run every row N times, tools taking turns, and report each tool's median time "
                         "(default 1)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--row-timeout", type=float, default=600.0, help="seconds before a row is stopped")
    ap.add_argument("--inline", action="store_true", help="run rows in this process (no per-row memory isolation)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    command = " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix() if argv is None else "bench_peers.py",
                                                *(sys.argv[1:] if argv is None else argv)])
    t0 = time.perf_counter()
    print(f"bench_peers: {', '.join(args.models)} on {args.device}{' (full)' if args.full else ''}", flush=True)
    def save_partial(models, rows, machine):
        save(markdown(models, rows, machine, command + "  (partial: the run goes on)", args.repeat),
             args.results_dir, rows)

    models, rows, machine = run_all(args, log=lambda s: print(s, flush=True),
                                    on_task=save_partial if args.save else None)
    print_tables(models, rows, machine)
    print(f"total {time.perf_counter() - t0:.0f} s")
    if args.save:
        path = save(markdown(models, rows, machine, command, args.repeat), args.results_dir, rows)
        print(f"saved {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0

