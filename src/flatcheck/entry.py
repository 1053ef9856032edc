"""The `flatcheck` command's entry point (console script and `python -m flatcheck`).

Ctrl-C must end the command the same way at any moment: "interrupted" on stderr, exit 130,
no traceback. Most of the first seconds go to importing typer, rich and torch, so this
module imports nothing heavy and catches the interrupt around the import of the CLI as well
as around the command. Only the interpreter's own start-up and the console script's
`import re`, before any of flatcheck runs (about 40 ms), are out of its reach.
"""

from __future__ import annotations

import gc
import os
import signal
import sys

from .errors import EXIT_INTERRUPTED, StdoutClosed, interrupted

EXIT_BROKEN_PIPE = 141

# True from main()'s start until the command is built (imports_done): the collector is off
_starting = False


def main() -> None:
    global _starting
    signal.signal(signal.SIGINT, _on_interrupt)
    # Importing makes little cyclic garbage, but each of the collector's automatic passes during
    # it traverses every object imported so far, and importing torch triggers hundreds of them.
    # Off until the command is built (imports_done); the few cycles made meanwhile stay.
    _starting = gc.isenabled()
    gc.disable()
    # nothing has computed in this process yet: a scan's forked children may use threads
    from .workflows.child_process import mark_fresh_process

    mark_fresh_process()
    try:
        missing = _missing_checkpoint(sys.argv) or _missing_data_root(sys.argv) or _missing_weights(sys.argv)
        if missing is not None:  # before the seconds of importing torch that loading it would cost
            sys.stderr.write(f"error: {missing}\n")
            sys.exit(2)
        _say_what_loads()
        from .cli import WHEN_BUILT, main as cli_main

        WHEN_BUILT.append(imports_done)

        code: object = cli_main()
        sys.stdout.flush()  # here, where a closed pipe can still be told apart from a failure
    except (BrokenPipeError, StdoutClosed):
        code = _reader_gone()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except ImportError as exc:
        if (exc.name or "").startswith("flatcheck"):
            raise
        code = _library_not_loaded(exc)
    except SystemExit as exc:  # a sys.exit() anywhere in a command
        code = exc.code
    except BaseException:  # what main() does not handle goes on as it came, the collector as it was
        imports_done()
        raise
    # on the way out: a second Ctrl-C must not turn the message or the interpreter's
    # shutdown into a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code == EXIT_INTERRUPTED:
        interrupted()  # says it only if the command has not
    imports_done()
    # the interpreter's shutdown makes one more full pass over every object left, torch's
    # hundreds of thousands with them; frozen ones are skipped. atexit still runs, and objects
    # are still freed (and their files flushed) as the modules are cleared.
    gc.freeze()
    sys.exit(code)


def imports_done() -> None:
    """The collector back on once the command is built, with what was imported so far (the
    CLI, the command's modules, torch) frozen out of its passes: it is never garbage, and
    every later pass would traverse it again. Only when main() turned the collector off: a
    CLI runner in a test process keeps its own."""
    global _starting
    if _starting:
        _starting = False
        gc.freeze()
        gc.enable()


def _library_not_loaded(exc: ImportError) -> int:
    """A library (torch's shared objects, most often) that cannot be loaded here: one line, exit
    2, and what an address-space limit leaves, the usual reason a present torch fails to map."""
    text = " ".join(str(exc).split())
    name = exc.name if exc.name and not exc.name.startswith("_") else "a library flatcheck needs"
    line = f"error: cannot load {name} ({text})"
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm", encoding="ascii") as fh:
            mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError, IndexError):
        soft = None
    if soft is not None and soft != resource.RLIM_INFINITY:
        left = max(0, soft - mapped)
        line += (f"; ulimit -v allows {soft / 2**30:.2f} GiB of address space and leaves this process "
                 f"{left / 2**30:.2f} GiB, less than importing torch maps (its libraries alone take several "
                 "GiB of address space, not of memory): raise ulimit -v")
    sys.stderr.write(line + "\n")
    return 2


def _reader_gone() -> int:
    """stdout's reader closed the pipe (`flatcheck explain trace | head -1`): not a failure of
    the command, so no message; the exit status a shell gives a process SIGPIPE ended (128 +
    13). stdout goes to /dev/null so that the interpreter's last flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _say_what_loads() -> None:
    """The first line on stderr, within a second of the start: importing torch and building
    the command take seconds before the run's own progress can say anything."""
    from .report.starting import starting_line

    line = starting_line(sys.argv)
    if line is not None:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _missing_checkpoint(argv: list[str]) -> str | None:
    """The checkpoint-not-found message (models/checkpoint.py's own words) when a command that
    takes a checkpoint names as its first argument one that is not there, or a folder; None
    otherwise, and the command's own checks decide."""
    from .report.starting import run_commands

    # scan takes its models by name (--timm, --weights-dir): a positional there is typer's to refuse
    if len(argv) < 3 or argv[1] not in run_commands() - {"scan"}:
        return None
    first = argv[2]
    if first.startswith("-"):
        return None
    if os.path.isdir(first):
        return f"checkpoint {first} is a folder, not a file; give the checkpoint file inside it"
    return None if os.path.isfile(first) else f"checkpoint not found: {first}"


def _missing_data_root(argv: list[str]) -> str | None:
    """A named data set that reads under a data root, given none (data.roots), for a command
    that loads a model; None otherwise."""
    from .report.starting import run_commands

    if len(argv) < 2 or argv[1] not in run_commands():
        return None
    from .data.roots import argv_data_problem

    return argv_data_problem(argv[2:])


def _missing_weights(argv: list[str]) -> str | None:
    """models.resolve's no-weights line for a probe's command given --model or --spec but no
    CHECKPOINT, --pretrained or --random-init; None otherwise, and the command's own checks
    decide. Said only when every argument is one of the command's flags or a value one of them
    takes, so that nothing read here as an option's value is in fact the CHECKPOINT; anything
    else (an unknown flag, `--`, --help) leaves it to the parser."""
    if len(argv) < 3 or not argv[2].startswith("-"):
        return None  # the first argument is the CHECKPOINT: the common case, told at no cost
    if not {"--model", "--spec"} & {a.partition("=")[0] for a in argv[2:]}:
        return None
    from .probes.catalogue import current

    probes = current()
    if argv[1] not in probes:
        return None
    switches, valued = _flags(probes[argv[1]]["options"])
    given: dict[str, str | None] = {}
    args = iter(argv[2:])
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in valued and (eq or (value := next(args, None)) is not None):
            given[name] = value
        elif name in switches and not eq:
            given[name] = None
        else:  # a positional (the CHECKPOINT), or what only the parser can read
            return None
    # what resolve says before the weights (its order kept): both or neither of --spec and
    # --model, a --spec file not there, a --model that is no reference; and a run with weights
    model, spec = given.get("--model"), given.get("--spec")
    if (model is None) == (spec is None) or {"--pretrained", "--random-init"} & set(given):
        return None
    if spec is not None and not os.path.isfile(spec):
        return None
    if model is not None and model.partition(":")[0] not in ("timm", "torchvision", "python"):
        return None
    from .models.discover import NO_WEIGHTS

    return NO_WEIGHTS


def _flags(options: list[dict]) -> tuple[set[str], set[str]]:
    """(switches, flags that take a value) of a probe's command: the options every command
    shares (commands.kit) and the probe's own (its catalogue entry)."""
    import typing

    from .commands.kit import shared_options

    switches, valued = set(), set()
    for _name, annotation, default in shared_options(budget=True):
        option = next(m for m in annotation.__metadata__ if hasattr(m, "param_decls"))
        names = [option.default, *option.param_decls]
        (switches if typing.get_args(annotation)[0] is bool else valued).update(names)
    for option in options:
        names = [n for flag in option["flags"] or () for n in flag.split("/")]  # None: set by the command
        (switches if isinstance(option["default"], bool) else valued).update(names)
    return switches, valued


def _on_interrupt(signum: int, frame) -> None:
    if _importing(frame):
        # A KeyboardInterrupt raised inside an import can be swallowed by the C code that asked
        # for the module (torch clears any error while it imports numpy), and the half-imported
        # module then fails later as an "internal error". Stopping at once is as safe as a
        # kill -9, which every writer here survives (atomic files, fsynced JSONL lines,
        # flocks that die with the process).
        interrupted()
        os._exit(EXIT_INTERRUPTED)
    raise KeyboardInterrupt


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
