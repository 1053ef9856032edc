"""What a CI gate needs to know of a probe, declared by the probe beside its Options.

A probe class names its declaration as `gating: ClassVar[Gating]`. The gate
(flatcheck.workflows.gate) reads every probe-specific fact through it and holds no probe
name of its own: how good a value is (its degrees of freedom, a hard error bound), whether
the probe stands behind it (`unresolved`), what makes two runs draw the same probes (so they
can be compared probe by probe), which options define the quantity and which routes are
different estimators of it, the option a rerun raises, and which option values the gate
chooses itself. The fields cover what is one name or a set; a subclass overrides a method
whose default does not describe its results.

Contract of the defaults (`Gating()`): a value is exact when it has no stderr and no error
bound; a standard error is a sample standard deviation over `dof` draws (Student's t) for
the headline, normal for any other field; the headline's hard error bound is the result's
`error_bound` (or `details.<probe>_error_bound`); a result with `resolved: false` gets no
verdict; nothing pairs two runs unless the result keeps `details.probe_values` (value =
`details.offset` + their mean), and then only runs of the same seed, estimator, matrix and
count; no rerun (no effort option, for any route).

A probe that declares nothing gets UNDECLARED: a gate decides only on its exact values and
refuses (exit 2) a rule on anything with a standard error or an error bound, since nothing
says how many draws made that error or what else bounds it. Guessing a normal interval there
is how an iterative estimate would be gated as a plain number: a Ritz value off by its
residual, an SLQ spread over four start vectors taken as a normal one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import ConfigError

Result = Mapping[str, Any]  # a probe result as its report holds it (ProbeResult.to_dict())


def number(x: Any) -> float | None:
    """A finite JSON number, else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


@dataclass(frozen=True)
class Gating:
    """How a gate reads, pairs, compares and reruns one probe's results (see the module)."""

    # the integer option that buys more samples; a gate's `inconclusive: rerun` multiplies it
    effort_option: str | None = None
    # where the headline's route (details.route) decides which estimate it is, that route's
    # effort option instead (two estimators, each with its own count)
    route_efforts: Mapping[str, str] = field(default_factory=dict)
    # a field below the probe that one estimator alone makes (a prefix such as "details.mc."),
    # with that estimator's effort option: a rule on it is rerun by that count
    field_efforts: Mapping[str, str] = field(default_factory=dict)
    # options that change the quantity itself, not how it is estimated, each kept under the
    # same key in the result's details; `matrix` always counts. A baseline measured with
    # other values is another quantity and is refused
    quantity_options: tuple[str, ...] = ()
    # an option that stops on the running error: the probe count would follow the draws, so
    # two runs would not draw the same probes; a gate sets it off and refuses a value for it
    adaptive_stop: str | None = None
    # the option that tightens an iterative value's error bound (named when a rule's margin
    # is inside the baseline's bound)
    tolerance_option: str | None = None
    # every details.route the probe writes (the part before ": "): a record with another is
    # not this probe's
    routes: frozenset[str] = frozenset()
    # routes that are different estimators of the headline (not one estimator's arithmetic),
    # each with the value of `route_option` that takes it again: two of them never compare
    estimator_routes: Mapping[str, str] = field(default_factory=dict)
    route_option: str | None = None
    # fields (paths below the probe, e.g. "details.layers.") whose stderr comes from the same
    # draws as the headline's, and so has its `dof`; every_field_shares_draws: all of them do
    same_draws: tuple[str, ...] = ()
    every_field_shares_draws: bool = False
    declared: bool = True
    # whether the values go through the loss's derivatives or values (losses.py): a float32
    # record of a saturated softmax from before schema 2.7 had them with cancellation
    loss_curvature: bool = True

    def effort(self, result: "Result | None" = None, field_: str | None = None) -> str | None:
        """The option a rerun raises for a rule on `field_` (a full dotted path) of this result:
        the estimator's that makes the field (field_efforts), else the headline route's
        (route_efforts), else effort_option."""
        rest = field_.partition(".")[2] if field_ else ""
        for prefix, name in self.field_efforts.items():
            if rest.startswith(prefix):
                return name
        details = (result or {}).get("details") if isinstance(result, Mapping) else getattr(result, "details", None)
        route = details.get("route") if isinstance(details, Mapping) else None
        if isinstance(route, str) and route.partition(":")[0] in self.route_efforts:
            return self.route_efforts[route.partition(":")[0]]
        return self.effort_option

    # ------------------------------------------------------------ how good a value is

    def dof(self, probe: str, result: Result, field_: str) -> float | None:
        """Degrees of freedom of the stderr of `field_` (a full dotted path); None: normal."""
        rest = field_.partition(".")[2]
        if not (headline(probe, field_) or self.every_field_shares_draws or rest.startswith(self.same_draws)):
            return None
        dof = result.get("dof")
        return float(dof) if isinstance(dof, (int, float)) and not isinstance(dof, bool) and dof >= 1 else None

    def headline_error_bound(self, probe: str, result: Result) -> float | None:
        """|value − the quantity| ≤ this, for a value an iteration stopped within its tolerance."""
        found = number(result.get("error_bound"))
        return found if found is not None else number((result.get("details") or {}).get(f"{probe}_error_bound"))

    def unresolved(self, probe: str, result: Result) -> str | None:
        """Why the probe does not stand behind this value (no verdict on it), or None."""
        d = result.get("details") or {}
        name = result.get("probe", probe)
        if result.get("resolved") is False:
            if isinstance(d.get("unresolved_reason"), str):
                return f"{name} {d['unresolved_reason']}"
            return f"{name} stopped short of its own stopping rule after {result.get('matvecs')} products"
        return None

    def admits(self, probe: str, result: Result, field_: str, stderr: float, bound: float) -> str | None:
        """Why no gate may decide on this field, or None (every declared probe: None)."""
        return None

    # ------------------------------------------------------------ records and quantities

    def check_record(self, probe: str, result: Result, schema: tuple[int, int] | None) -> str | None:
        """What in a baseline's record says it is not this probe's result (another probe's,
        or an edited one), or None. `schema`: the report's (MAJOR, MINOR), None if unknown."""
        details = result.get("details") or {}
        route = details.get("route")
        if route is not None:
            if not isinstance(route, str) or route.partition(":")[0] not in self.routes:
                known = ", ".join(sorted(self.routes)) or "none"
                return f"details.route {route!r} is not one of {probe}'s routes ({known})"
        return None

    def values_stderr(self, details: Mapping[str, Any], values: Sequence[float]) -> float:
        """The headline's stderr that its per-probe values (details.probe_values) give: their
        spread over √n unless the probe widens or floors it. A gate checks a baseline's stderr
        against it, so an edited stderr is refused."""
        n = len(values)
        mean = sum(values) / n
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)

    def paired_stderr(self, details: Mapping[str, Any], differences: Sequence[float]) -> tuple[float, str]:
        """The standard error of a paired comparison from its per-probe differences c_i − slope·b_i
        (`details`: the run's), and the name of the interval ± q·stderr it stands for (q: t on
        n − 1): their spread over √n ("t"), widened by `skew_widening` where the values are
        quadratic forms whose own interval guards their skewness (details.interval names a
        Hutchinson interval). The differences vᵀ(C − slope·B)v are such forms too, and can be as
        skewed: where one direction dominates C − slope·B, the bare t interval misses the true
        difference on one side in 4–10 % of runs at 10–100 probes against a nominal 2.5 % (a
        model that meets the rule at its threshold then fails it, or one beyond it passes).
        Widened it misses less, though still more than nominal where one direction carries most
        of ‖C − slope·B‖_F (skew_widening says why). The products' variance floor
        (INTERVAL_FLOOR) is the value's alone, not the differences'."""
        # imported here, not at the top: a gate that pairs no values needs neither torch nor linalg
        import torch

        from ..linalg.trace import INTERVAL_FLOOR, INTERVAL_SKEW, skew_widening

        spread = Gating.values_stderr(self, details, differences)
        if details.get("interval") not in (INTERVAL_SKEW, INTERVAL_FLOOR):
            return spread, "t"
        return spread * skew_widening(torch.tensor(list(differences), dtype=torch.float64)), INTERVAL_SKEW

    def superseded(self, probe: str, result: Result, schema: tuple[int, int] | None,
                   fields: Sequence[str]) -> str | None:
        """What this probe's record of an older schema means by a field that the current
        version means otherwise, or None: asked only of a probe the gate's rules read, with
        their fields below it (`fields`: "value", "details.layers.3.value", …). Comparing the
        two would gate two quantities as one."""
        return None

    def planned_identity(self, options: Any) -> tuple[Any, Any]:
        """(estimator, matrix) of a run with these options: which draws and which matrix."""
        return (getattr(options, "estimator", None),
                getattr(options, "resolved_matrix", getattr(options, "matrix", None)))

    # ------------------------------------------------------------ pairing

    def nested_draws(self, details: Mapping[str, Any]) -> bool:
        """Whether the i-th draw depends only on the seed, so that runs of different counts
        pair over their common first draws; else they pair only at equal counts."""
        return False

    def count_mismatch(self, base_details: Mapping[str, Any], options: Any) -> str:
        """Why a run with `options` will draw other vectors than the baseline did because of
        its count ("" when it will not); called when seed, estimator and matrix agree."""
        return ""

    def precision_ratio(self, probe: str, result: Result, options: Any) -> float:
        """The planned run's standard error over the baseline's, where the estimator says how
        its error falls with its count; 1 (as precise as the baseline) otherwise."""
        return 1.0

    def effort_per_draw(self, result: Result, draws: int) -> float:
        """Units of the effort option per draw of the headline's standard error (`draws`: its
        dof + 1), to say a needed count in the option's own unit: 1 where the option counts
        the draws themselves (starts, noise draws, probes)."""
        return 1.0

    def exact_effort(self, result: Result) -> tuple[int, str] | None:
        """The effort count from which the estimator's value is exact (its error 0), and why,
        where there is one: no count beyond it is of use. None: none."""
        return None

    # ------------------------------------------------------------ options a gate chooses

    def fixed_count(self, options: dict[str, Any]) -> dict[str, Any]:
        """The gate file's options with the adaptive stop off where the file leaves it out:
        two runs are paired only if they draw the same probes."""
        if self.adaptive_stop is not None and options.get(self.adaptive_stop) is None:
            options[self.adaptive_stop] = None
        return options

    def gate_options(self, options: dict[str, Any], fields: Sequence[str]) -> tuple[dict[str, Any], frozenset[str]]:
        """The options a gate's run takes, from the gate file's (`options`, already through
        `fixed_count`) and the paths its rules read below the probe (`fields`: "value",
        "details.layers.conv1.value"), and the names of those the gate chose itself, which
        `follow` may replace with a baseline's."""
        defaulted = set()
        if self.route_option is not None and self.estimator_routes and self.route_option not in options:
            defaulted.add(self.route_option)
        return options, frozenset(defaulted)

    def refuse_options(self, parsed: Any) -> tuple[str, str] | None:
        """(option, why) when a gate cannot take these parsed options, else None."""
        if self.adaptive_stop is not None and getattr(parsed, self.adaptive_stop, None) is not None:
            # a stop on the running error makes the probe count depend on the draws, so two
            # runs of a gate would not draw the same probes and could not be paired
            return self.adaptive_stop, ("is not allowed in a gate: gates take a fixed probe count "
                                        "(raise it, or let `inconclusive: rerun` double it)")
        return None

    def follow(self, options: Any, base: Result, same_seed: bool, defaulted: frozenset[str]) -> Any:
        """`options` with the baseline result's choices where the gate chose its own
        (`defaulted`): an estimator route always (the headline is then the same estimate)."""
        route = (base.get("details") or {}).get("route")
        if self.route_option in defaulted and route in self.estimator_routes and hasattr(options, self.route_option):
            options = dataclasses.replace(options, **{self.route_option: self.estimator_routes[route]})
        return options


@dataclass(frozen=True)
class Undeclared(Gating):
    """A probe with no declaration: exact values only (see the module)."""

    declared: bool = False

    def admits(self, probe: str, result: Result, field_: str, stderr: float, bound: float) -> str | None:
        if stderr > 0 or bound > 0:
            return (f"{field_} has {'a standard error' if stderr > 0 else 'an error bound'} and {probe} declares no "
                    f"gating (how many draws made it, what bounds it): a gate decides only on its exact values")
        return None


UNDECLARED = Undeclared()


def headline(probe: str, field_: str) -> bool:
    """Whether a rule's field is its probe's headline value."""
    return field_ in (probe, f"{probe}.value")


def gating_of(probe: str) -> Gating:
    """The probe's declaration; UNDECLARED for a probe that has none or is not registered."""
    from .registry import get_probe_class

    try:
        cls = get_probe_class(probe)
    except ConfigError:
        return UNDECLARED
    found = getattr(cls, "gating", None)
    return found if isinstance(found, Gating) else UNDECLARED
