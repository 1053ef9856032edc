"""The fixed cost of a flatcheck run, as ratios to `python -c "import torch"` (the floor of
any run that computes): a two-probe trace on the demo CNN, and the commands that run nothing
(--help, --version, list-probes, explain), which import no torch at all.

The rows take turns (run 1 of every row, then run 2 …) so that a change in the machine's load
falls on all of them alike, and each row reports the median and range of its runs. Beside the
wall time, the CPU time (user + system) of the process: on a shared, loaded machine it is what
the wall time would be on an idle one (OMP_NUM_THREADS=1: these runs use one core), and it
swings far less with the load.

Every row reads compiled bytecode, as an installed package does (pip compiles a wheel's modules,
and Python caches a source tree's on first import): with PYTHONDONTWRITEBYTECODE set, as in
some development shells, flatcheck's own modules would be compiled from source on every run
while torch's are read compiled. The runs keep their bytecode in a private folder
(PYTHONPYCACHEPREFIX), filled by one untimed run of each row, so that the source tree gets no
__pycache__; one more row times the demo trace compiling flatcheck from source, to show what
that costs.

    python benchmarks/bench_fixed_cost.py [--repeat 5] [--label after] [--save] [--src DIR]
                                          [--before-src DIR --before-label TEXT] [--rows TEXT ...]

flatcheck's entry point turns the collector off while the CLI, the command and torch are
imported, and freezes what was imported before the interpreter's shutdown (flatcheck.entry);
the row 'import torch, collector off' times `import torch` treated the same way, to tell the
share of a ratio that this accounts for from the share that is the run's own work.

--src DIR runs the rows on another copy of the package's src/ than the working tree's (e.g.
`git archive HEAD src | tar -x -C DIR`, then DIR/src: the committed state, without work in
progress). --before-src DIR adds the trace rows run on a second copy, interleaved with the others.

--beyond N adds a second table: the demo trace's CPU time beyond importing torch, in a process
that imports torch first (timed) and then runs the command, N interleaved runs per source and
bytecode case. Process start, torch's import and the interpreter's exit, and the page cache they
read through, swing by tenths of a second on a shared machine; this difference does not, so a
change of a few hundredths shows here when the process rows cannot resolve it.

--save appends the tables to benchmarks/results/fixed_cost.md under the label, the commit and
the load average.
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "fixed_cost.md"
PY = [sys.executable]
# the console script when it is installed beside the interpreter, as a user runs it
_SCRIPT = Path(sys.executable).with_name("flatcheck")
FLATCHECK = [str(_SCRIPT)] if _SCRIPT.is_file() else PY + ["-m", "flatcheck"]
DEMO = ["demo/digits_cnn.safetensors", "--spec", "model_specs/demo_digits.yaml", "--data", "digits",
        "--probes-max", "2"]
FLOOR = "import torch"

# (row, command, what it shows)
ROWS: list[tuple[str, list[str], str]] = [
    ("python -c pass", PY + ["-c", "pass"], "the interpreter alone"),
    (FLOOR, PY + ["-c", "import torch"], "the floor of any run"),
    ("import torch, collector off", PY + ["-c", "import gc; gc.disable(); import torch; gc.freeze()"],
     "the floor with the collector as flatcheck's entry point sets it: off while importing, torch frozen at exit"),
    ("import flatcheck.cli", PY + ["-c", "import flatcheck.cli"], "typer, rich and the CLI, no torch"),
    ("flatcheck --help", FLATCHECK + ["--help"], "no torch: the probes' help lines from their catalogue"),
    ("flatcheck --version", FLATCHECK + ["--version"], "no torch: torch's version from its metadata"),
    ("flatcheck list-probes", FLATCHECK + ["list-probes"], "no torch"),
    ("flatcheck explain trace", FLATCHECK + ["explain", "trace"], "no torch"),
    ("flatcheck trace --help", FLATCHECK + ["trace", "--help"], "building the command (imports torch)"),
    ("trace --no-layers (2 probes)", FLATCHECK + ["trace", *DEMO, "--no-layers", "-q"],
     "the demo trace: torch, the CLI, the trace probe, the model, 1,000 digits, 2 products"),
    ("trace --no-layers (2 probes), no bytecode", FLATCHECK + ["trace", *DEMO, "--no-layers", "-q"],
     "the same, flatcheck's modules compiled from source on every run (PYTHONDONTWRITEBYTECODE)"),
]
# the rows that run without compiled bytecode of their own (see the module's docstring)
NO_BYTECODE = "no bytecode"


def run_once(cmd: list[str], src: str | None = None, bytecode: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `cmd` (with package source `src` first on the
    path), reading and writing compiled bytecode under the folder `bytecode` (None: none written)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if src is not None:
        env["PYTHONPATH"] = src
    if bytecode is None:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = bytecode
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return seconds, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def table(times: dict[str, list[tuple[float, float]]], label: str, repeat: int) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [f"## {label} · commit {commit()} · {datetime.datetime.now().isoformat(timespec='minutes')}", "",
             f"- {repeat} interleaved runs per row; load average at the end {load} "
             f"({os.cpu_count()} logical CPUs, shared with other work); "
             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}; compiled bytecode read by every row "
             f"but the '{NO_BYTECODE}' one",
             "", "| row | median wall (s) | wall range (s) | median CPU (s) | × import torch (wall) | "
             "× import torch (CPU) | what it shows |",
             "|---|---:|---|---:|---:|---:|---|"]
    floor = times[FLOOR]
    for name, _, what in ROWS:
        wall, cpu = [t[0] for t in times[name]], [t[1] for t in times[name]]
        wall_ratio = statistics.median(t[0] / f[0] for t, f in zip(times[name], floor))
        cpu_ratio = statistics.median(t[1] / f[1] for t, f in zip(times[name], floor))
        lines.append(f"| {name} | {statistics.median(wall):.2f} | {min(wall):.2f}–{max(wall):.2f} | "
                     f"{statistics.median(cpu):.2f} | {wall_ratio:.2f} | {cpu_ratio:.2f} | {what} |")
    return "\n".join(lines) + "\n"


# the demo trace after a timed import of torch: "CPU seconds of the import, of the rest" on stderr
BEYOND = ("import sys, time\n"
          "t0 = time.process_time()\nimport torch\nt1 = time.process_time()\n"
          f"sys.argv = ['flatcheck', 'trace', *{DEMO + ['--no-layers', '-q']!r}]\n"
          "from flatcheck.entry import main\n"
          "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
          "sys.stderr.write(f'beyond torch: {t1 - t0} {time.process_time() - t1}\\n')\n")


def beyond_torch(repeat: int, sources: dict[str, str | None], cache: str) -> str:
    """The table of --beyond: per source (label: src/ copy) and bytecode case, the median CPU
    seconds of torch's import and of the rest of the demo trace, and their median ratio."""
    cases = [(label, src, bytecode) for label, src in sources.items() for bytecode in (True, False)]
    runs: dict[tuple, list[tuple[float, float]]] = {case: [] for case in cases}
    for turn in range(repeat + 1):  # turn 0 untimed: fills the bytecode folder
        for label, src, bytecode in cases:
            env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
            env.pop("PYTHONDONTWRITEBYTECODE" if bytecode else "PYTHONPYCACHEPREFIX", None)
            env.update({"PYTHONPYCACHEPREFIX": cache} if bytecode else {"PYTHONDONTWRITEBYTECODE": "1"})
            if src is not None:
                env["PYTHONPATH"] = src
            proc = subprocess.run(PY + ["-c", BEYOND], cwd=ROOT, env=env, capture_output=True, text=True)
            said = [line.split()[2:] for line in proc.stderr.splitlines() if line.startswith("beyond torch:")]
            if proc.returncode != 0 or not said:
                raise SystemExit(f"the demo trace failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
            if turn:
                runs[(label, src, bytecode)].append((float(said[0][0]), float(said[0][1])))
    lines = ["", f"CPU time beyond `import torch` in one process ({repeat} interleaved runs each): the demo trace's "
             "own cost, without process start and exit", "",
             "| source | bytecode | median import torch (s) | median beyond (s) | beyond range (s) | "
             "beyond ÷ import torch |", "|---|---|---:|---:|---|---:|"]
    for case in cases:
        torch_s, rest = [r[0] for r in runs[case]], [r[1] for r in runs[case]]
        ratio = statistics.median(r[1] / r[0] for r in runs[case])
        lines.append(f"| {case[0]} | {'compiled' if case[2] else 'from source'} | {statistics.median(torch_s):.2f} | "
                     f"{statistics.median(rest):.3f} | {min(rest):.3f}–{max(rest):.3f} | {ratio:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--label", default="current")
    parser.add_argument("--save", action="store_true")
    parser.add_argument("--src", help="the copy of the package's src/ the rows run (default: the working tree's)")
    parser.add_argument("--before-src", help="a copy of the package's src/ to time the trace rows on as well")
    parser.add_argument("--before-label", default="before")
    parser.add_argument("--rows", action="append", metavar="TEXT",
                        help="time only the row named TEXT, or else the rows whose name holds TEXT (repeatable), "
                             "beside the floor: more runs of a few rows in the same time")
    parser.add_argument("--beyond", type=int, default=0, metavar="N",
                        help="N runs of the demo trace's CPU time beyond importing torch, in-process (see above)")
    args = parser.parse_args()
    if args.rows:
        names = {name for name, _, _ in ROWS}
        ROWS[:] = [row for row in ROWS if row[0] == FLOOR or any(
            row[0] == text if text in names else text in row[0] for text in args.rows)]
    if args.before_src:
        traces = [(name, cmd, what) for name, cmd, what in ROWS if name.startswith("trace")]
        ROWS.extend((f"{name} — {args.before_label}", cmd, f"{what}; source {args.before_src}")
                    for name, cmd, what in traces)
    sources = {name: args.before_src if name.endswith(f" — {args.before_label}") else args.src for name, _, _ in ROWS}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in ROWS}
    with tempfile.TemporaryDirectory(prefix="flatcheck-bench-bytecode-") as cache:
        caches = {name: None if NO_BYTECODE in name else cache for name, _, _ in ROWS}
        for name, cmd, _ in ROWS:  # untimed: fills the bytecode folder, and the page cache
            run_once(cmd, sources[name], caches[name])
        for _ in range(args.repeat):
            for name, cmd, _ in ROWS:
                times[name].append(run_once(cmd, sources[name], caches[name]))
        text = table(times, args.label, args.repeat)
        if args.beyond:
            copies = {args.src or "working tree": args.src}
            if args.before_src:
                copies[f"{args.before_label} ({args.before_src})"] = args.before_src
            text += beyond_torch(args.beyond, copies, cache)
    print(text)
    if args.save:
        header = "" if RESULTS.exists() else (
            "# Fixed cost of a run (benchmarks/bench_fixed_cost.py)\n\n"
            "Process wall and CPU time, medians of interleaved runs on a shared 2-core machine: compare rows of "
            "one table, not across tables taken under a different load; the CPU time is what the wall time "
            "would be on an idle core.\n\n")
        with RESULTS.open("a", encoding="utf-8") as f:
            f.write(header + text + "\n")


if __name__ == "__main__":
    main()
