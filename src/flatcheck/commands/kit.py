"""The CLI framework the commands are built with: the options every probe command shares
(the settings of flatcheck.settings as flags, the model flags, the output flags), how a
command is registered, and how it runs — parse → RunConfig → api.run → render → exit code —
with the CLI's conventions (error formatting, exit codes, guarded execution).

Commands import it by these public names; the app that registers them is flatcheck.cli.
Results go to stdout; progress, warnings and errors to stderr. Exit codes: 0 ok, 1 gate
failed, 2 bad input, 101 internal error (130 on Ctrl-C).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import os
import sys
import traceback
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Optional, Protocol, get_origin, runtime_checkable

import typer
from rich.console import Console

from ..errors import FlatcheckError, StdoutClosed, interrupted
from ..settings import SETTING, Settings, flag_of


def _reader_gone(console: Console) -> None:
    # rich ends the process with SystemExit(1) when stdout's reader has gone (`| head`), and 1
    # means "gate failed" here: hand it to the entry point, which ends with a broken pipe's 141
    console.quiet = True
    raise StdoutClosed


Console.on_broken_pipe = _reader_gone


def console(stderr: bool = False) -> Console:
    """A rich console for results (stdout) or messages (stderr). Off a terminal (a CI log, a
    pipe) rich would wrap tables at 80 columns: there lines are as wide as $COLUMNS says, or
    wide enough that a table's rows stay whole."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else LOG_WIDTH
    return Console(stderr=stderr, width=width)


# the width of a line written off a terminal without $COLUMNS: CI logs show long lines whole
LOG_WIDTH = 200


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


# -- registration: commands say what they are; flatcheck.cli's app registers them ----------

@dataclass(frozen=True)
class Registered:
    name: str
    help: str
    make: Callable[[], Callable]  # the command's function, made when the command is built

    @property
    def function(self) -> Callable:
        return self.make()


@dataclass(frozen=True)
class Lazy:
    """A provider of commands built on first use: `names()` lists them, `build(name)` makes
    one click command, `describe(name)` is its help line without building it (None: unknown)."""

    names: Callable[[], list[str]]
    build: Callable[[str], Any]
    describe: Callable[[str], str | None]


REGISTERED: list[Registered] = []
LAZY: list[Lazy] = []


def command(name: str, help: str) -> Callable:
    """Register a command with its own options only (scan, report, explain …)."""

    def deco(fn: Callable) -> Callable:
        REGISTERED.append(Registered(name, help, lambda: fn))
        return fn

    return deco


def probe_command(name: str, help: str, *, budget: bool = False) -> Callable:
    """Register a command whose signature gets the shared options appended.

    The decorated function receives its own options and returns (probe names, options by
    probe, render-layers flag[, execute]); everything else — config, run, output, exit codes —
    is here.
    """

    def deco(fn: Callable) -> Callable:
        # the shared options are appended when the command is built, not on importing the CLI:
        # a run of another command does not pay for this one's signature
        REGISTERED.append(Registered(name, help, lambda: with_shared(fn, budget)))
        return fn

    return deco


def command_from(fn: Callable, name: str, help: str, *, budget: bool = False) -> Any:
    """A click command for `fn` with the shared options appended, not registered (the command
    group asks a lazy provider for it by name: lazy_commands)."""
    return click_command(with_shared(fn, budget), name, help)


def click_command(fn: Callable, name: str, help: str) -> Any:
    """The click command typer makes of `fn`, as the app's group would make it."""
    one = typer.Typer(add_completion=False, rich_markup_mode=None)
    one.command(name, help=help)(fn)
    return typer.main.get_command(one)


def lazy_commands(names: Callable[[], list[str]], build: Callable[[str], Any],
                  describe: Callable[[str], str | None] = lambda name: None) -> None:
    """Register a provider of commands built on first use (Lazy)."""
    LAZY.append(Lazy(names, build, describe))


# -- the shared options ---------------------------------------------------------------------

# the model: --spec, --model, or what the checkpoint says (flatcheck.models.resolve)
MODEL_OPTIONS: list[tuple[str, Any, Any]] = [
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
    ("input_size", Annotated[Optional[str], typer.Option("--input-size", help="spec field input_size: S (= 3,S,S) "
                                                             "or C,H,W; a flat D: --set 'input_size=[D]'")],
     None),
    ("mean", Annotated[Optional[str], typer.Option("--mean", help="spec field mean, per channel: 0.5,0.5,0.5")],
     None),
    ("std", Annotated[Optional[str], typer.Option("--std", help="spec field std, per channel: 0.5,0.5,0.5")], None),
    ("spec_set", Annotated[Optional[list[str]], typer.Option("--set", help="any other spec field, FIELD=VALUE "
                           "(repeatable), e.g. --set loss=mse, --set kwargs.img_size=64")], None),
]

OUTPUT_OPTIONS: list[tuple[str, Any, Any]] = [
    ("json_out", Annotated[Optional[str], typer.Option("--json", help="write the JSON report to PATH ('-' = stdout)"),
                           WRITES], None),
    ("quiet", Annotated[bool, typer.Option("--quiet", "-q", help="no progress or warnings on stderr")], False),
    ("debug", Annotated[bool, typer.Option("--debug", help="show tracebacks")], False),
]


def setting_options(budget: bool) -> list[tuple[str, Any, Any]]:
    """The run's settings as flags (name, Annotated type, default), from their declaration;
    --budget only where the command takes it (gate runs fixed probe counts, so that runs pair,
    and invariance compares two runs)."""
    out = []
    hints = _settings_hints()
    for field in dataclasses.fields(Settings):
        how = field.metadata[SETTING]
        if how.flag is None or (field.name == "budget" and not budget):
            continue
        kind = how.cli_type if how.cli_type is not None else hints[field.name]
        default = field.default
        if isinstance(default, tuple):  # a list given as text ("a,b") or repeated flags: none given
            default = None
        elif isinstance(default, str):  # an enum's value as the user types it
            default = str(default)
        out.append((field.name, Annotated[kind, typer.Option(how.flag, help=how.help)], default))
    return out


@functools.cache
def _settings_hints() -> dict[str, Any]:
    # read once: several modules ask for the settings' flags when they are imported
    return typing.get_type_hints(Settings)


def shared_options(budget: bool = False) -> list[tuple[str, Any, Any]]:
    """Every option a probe command has beside its own: model, settings, output."""
    return MODEL_OPTIONS + setting_options(budget) + OUTPUT_OPTIONS


# the command's own flags typed on the command line (not left at their defaults), for a
# command that must tell the two apart (a probe's options: commands.probes.given_only)
TYPED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("TYPED", default=frozenset())


def with_shared(fn: Callable, budget: bool) -> Callable:
    """`fn` with the shared options appended to its signature, run by `execute`."""
    # eval_str: these modules use `from __future__ import annotations`, and Typer does not
    # evaluate the string annotations of an explicit __signature__ (the Option names and
    # help inside Annotated[...] would be lost, e.g. `-o` and `--max-probes`).
    own = [_optional_checkpoint(p) for p in inspect.signature(fn, eval_str=True).parameters.values()]
    shared = [
        inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=d, annotation=a)
        for n, a, d in shared_options(budget)
    ]
    own_names = {p.name for p in own}
    roles = {p.name: role for p in own + shared if (role := file_role(p.annotation)) is not None}

    @functools.wraps(fn)
    def wrapper(click_context: typer.Context, **kwargs):
        files = named_files(roles, kwargs, click_context)
        common = {k: kwargs.pop(k) for k in list(kwargs) if k not in own_names}
        checkpoint = kwargs.pop("checkpoint")
        # by the enum's name: typer may carry its own copy of click, with its own ParameterSource
        source = click_context.get_parameter_source
        TYPED.set(frozenset(k for k in kwargs if getattr(source(k), "name", None) not in (None, "DEFAULT")))
        execute(checkpoint, common, lambda: fn(checkpoint=checkpoint, **kwargs), files)

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


def param_flag(param: Any) -> str:
    """A click parameter as the user writes it: its first option name, or an argument's NAME."""
    return param.opts[0] if param.param_type_name == "option" else param.name.upper()


def file_role(annotation: Any) -> FileRole | None:
    if get_origin(annotation) is not Annotated:
        return None
    return next((m for m in annotation.__metadata__ if isinstance(m, FileRole)), None)


def named_files(roles: dict[str, FileRole], values: dict[str, Any], ctx: typer.Context
                ) -> list[tuple[str, str, bool]]:
    """(flag, path, writes) of the marked parameters given a path, each named by its flag."""
    labels = {p.name: param_flag(p) for p in ctx.command.params}
    # '-' is a standard stream (--json -), not a file that could be clobbered
    return [(labels.get(name, name), str(values[name]), role.writes) for name, role in roles.items()
            if values.get(name) is not None and str(values[name]) != "-"]


Checkpoint = Annotated[Optional[Path], typer.Argument(
    help="checkpoint: .safetensors, or .pt/.pth/.bin/.ckpt (read with weights_only); optional with --model or --spec "
         "and --pretrained or --random-init", show_default=False), READS]


# -- running a command --------------------------------------------------------------------

def execute(checkpoint: Path, common: dict[str, Any], build: Callable[[], tuple],
            files: list[tuple[str, str, bool]]) -> None:
    err = console(stderr=True)
    debug, quiet = common.pop("debug"), common.pop("quiet")
    json_out = common.pop("json_out")

    def body() -> int:
        from ..report.io import check_distinct_files, lost_outputs_error, rescued_outputs

        _refuse_empty_outputs(files)
        check_distinct_files(files + _data_file(common["data"]), kinds=False)  # kinds: after the found inputs
        # an output whose path fails once the run is done (its folder removed meanwhile) is
        # written elsewhere, and said after the results are shown: the run is never lost
        with rescued_outputs() as rescued:
            with warnings.catch_warnings():
                if quiet:
                    warnings.simplefilter("ignore")
                # (probes, options, layers[, execute]): execute(config, progress) replaces api.run
                # for commands that do more than one run (e.g. invariance)
                names, options, layers, *custom = build()
                check_json_target(json_out)
                report = _run(checkpoint, common, names, options, quiet, err, custom[0] if custom else None,
                              outputs=[(flag, path) for flag, path, writes in files if writes])
            _emit(report, json_out, layers)
        # a custom result may carry a verdict (gate: 1)
        code = report.exit_code if isinstance(report, CommandResult) else 0
        if rescued:
            raise lost_outputs_error(rescued, code if isinstance(report, CommandResult) else None)
        return code

    guarded(debug, body)


def _refuse_empty_outputs(files: list[tuple[str, str, bool]]) -> None:
    """An output flag given an empty path — `--summary "$GITHUB_STEP_SUMMARY"` outside GitHub
    Actions, where the variable is unset — arrives as "." (click makes a Path of ""), which
    would be refused as "a folder": say what happened instead."""
    from ..errors import ConfigError

    for flag, path, writes in files:
        if writes and path in ("", "."):
            hint = " ($GITHUB_STEP_SUMMARY is set only inside GitHub Actions)" if flag == "--summary" else ""
            raise ConfigError(f"{flag}: the path is empty (or '.'); give a file path{hint}")


def guarded(debug: bool, body: Callable[[], int | None]) -> None:
    """Run a command body with the CLI's exit-code conventions: its return value is the exit
    code (None = 0); a FlatcheckError is one `error:` line naming settings by their flags."""
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
        error_line(f"error: {exc.worded(flag_of)}")
    except KeyboardInterrupt:
        code = interrupted()
    except (BrokenPipeError, StdoutClosed):  # stdout's reader went away (`| head`): the entry point's
        raise StdoutClosed from None
    except Exception as exc:  # a bug in flatcheck, not the user's fault
        code = 101
        if debug:
            traceback.print_exc()
        error_line(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)")
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
    from .. import api
    from ..backends.ranks import is_main_process
    from ..config import RunConfig, probe_requests
    from ..models.resolve import resolve

    execute = execute or api.run
    probes = probe_requests(names, options)  # options that cannot run are refused before the model is found
    from ..data.roots import refuse_missing

    refuse_missing(common["data"], common["data_root"], common["split"])  # before the model is found and built
    model = resolve(model_request(checkpoint, common))
    # a probe's own output files (spectrum's --plot), besides the command's
    outputs = [*outputs, *(("--plot", str(r.options.plot)) for r in probes if getattr(r.options, "plot", None))]
    if outputs:
        from ..models.sources import local_module_path
        from ..report.io import check_outputs_spare

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
                       extra_meta={"weights": model.weights}, **common)
    if quiet or not is_main_process():
        return execute(config, None)
    from ..report.progress import ProgressRenderer, period_from_env

    # a rich bar per probe at a terminal, plain lines anywhere else (report/progress.py)
    with ProgressRenderer(err.file, interactive=err.is_interactive, period=period_from_env(),
                          name_of=flag_of, budget="budget" in common) as progress:
        return execute(config, progress)


def model_request(checkpoint: Path | None, common: dict[str, Any]):
    """The model flags (MODEL_OPTIONS), taken out of `common`, as a models.resolve.ModelRequest."""
    from ..models.resolve import ModelRequest

    return ModelRequest(
        checkpoint=checkpoint, spec=common.pop("spec"), model=common.pop("model"),
        pretrained=common.pop("pretrained"), random_init=common.pop("random_init"),
        num_classes=common.pop("num_classes"), input_size=common.pop("input_size"), mean=common.pop("mean"),
        std=common.pop("std"), sets=tuple(common.pop("spec_set") or ()),
    )


def check_json_target(json_out: str | None) -> None:
    """Refuse an unwritable --json PATH before the run, not after minutes of work."""
    from ..report.io import check_writable

    if json_out is not None and json_out != "-":
        check_writable(json_out, "--json")


def _emit(report, json_out: str | None, layers: bool) -> None:
    from ..backends.ranks import is_main_process
    from ..errors import ConfigError
    from ..report.io import dump_json
    from ..report.render import render

    if not is_main_process():  # under torchrun every rank holds the same result; rank 0 speaks
        return
    if json_out is not None:
        try:
            dump_json(report.to_dict(), json_out)  # a path that fails now is rescued (report.io)
        except OSError as exc:  # stdout (`--json -`) failing: the user's pipe, not a flatcheck bug
            raise ConfigError(f"--json {json_out}: cannot write ({exc.strerror or exc})") from None
    if json_out != "-":
        if isinstance(report, CommandResult):  # results of custom commands render themselves
            report.render(console())
        else:
            render(report, console(), layers=layers)


def error_line(message: str) -> None:
    """A message on stderr as one line (a CI log greps it whole)."""
    sys.stderr.write(" ".join(message.split()) + "\n")
    sys.stderr.flush()
