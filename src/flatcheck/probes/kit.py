"""What several probes share: option fields that carry their CLI flag and help, the progress
reporter, the budget's stop test, and the exact mean of per-sample statistics over the sample set.

An option's default, flag and help live once, in its probe's Options dataclass (`option(...)`);
the CLI command of the probe is generated from those fields (flatcheck.commands.probes), and
`-o PROBE.KEY=VALUE` reads the same fields (registry.parse_options).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import Tensor

from ..errors import ConfigError, setting
from ..losses import per_sample_loss
from ..report.progress_hooks import report_budget, report_stop

if TYPE_CHECKING:  # the registry imports nothing from here at run time either way
    from .registry import ProbeContext

# metadata keys of an option field
HELP, FLAGS, PARSE, SHOW, COMMAND = "help", "flags", "parse", "show_default", "command_value"
LAYERS = "layers"  # the field is the command's --layers/--no-layers switch (per-layer parts)


def option(default: Any, help: str, *, flags: Sequence[str] = (), parse: Callable[[str], Any] | None = None,
           show_default: str | None = None, command_value: Any = dataclasses.MISSING,
           layers: bool = False) -> Any:
    """A field of a probe's Options with what its CLI flag needs.

    flags: the flag and its aliases as the user writes them (default: --NAME-WITH-DASHES);
    parse: turns a string from the command line or from -o into the value (e.g. "auto" → None);
    show_default: the default as --help shows it, when that is not the value itself;
    command_value: the probe's own command fixes this value and has no flag for it (the
      field stays an -o key of `probe`), for the rare option whose sensible value differs
      between the single-probe command and a multi-probe run (gap's missing split);
    layers: this boolean field is switched by --layers/--no-layers, which also shows the table.
    """
    meta: dict[str, Any] = {HELP: help, FLAGS: tuple(flags), LAYERS: layers}
    if parse is not None:
        meta[PARSE] = parse
    if show_default is not None:
        meta[SHOW] = show_default
    if command_value is not dataclasses.MISSING:
        meta[COMMAND] = command_value
    return dataclasses.field(default=default, metadata=meta)


def flag_names(field: dataclasses.Field) -> tuple[str, ...]:
    return field.metadata.get(FLAGS) or (f"--{field.name.replace('_', '-')}",)


def refuse_unused(options: Any, given: frozenset[str], unused: Sequence[str], probe: str, chosen: str,
                  why: str, fix: str = "leave it out") -> None:
    """An option the user gave (`given`: registry.parse_options) that the `chosen` estimator
    does not read is refused, named as a setting (the CLI says its flag, Python its keyword)
    and by its -o key."""
    fields = {f.name: f for f in dataclasses.fields(options)}
    for name in unused:
        if name in given:
            raise ConfigError(f"{setting(name)} ({probe}.{name}) has no effect with {chosen}: {why}; "
                              f"{fix}")


def layers_field(options_cls: type) -> str | None:
    """The name of the Options field that --layers/--no-layers switches, if the probe has one."""
    return next((f.name for f in dataclasses.fields(options_cls) if f.metadata.get(LAYERS)), None)


Progress = Callable[..., None]  # (done, total, *, value=None, stderr=None)


def finer_dtype(dtype: torch.dtype) -> str | None:
    """The flag of a dtype that resolves more than `dtype`, for a note's advice; None in float64,
    the finest there is: a note does not advise the dtype its run already used."""
    return None if dtype == torch.float64 else "--dtype float64"


def progress_reporter(ctx: "ProbeContext", desc: str, scale: float = 1.0) -> Progress | None:
    """The callback an estimator calls after each unit of work, forwarding to the context's
    renderer under this description; None when nothing listens (the estimators skip it then).
    value/stderr are the running estimate where the estimator has one, times `scale` when the
    probe's headline is a multiple of what the estimator estimates (the line shows the
    headline's units). Reports "0 done" of a total 0 (not yet known) at once: the probe has begun."""
    listener = ctx.progress
    if listener is None:
        return None

    def report(done: int, total: int, *, value: float | None = None, stderr: float | None = None) -> None:
        listener(desc, done, total, value=None if value is None else value * scale,
                 stderr=None if stderr is None else stderr * scale)

    # the start, total not yet known: the renderer names this probe from now on, not only after
    # its first unit of work (a block of products can take minutes)
    report(0, 0)
    if ctx.deadline is not None:  # an ETA past the budget says the budget will stop it
        report_budget(listener, desc, ctx.deadline - time.monotonic())
    return report


def told_if_budget(ctx: "ProbeContext", desc: str, stop_reason: str, planned: int | None = None) -> None:
    """Tell the progress display that --budget ended the estimator behind `desc`, so its line
    ends "stopped by the budget" rather than as though it had run its course; `planned`, the
    units it would have taken where its count's total was cut to what ran."""
    if stop_reason == "budget":
        report_stop(ctx.progress, desc, "budget", planned)


def budget_stop(ctx: "ProbeContext") -> Callable[[], bool] | None:
    """The estimators' `should_stop`: true once the probe's share of --budget is spent."""
    deadline = ctx.deadline
    if deadline is None:
        return None
    return lambda: time.monotonic() >= deadline


def time_left(ctx: "ProbeContext") -> Callable[[], float] | None:
    """Seconds left of the probe's share of --budget, for estimators that size their work up
    front rather than stop between steps (Hutch++); None without a budget."""
    deadline = ctx.deadline
    if deadline is None:
        return None
    return lambda: deadline - time.monotonic()


# With --budget the per-sample probes take their samples at most this many at a time (fewer
# as the time left shrinks: SampleBudget.chunk), so that the budget can end the loop: a chunk
# sized by memory alone is often the whole sample set, and a budget checked only between
# chunks would then never be checked.
BUDGET_CHUNK = 8


class SampleBudget:
    """--budget over the loop of a per-sample probe (jacobian, mls, decomposition): chunks sized
    to the time left (`chunk`) under a budget, and the loop ends before its next chunk once
    the budget is spent, with at least one chunk in. `cut` then holds the details that say so
    (the means are over the samples used: an estimate of the same quantity that no gate may
    compare with a run over all of them, so the result is not resolved), and the progress
    display's end line says "stopped by the budget" for `desc`."""

    def __init__(self, ctx: "ProbeContext", desc: str):
        self.should_stop = budget_stop(ctx)
        self.deadline = ctx.deadline
        self.progress, self.desc = ctx.progress, desc
        self.cut: dict[str, Any] | None = None
        self.started: float | None = None

    def chunk(self, chunk: int, done: int) -> int:
        """Samples in the next chunk, `done` samples in: `chunk` without a budget. Under one, the
        first chunk is one sample, which times a sample, and each later one as many as the
        time left takes at that rate (at least one, at most BUDGET_CHUNK): a sample of a large
        model can take minutes, and a fixed chunk would overrun the budget by all of its
        samples where this overruns it by about one."""
        if self.should_stop is None:
            return chunk
        now = time.monotonic()
        if done == 0 or self.started is None:
            self.started = now
            return 1
        fit = BUDGET_CHUNK
        if self.deadline is not None:
            per_sample = (now - self.started) / done
            fit = int(max(0.0, self.deadline - now) // per_sample) if per_sample > 0 else BUDGET_CHUNK
        return max(1, min(chunk, BUDGET_CHUNK, fit))

    def ends(self, done: int, requested: int) -> bool:
        """Whether the loop ends before its next chunk, `done` of `requested` samples in."""
        if self.should_stop is None or not 0 < done < requested or not self.should_stop():
            return False
        self.cut = {"stop_reason": "budget", "samples_used": done, "samples_requested": requested,
                    "unresolved_reason": f"stopped by --budget after {done} of {requested} samples (the means "
                                         "are over those); raise --budget or lower --samples"}
        report_stop(self.progress, self.desc, "budget")
        return True


Statistic = Callable[[Tensor, Tensor], Tensor]  # (logits, labels) → (B,) per-sample values


def sample_means(backend: Any, *stats: Statistic) -> list[float]:
    """The exact mean over the backend's sample set of each per-sample statistic, in float64
    (each batch's mean weighted by the batch's share of the samples)."""
    sums = torch.zeros(len(stats), dtype=torch.float64)
    for logits, y, weight in backend.outputs():
        per_sample = torch.stack([s(logits, y).to(torch.float64) for s in stats])
        sums += per_sample.mean(1).cpu() * weight
    return sums.tolist()


def loss_statistic(backend: Any) -> Statistic:
    loss = backend.problem.loss
    return lambda logits, y: per_sample_loss(logits, y, loss)


def accuracy(logits: Tensor, y: Tensor) -> Tensor:
    return logits.argmax(-1) == y


def mean_loss(backend: Any) -> float:
    """L(θ) over the whole sample set."""
    return sample_means(backend, loss_statistic(backend))[0]


def loss_and_accuracy(backend: Any) -> tuple[float, float]:
    loss, acc = sample_means(backend, loss_statistic(backend), accuracy)
    return loss, acc
