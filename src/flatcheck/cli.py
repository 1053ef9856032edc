"""The command line. Commands are thin: parse → RunConfig → api.run → render → exit code.

Results go to stdout; progress, warnings and errors to stderr. Exit codes: 0 ok,
1 gate failed, 2 bad input, 101 internal error (130 on Ctrl-C).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import os
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Protocol, get_origin, runtime_checkable

import typer
from typer.core import TyperGroup
from rich.console import Console
from rich.table import Table

from . import __version__
from .errors import FlatcheckError, StdoutClosed, interrupted


def _reader_gone(console: Console) -> None:
    # rich ends the process with SystemExit(1) when stdout's reader has gone (`| head`), and 1
    # means "gate failed" here: hand it to the entry point, which ends with a broken pipe's 141
    console.quiet = True
    raise StdoutClosed


Console.on_broken_pipe = _reader_gone


@dataclass(frozen=True)
class FileRole:
    """Marks a path parameter, inside its Annotated[...], as a file the command reads or writes,
    so that an output naming an input (or another output) is refused before the run."""

    writes: bool


READS, WRITES = FileRole(writes=False), FileRole(writes=True)


@runtime_checkable
class CommandResult(Protocol):
    """What a command that does more than one run returns (gate, invariance): it renders itself
    and may carry a verdict as the exit code; a plain Report is rendered by report.render."""

    exit_code: int

    def to_dict(self) -> dict: ...

    def render(self, console: Console) -> None: ...


class _Commands(TyperGroup):
    """The CLI's command group. Besides the commands registered on `app`, it serves commands
    that providers build only when first asked for (the probes' own commands, `flatcheck
    trace` …, generated from their Options by flatcheck.commands.probes), so that importing
    the CLI imports no probe and no torch. A provider registers itself with `lazy_commands`."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return names + [n for names_of, _ in _LAZY for n in names_of() if n not in names]

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        if command is None:
            for names_of, build in _LAZY:
                if name in names_of():
                    command = _BUILT.get(name) or _BUILT.setdefault(name, build(name))
                    break
        return command

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        # click cuts each command's help to ~45 characters or at its first period, mid-sentence
        # ("Run several probes in one pass, e.g."): the list shows the first paragraph whole, wrapped
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.short_help or (command.help or "").split("\n\n")[0].strip()))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


_BUILT: dict[str, Any] = {}
_LAZY: list[tuple[Callable[[], list[str]], Callable[[str], Any]]] = []


def lazy_commands(names: Callable[[], list[str]], build: Callable[[str], Any]) -> None:
    """Register a provider of commands built on first use: `names()` lists them, `build(name)`
    makes one click command."""
    _LAZY.append((names, build))

app = typer.Typer(
    cls=_Commands,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Loss-landscape geometry of trained checkpoints: Hessian trace, flatness and sensitivity probes.",
)

# -- options every probe command shares ---------------------------------------------------
_COMMON: list[tuple[str, Any, Any]] = [
    # the model: --spec, --model, or what the checkpoint says (flatcheck.models.resolve)
    ("spec", Annotated[Optional[Path], typer.Option("--spec", help="model spec YAML (see model_specs/) [default: "
                       "the checkpoint's embedded spec, STEM.yaml, spec.yaml or config.json beside it]"), READS],
     None),
    ("model", Annotated[Optional[str], typer.Option("--model", help="the model by name instead of --spec: "
                        "timm:NAME (hf-hub:timm/... too), torchvision:NAME or python:MODULE:FUNCTION")], None),
    ("pretrained", Annotated[bool, typer.Option("--pretrained", help="no CHECKPOINT: the library's own weights, "
                             "from the local cache only (never downloaded)")], False),
    ("random_init", Annotated[bool, typer.Option("--random-init", help="no CHECKPOINT: measure the model as "
                              "built, with random weights")], False),
    ("num_classes", Annotated[Optional[int], typer.Option("--num-classes", help="spec field num_classes")], None),
    ("input_size", Annotated[Optional[str], typer.Option("--input-size", help="spec field input_size: S or C,H,W")],
     None),
    ("mean", Annotated[Optional[str], typer.Option("--mean", help="spec field mean, per channel: 0.5,0.5,0.5")],
     None),
    ("std", Annotated[Optional[str], typer.Option("--std", help="spec field std, per channel: 0.5,0.5,0.5")], None),
    ("spec_set", Annotated[Optional[list[str]], typer.Option("--set", help="any other spec field, FIELD=VALUE "
                           "(repeatable), e.g. --set loss=mse, --set kwargs.img_size=64")], None),
    ("data", Annotated[str, typer.Option("--data", help="data set: digits, synthetic, cifar10, cifar100, mnist, "
                                         "fashion-mnist, svhn, npz:PATH, imagefolder:PATH")], "digits"),
    ("data_root", Annotated[Optional[Path], typer.Option("--data-root", help="folder holding torchvision data sets "
                                                         "[default: $FLATCHECK_DATA_ROOT]")], None),
    ("split", Annotated[str, typer.Option("--split", help="train or test")], "train"),
    ("samples", Annotated[Optional[int], typer.Option("--samples", help="use the first N samples, in fixed order "
                                                      "[default: 1000, or the whole split if smaller]")], None),
    ("batch_size", Annotated[int, typer.Option("--batch-size", help="samples per forward pass")], 128),
    ("device", Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N")], "auto"),
    ("dtype", Annotated[str, typer.Option("--dtype", help="float32 or float64")], "float32"),
    ("bn_mode", Annotated[str, typer.Option("--bn-mode", help="BatchNorm statistics: eval (running) or train "
                                            "(batch; running stats left untouched)")], "eval"),
    ("seed", Annotated[int, typer.Option("--seed", help="seed of every random draw: "
                                                                    "probe vectors, samples, and a --random-init "
                                                                    "model's weights")], 0),
    ("max_memory", Annotated[Optional[str], typer.Option("--max-memory", help="memory this process may hold "
                             "while a probe runs, e.g. 8G or 512M (G, M: GiB, MiB; GB, MB: 10^9, 10^6 bytes; on CUDA, device memory), what it holds already "
                             "(torch, the model, the samples) included: samples, classes and vectors are chunked to "
                             "fit, and a probe that cannot fit exits 2 [default: each probe's working set takes at "
                             "most half the free RAM, or half the free VRAM on CUDA]")],
     None),
    ("params", Annotated[Optional[str], typer.Option("--params", help="comma-separated globs of parameter names "
                                                     "to probe, e.g. 'head.*' [default: all trainable]")], None),
    ("backend", Annotated[str, typer.Option("--backend", help="product backend")], "autograd"),
    ("allow_tf32", Annotated[bool, typer.Option("--allow-tf32", help="allow TF32 matmuls on CUDA (off by default)")],
     False),
    ("compile", Annotated[bool, typer.Option("--compile", help="torch.compile the Hessian-vector product "
                                             "(--backend func; falls back to eager if it cannot)")], False),
    ("trust_packages", Annotated[Optional[list[str]], typer.Option("--trust-package", help="let a 'source: python' "
                                 "spec import this package (repeatable); a python spec is code")], None),
    ("json_out", Annotated[Optional[str], typer.Option("--json", help="write the JSON report to PATH ('-' = stdout)"),
                           WRITES], None),
    ("quiet", Annotated[bool, typer.Option("--quiet", "-q", help="no progress or warnings on stderr")], False),
    ("debug", Annotated[bool, typer.Option("--debug", help="show tracebacks")], False),
]


# --budget: the probe commands and `probe` take it; gate (fixed probe counts, so that runs pair)
# and invariance (two runs compared) do not
_BUDGET = ("budget", Annotated[Optional[float], typer.Option(
    "--budget", help="seconds for the run's probes: iterative ones stop when it is spent and report what "
                     "they reached (details.stop_reason: budget); several probes share what is left equally "
                     "[default: none]")], None)


def probe_command(name: str, help: str, *, budget: bool = False) -> Callable:
    """Register a command whose signature gets the shared options appended.

    The decorated function receives its own options and returns (probe names, options by
    probe, render-layers flag[, execute]); everything else — config, run, output, exit codes —
    is here.
    """

    def deco(fn: Callable) -> Callable:
        app.command(name, help=help)(_with_common(fn, budget))
        return fn

    return deco


def command_from(fn: Callable, name: str, help: str, *, budget: bool = False) -> Any:
    """A click command for `fn` with the shared options appended, not registered on `app`
    (the command group asks for the generated probe commands by name: `_Commands`)."""
    one = typer.Typer(add_completion=False, rich_markup_mode=None)
    one.command(name, help=help)(_with_common(fn, budget))
    return typer.main.get_command(one)


# the command's own flags typed on the command line (not left at their defaults), for a
# command that must tell the two apart (a probe's options: commands.probes.given_only)
TYPED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("TYPED", default=frozenset())


def _with_common(fn: Callable, budget: bool) -> Callable:
    # eval_str: this module uses `from __future__ import annotations`, and Typer does not
    # evaluate the string annotations of an explicit __signature__ (the Option names and
    # help inside Annotated[...] would be lost, e.g. `-o` and `--max-probes`).
    own = [_optional_checkpoint(p) for p in inspect.signature(fn, eval_str=True).parameters.values()]
    shared = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a)
        for n, a, d in _COMMON + ([_BUDGET] if budget else [])
    ]
    own_names = {p.name for p in own}
    roles = {p.name: role for p in own + shared if (role := _file_role(p.annotation)) is not None}

    @functools.wraps(fn)
    def wrapper(click_context: typer.Context, **kwargs):
        files = _named_files(roles, kwargs, click_context)
        common = {k: kwargs.pop(k) for k in list(kwargs) if k not in own_names}
        checkpoint = kwargs.pop("checkpoint")
        # by the enum's name: typer may carry its own copy of click, with its own ParameterSource
        source = click_context.get_parameter_source
        TYPED.set(frozenset(k for k in kwargs if getattr(source(k), "name", None) not in (None, "DEFAULT")))
        _execute(checkpoint, common, lambda: fn(checkpoint=checkpoint, **kwargs), files)

    # typer passes the click context to a parameter of this type: it names the flags
    context = inspect.Parameter("click_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
    wrapper.__signature__ = inspect.Signature(own + shared + [context])
    wrapper.__annotations__ = {p.name: p.annotation for p in wrapper.__signature__.parameters.values()}
    return wrapper


def _optional_checkpoint(param: inspect.Parameter) -> inspect.Parameter:
    # CHECKPOINT may be left out (--model with --pretrained/--random-init): resolve() says
    # what is missing in one line, where click would only say "missing argument". Keyword-only,
    # as typer passes them all, so that a required option may follow the defaulted argument.
    if param.name == "checkpoint" and param.default is inspect.Parameter.empty:
        param = param.replace(default=None)
    return param.replace(kind=inspect.Parameter.KEYWORD_ONLY)


def _flag(param: Any) -> str:
    """A click parameter as the user writes it: its first option name, or an argument's NAME."""
    return param.opts[0] if param.param_type_name == "option" else param.name.upper()


def _file_role(annotation: Any) -> FileRole | None:
    if get_origin(annotation) is not Annotated:
        return None
    return next((m for m in annotation.__metadata__ if isinstance(m, FileRole)), None)


def _named_files(roles: dict[str, FileRole], values: dict[str, Any], ctx: typer.Context
                 ) -> list[tuple[str, str, bool]]:
    """(flag, path, writes) of the marked parameters given a path, each named by its flag."""
    labels = {p.name: _flag(p) for p in ctx.command.params}
    # '-' is a standard stream (--json -), not a file that could be clobbered
    return [(labels.get(name, name), str(values[name]), role.writes) for name, role in roles.items()
            if values.get(name) is not None and str(values[name]) != "-"]


Checkpoint = Annotated[Optional[Path], typer.Argument(
    help="checkpoint: .safetensors, or .pt/.pth/.bin/.ckpt (read with weights_only); optional with --model or --spec "
         "and --pretrained or --random-init", show_default=False), READS]


@probe_command("probe", help="Run several probes in one pass, e.g. --probes trace,gini.", budget=True)
def probe_cmd(
    checkpoint: Checkpoint,
    probes: Annotated[str, typer.Option("--probes", help="comma-separated probe names (see list-probes); gap is "
                                         "skipped when the data has no second split")] = "trace,gini,gap",
    option: Annotated[Optional[list[str]], typer.Option("--option", "-o", help="PROBE.KEY=VALUE, repeatable, "
                                                          "e.g. -o trace.estimator=hutchpp")] = None,
    layers: Annotated[bool, typer.Option("--layers/--no-layers", help="per-layer parts: computed and shown "
                                         "(off: a probe's per-layer option, e.g. trace.parts, is off too "
                                         "unless -o sets it)")] = False,
):
    from .config import parse_option_assignments, probe_names
    from .probes._kit import layers_field
    from .probes.registry import get_probe_class

    options = parse_option_assignments(option or [])
    # the one difference from the single-probe commands: parts are computed only when shown
    for name in probe_names(probes):
        switch = layers_field(get_probe_class(name).Options)
        if switch is not None:
            options.setdefault(name, {}).setdefault(switch, layers)
    return probes, options, layers


@app.command("list-probes", help="List the probes flatcheck offers.")
def list_probes_cmd() -> None:
    from .probes.registry import get_probe_class, list_probes

    table = Table("probe", "what it measures")
    for name in list_probes():
        table.add_row(name, get_probe_class(name).summary)
    Console().print(table)


@app.command("version", help="Print the flatcheck version.")
def version_cmd() -> None:
    import torch

    print(f"flatcheck {__version__} (torch {torch.__version__})")


def _execute(checkpoint: Path, common: dict[str, Any], build: Callable[[], tuple],
             files: list[tuple[str, str, bool]]) -> None:
    err = Console(stderr=True)
    debug, quiet = common.pop("debug"), common.pop("quiet")
    json_out = common.pop("json_out")

    def body() -> int:
        from .report.io import check_distinct_files

        _refuse_empty_outputs(files)
        check_distinct_files(files + _data_file(common["data"]))
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            # (probes, options, layers[, execute]): execute(config, progress) replaces api.run
            # for commands that do more than one run (e.g. invariance)
            names, options, layers, *custom = build()
            _check_json_target(json_out)
            report = _run(checkpoint, common, names, options, quiet, err, custom[0] if custom else None,
                          outputs=[(flag, path) for flag, path, writes in files if writes])
        _emit(report, json_out, layers)
        # a custom result may carry a verdict (gate: 1)
        return report.exit_code if isinstance(report, CommandResult) else 0

    guarded(debug, body)


def _refuse_empty_outputs(files: list[tuple[str, str, bool]]) -> None:
    """An output flag given an empty path — `--summary "$GITHUB_STEP_SUMMARY"` outside GitHub
    Actions, where the variable is unset — arrives as "." (click makes a Path of ""), which
    would be refused as "a folder": say what happened instead."""
    from .errors import ConfigError

    for flag, path, writes in files:
        if writes and path in ("", "."):
            hint = " ($GITHUB_STEP_SUMMARY is set only inside GitHub Actions)" if flag == "--summary" else ""
            raise ConfigError(f"{flag}: the path is empty (or '.'); give a file path{hint}")


def guarded(debug: bool, body: Callable[[], int | None]) -> None:
    """Run a command body with the CLI's exit-code conventions, for commands that do not
    fit probe_command (scan, report): its return value is the exit code (None = 0)."""
    code = 0
    try:
        shown = warnings.formatwarning
        if not debug:  # the text only: a recorder (pytest.warns, a notebook's) still gets the warning
            warnings.formatwarning = _warning_line
        try:
            code = body() or 0
        finally:
            warnings.formatwarning = shown
    except FlatcheckError as exc:
        code = exc.exit_code
        if debug:
            traceback.print_exc()
        _error_line(f"error: {exc}")
    except KeyboardInterrupt:
        code = interrupted()
    except (BrokenPipeError, StdoutClosed):  # stdout's reader went away (`| head`): the entry point's
        raise StdoutClosed from None
    except Exception as exc:  # a bug in flatcheck, not the user's fault
        code = 101
        if debug:
            traceback.print_exc()
        _error_line(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)")
    if code:
        raise typer.Exit(code)


def _warning_line(message, category, filename, lineno, line=None) -> str:  # noqa: ARG001
    """A warning as one line a person reads beside the progress lines ("flatcheck: warning:
    …"), not Python's file:line and source line (those under --debug)."""
    text = " ".join(str(message).split())
    kind = "" if category is UserWarning else f" ({category.__name__})"
    return f"flatcheck: warning{kind}: {text}\n"


def _image_suffixes() -> tuple[str, ...]:
    """What an imagefolder reads as samples (data.builtin lists files by torchvision's list)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return tuple(IMG_EXTENSIONS)


def _data_folder(uri: str) -> Path | None:
    """The folder a `--data KIND:PATH` reads (imagefolder:PATH): an output inside it would
    add to or replace the data set's files."""
    path = os.path.expanduser(uri.partition(":")[2])
    return Path(path) if path and os.path.isdir(path) else None


def _data_file(uri: str) -> list[tuple[str, str, bool]]:
    """The file a `--data KIND:PATH` reads (npz:PATH), as an input of the run; a folder
    (imagefolder:PATH) cannot be overwritten by an output file, and a named set has no path."""
    path = uri.partition(":")[2]
    return [("--data", path, False)] if path and os.path.isfile(os.path.expanduser(path)) else []


def _run(checkpoint, common, names, options, quiet, err, execute=None, outputs=()):
    from . import api
    from .config import RunConfig, probe_requests
    from .models.resolve import resolve

    from .backends._dist import is_main_process

    execute = execute or api.run
    params = tuple(p.strip() for p in (common.pop("params") or "").split(",") if p.strip())
    probes = probe_requests(names, options)  # options that cannot run are refused before the model is found
    model = resolve(model_request(checkpoint, common))
    # a probe's own output files (spectrum's --plot), besides the command's
    outputs = [*outputs, *(("--plot", str(r.options.plot)) for r in probes if getattr(r.options, "plot", None))]
    if outputs:
        from .models.sources import local_module_path
        from .report.io import check_outputs_spare

        # the inputs found only now: the spec beside the checkpoint, a python spec's own module,
        # the data folder (check_distinct_files saw the files named on the command line)
        module = local_module_path(model.spec)
        data_folder = _data_folder(common["data"])
        check_outputs_spare(outputs, [
            *([(f"the checkpoint {model.checkpoint}", model.checkpoint)] if model.checkpoint else []),
            *([(f"the model spec {model.spec.path}", model.spec.path)] if model.spec.path else []),
            *([(f"the model's module {module}", module)] if module else []),
            *((f"the data file {path}", Path(path)) for _, path, _ in _data_file(common["data"])),
            *([(f"the data folder {data_folder}", data_folder)] if data_folder else [])],
            reads=_image_suffixes() if data_folder else ())
    config = RunConfig(checkpoint=model.checkpoint, spec=model.spec, probes=probes,
                       params=params, extra_meta={"weights": model.weights}, **common)
    if quiet or not is_main_process():
        return execute(config, None)
    from .report.progress import ProgressRenderer, period_from_env

    # a rich bar per probe at a terminal, plain lines anywhere else (report/progress.py)
    with ProgressRenderer(err.file, interactive=err.is_interactive, period=period_from_env()) as progress:
        return execute(config, progress)


def model_request(checkpoint: Path | None, common: dict[str, Any]):
    """The model flags of _COMMON, taken out of `common`, as a models.resolve.ModelRequest."""
    from .models.resolve import ModelRequest

    return ModelRequest(
        checkpoint=checkpoint, spec=common.pop("spec"), model=common.pop("model"),
        pretrained=common.pop("pretrained"), random_init=common.pop("random_init"),
        num_classes=common.pop("num_classes"), input_size=common.pop("input_size"), mean=common.pop("mean"),
        std=common.pop("std"), sets=tuple(common.pop("spec_set") or ()),
    )


def _check_json_target(json_out: str | None) -> None:
    """Refuse an unwritable --json PATH before the run, not after minutes of work."""
    from .report.io import check_writable

    if json_out is not None and json_out != "-":
        check_writable(json_out, "--json")


def _emit(report, json_out: str | None, layers: bool) -> None:
    from .errors import ConfigError
    from .report.io import dump_json
    from .report.render import render

    from .backends._dist import is_main_process

    if not is_main_process():  # under torchrun every rank holds the same result; rank 0 speaks
        return
    if json_out is not None:
        try:
            dump_json(report.to_dict(), json_out)
        except OSError as exc:  # permissions, full disk …: the user's path, not a flatcheck bug
            raise ConfigError(f"--json {json_out}: cannot write ({exc.strerror or exc})") from None
    if json_out != "-":
        if isinstance(report, CommandResult):  # results of custom commands render themselves
            report.render(Console())
        else:
            render(report, Console(), layers=layers)


def _error_line(message: str) -> None:
    sys.stderr.write(" ".join(message.split()) + "\n")
    sys.stderr.flush()


def _load_commands() -> None:
    """Each module of flatcheck.commands registers its own commands on `app`."""
    import importlib
    import pkgutil

    from . import commands

    for info in pkgutil.iter_modules(commands.__path__):
        importlib.import_module(f"{commands.__name__}.{info.name}")


_load_commands()


# typer ≥ 0.2x carries its own copy of click: its exception classes are those of the module
# that typer's public BadParameter comes from, whichever click that is
_click_errors = importlib.import_module(typer.BadParameter.__module__)


def main() -> int:
    """Run the command; returns its exit code. click's usage errors (a bad value, a missing or
    unknown option or command) become the CLI's one `error:` line, exit 2."""
    try:
        code = app(standalone_mode=False)
    except getattr(_click_errors, "NoArgsIsHelpError", ()) as exc:  # bare `flatcheck`: the help
        exc.show()
        return exc.exit_code
    except _click_errors.UsageError as exc:
        _error_line(_usage_message(exc))
        return exc.exit_code
    except _click_errors.ClickException as exc:
        _error_line(f"error: {exc.format_message()}")
        return exc.exit_code
    except typer.Abort:  # click's end of input at a prompt (flatcheck asks none): a user stopping it
        return interrupted()
    # non-standalone click returns typer.Exit's code, or else the command's return value
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def _usage_message(exc: Exception) -> str:
    """click's Usage/Try/Error lines as one: the flag at fault, what was wrong, where help is."""
    ctx = getattr(exc, "ctx", None)
    where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
    param = getattr(exc, "param", None)
    if isinstance(exc, _click_errors.MissingParameter) or param is None or not exc.message:
        what = exc.format_message()
    else:
        what = f"{_flag(param)}: {exc.message}"
    what = what.rstrip(".")
    return f"error: {what[:1].lower()}{what[1:]}{where}"
