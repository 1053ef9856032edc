"""Everything about a baseline that would make a verdict indefensible, checked before any probe
runs: another model or data set, a record that is not its key's probe's, a value a rule needs
that is not a finite number or that its probe does not stand behind, another quantity, and an
error so wide that no run could decide the rule; and a report that holds none of the probes the
relative rules compare (another command's report, another gate file's), which would decide
nothing and let every relative rule be skipped."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from ...errors import InputError
from ...probes.gating import gating_of
from ..results_io import FieldMissing, as_number, keys_near, resolve_field
from .baseline import Baseline, check_records, check_superseded, foreign_fields, schema_tuple
from .config import Bound, GateConfig
from .statistics import dof as dof_of, error_bound, no_probe_values, other_draws, quantile, slope as slope_of
from .verdicts import baseline_number, unresolved


def check_coverage(gate: GateConfig, baseline: Baseline) -> list[Bound]:
    """The relative rules the baseline cannot decide, because it holds no result of their probe
    (a probe added since it was made: they are skipped, and said so). A baseline that decides
    none of them is refused: a report of other probes, pointed at by mistake, would otherwise
    turn every relative rule off and let the gate pass. Which command wrote the report does
    not matter, only what it holds: reports share one format, and a single probe's command
    (its --json) is as good a baseline for that probe's rules as a gate's own --json."""
    relative = [b for b in gate.bounds if b.relative]
    lacking = [b for b in relative if b.probe not in baseline.results]
    if relative and len(lacking) == len(relative):
        needed = " or ".join(dict.fromkeys(b.probe for b in relative))
        held = ", ".join(sorted(baseline.results))
        raise InputError(f"{baseline.where}: a report of {held} only, with no {needed} result: it decides no "
                         f"relative rule (the gate file has {len(relative)}); give the --json of a run of those "
                         "probes (the last release's gate run with this file), or --no-baseline to skip them")
    return lacking


def _dtype_hint(base: Mapping[str, Any], now: Mapping[str, Any], diff: list[str]) -> str:
    """Where the data differ only as read (the fingerprint is of the samples in the run's
    dtype): the dtype the baseline was made in, which is what to run at (stranger19)."""
    was, is_ = base.get("dtype"), now.get("dtype")
    if not (isinstance(was, str) and isinstance(is_, str) and was != is_):
        return ""
    if not diff or any(not d.startswith("data.fingerprint") for d in diff):
        return ""  # another model or data set besides: a dtype alone would not make them one
    return f"; the baseline was made in {was} and this run is {is_}: run with --dtype {was}"


def _check_tf32(baseline: Baseline, current_meta: Mapping[str, Any]) -> None:
    """TF32 products move some values past their own error bars (on an H200 the demo's top
    eigenvalue by 18 times its certified bound: benchmarks/results/tf32_effect_h200.md), so a run
    with it and one without do not measure one number. A report from before the field was
    recorded says nothing and is not refused."""
    was, is_ = baseline.meta.get("allow_tf32"), current_meta.get("allow_tf32")
    if isinstance(was, bool) and isinstance(is_, bool) and was != is_:
        words = {True: "with TF32 products", False: "without TF32"}
        raise InputError(f"{baseline.where}: made {words[was]} and this run is {words[is_]}: run "
                         f"{'with' if was else 'without'} --allow-tf32, or compare anyway with "
                         "--allow-foreign-baseline")


# Before schema 2.7 a float32 run's curvature products of a softmax loss lost about float32's
# eps of absolute precision per sample, against an output Hessian the size of the share the
# sample leaves below its top class (losses.py): relative error about eps / mean share. Beyond a
# tenth of the top eigenvalue's default tolerance (1e-3) such a baseline's values are not its
# model's.
_FLOAT32_EPS = 2.0**-23
_STALE_SOFTMAX = 1e-4


def _check_softmax_cancellation(gate: GateConfig, baseline: Baseline, current_meta: Mapping[str, Any]) -> None:
    """A float32 cross-entropy baseline from before schema 2.7 of a model whose softmax is
    saturated measured its loss's curvature with cancellation: refused, saying why, where the
    error could pass a tenth of that tolerance and a relative rule reads a probe whose values go
    through the loss (Gating.loss_curvature). The baseline's own saturation was not recorded:
    this run's (data.softmax_saturation) stands for it, the model a gate compares being the
    baseline's own or its successor."""
    if not any(b.relative and gating_of(b.probe).loss_curvature for b in gate.bounds):
        return
    saturation = (current_meta.get("data") or {}).get("softmax_saturation")
    schema = schema_tuple(baseline.schema)
    if not isinstance(saturation, Mapping) or schema is None or schema >= (2, 7):
        return
    if baseline.meta.get("dtype") != "float32" or not isinstance(saturation.get("mean"), (int, float)):
        return
    error = _FLOAT32_EPS / saturation["mean"] if saturation["mean"] > 0 else math.inf
    if error > _STALE_SOFTMAX:
        raise InputError(
            f"{baseline.where}: made in float32 by a flatcheck before schema 2.7, whose softmax curvature lost "
            f"precision where the softmax saturates; this model leaves on average {saturation['mean']:.2g} below "
            f"its top class ({saturation['samples']} samples under {saturation['threshold']:g}), so those values "
            f"could be off by about {error:.1g} relative: measure the baseline again with this version, or "
            "compare anyway with --allow-foreign-baseline")


def check_baseline(gate: GateConfig, baseline: Baseline, current_meta: Mapping[str, Any], *, seed: int,
                   confidence: float | None = None, allow_foreign: bool = False) -> list[Bound]:
    """Refuse (exit 2, one line) a baseline no verdict could be defended on (see the module).
    Returns the relative rules it cannot decide (their probe added since: skipped)."""
    skipped = check_coverage(gate, baseline)
    if not allow_foreign:
        diff = foreign_fields(baseline.meta, current_meta)
        if diff:
            raise InputError(f"{baseline.where}: made on another model or data set ({'; '.join(diff[:3])}"
                             f"{'; …' if len(diff) > 3 else ''}){_dtype_hint(baseline.meta, current_meta, diff)}; "
                             f"compare anyway with --allow-foreign-baseline")
        _check_tf32(baseline, current_meta)
        _check_softmax_cancellation(gate, baseline, current_meta)
    check_records(baseline)
    read: dict[str, list[str]] = {}
    for bound in gate.bounds:
        read.setdefault(bound.probe, []).append(bound.path.partition(".")[2])
    check_superseded(baseline, read)
    level = confidence if confidence is not None else gate.confidence
    for bound in gate.bounds:
        if not bound.relative:
            _check_spelling(bound, gate, baseline)
            continue
        try:
            raw, raw_se = resolve_field(baseline.results, bound.field)
        except FieldMissing:
            if bound.probe not in baseline.results:
                continue  # a probe added since: skipped, and said so
            # the probe is there and the field is not: a misspelt field, caught before any probe runs
            raise _misspelt(bound, gate, baseline) from None
        b, s_b = baseline_number(bound, raw, raw_se, baseline.where)
        result = baseline.results.get(bound.probe) or {}
        why = unresolved(result, bound.probe)
        if why:
            raise InputError(f"{baseline.where}: rule {bound.name}: the baseline's {why}")
        _check_same_quantity(bound, result, gate, baseline.where, current_meta)
        if bound.headline:
            _check_probe_values(bound, result, b, s_b, baseline)
        _check_decidable(bound, b, s_b, baseline, seed, level, gate)
        _check_bounded(bound, b, baseline)
    return skipped


def _misspelt(bound: Bound, gate: GateConfig, baseline: Baseline) -> InputError:
    at = f"{baseline.where}: rule {bound.name}: field '{bound.field}' is not in the baseline's {bound.probe} result"
    empty = _empty_on_path(baseline.results, bound.field)
    if empty is None:
        return InputError(f"{at} ({keys_near(baseline.results, bound.field)})")
    # not a misspelling that a list of names could show: the baseline holds none there (parts
    # an option turns on, left off), and the run that makes them is what to say
    other = _other_options(gate, bound.probe, baseline.results[bound.probe])
    spelt = ", ".join(f"probes.{bound.probe}.{name}: {_yaml(now)}" for name, now, _ in other)
    was = ", ".join(f"{name}: {_yaml(then)}" for name, _, then in other)
    how = (f"it was measured with {was}, this gate runs {spelt}; remake it with this gate file (flatcheck "
           "gate … --no-baseline --json)" if other else f"remake it with the {bound.probe} options that fill {empty}")
    return InputError(f"{at}: its {empty} is empty, so it has no parts to compare with; {how}")


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _empty_on_path(results: Mapping[str, Any], field: str) -> str | None:
    """The dotted name of an empty mapping that `field` runs into in `results` (per-layer
    parts of a run that left them off), or None."""
    parts = [p for p in field.split(".") if p]
    paths = [parts] + ([[parts[0], "details", *parts[1:]]] if len(parts) >= 2 and parts[1] != "details" else [])
    for path in paths:
        node: Any = results
        for i, key in enumerate(path):
            if isinstance(node, Mapping) and not node and i > 1:
                return ".".join(path[:i])
            if not isinstance(node, Mapping) or key not in node:
                break
            node = node[key]
    return None


def _check_spelling(bound: Bound, gate: GateConfig, baseline: Baseline) -> None:
    """A `max`/`min` rule's field checked against the baseline's result of its probe, so that a
    misspelt one is refused before the probes run rather than after. Only where that result was
    measured with the options this gate sets, as far as its details name them: many fields
    exist under some options alone (per-layer parts, an estimate route's residuals), and such
    a rule is checked on the run's own result."""
    record = baseline.results.get(bound.probe)
    if not isinstance(record, Mapping) or _other_options(gate, bound.probe, record):
        return
    try:
        resolve_field(baseline.results, bound.field)
    except FieldMissing:
        raise _misspelt(bound, gate, baseline) from None


def _other_options(gate: GateConfig, probe: str, record: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(option, this gate's value, the record's) for each option the record's details name
    with another value than this gate sets (an option left open, None or "auto", differs from
    nothing)."""
    details = record.get("details") or {}
    options = gate.options(probe)
    out = []
    for f in dataclasses.fields(options):
        now, then = getattr(options, f.name), details.get(f.name)
        if now is None or now == "auto" or then is None or not isinstance(now, (str, int, float, bool)):
            continue
        if now != then:
            out.append((f.name, now, then))
    return out


def _check_same_quantity(bound: Bound, result: Mapping[str, Any], gate: GateConfig, where: str,
                         current_meta: Mapping[str, Any] | None = None) -> None:
    """A Tr(G) baseline does not bound a Tr(H), nor an MLS of the softmax one of the logits:
    refuse when the baseline says it measured with another value of an option that defines
    the quantity (`matrix`, and the probe's quantity options) than this gate's run will."""
    details = result.get("details") or {}
    gating = gating_of(bound.probe)
    options = gate.options(bound.probe)
    now = gating.planned_identity(options)[1]
    then = details.get("matrix")
    if now is not None and then is not None and now != then:
        raise InputError(f"{where}: rule {bound.name}: the baseline's {bound.probe} is of the {then} matrix, "
                         f"this gate's of the {now}: not the same quantity (set probes.{bound.probe}.matrix)")
    for key in gating.quantity_options:
        planned, then = getattr(options, key, None), details.get(key)
        if planned is None and key == "loss":  # the model's own loss
            planned = ((current_meta or {}).get("model") or {}).get("loss")
        if planned is not None and then is not None and planned != then:
            raise InputError(f"{where}: rule {bound.name}: the baseline's {bound.probe} was measured with {key} "
                             f"{then!r}, this gate's will be with {planned!r}: not the same quantity (set "
                             f"probes.{bound.probe}.{key}: {then})")


def _check_probe_values(bound: Bound, result: Mapping[str, Any], b: float, s_b: float, baseline: Baseline) -> None:
    """Per-probe values a comparison would pair on must give the value and stderr the report
    shows (value = offset + mean, stderr = sd/√n): otherwise the verdict would follow numbers
    the report does not show — an edited or corrupted baseline."""
    where = baseline.where
    details = result.get("details") or {}
    values = details.get("probe_values")
    if values is None:
        return
    nums = [as_number(v) for v in values] if isinstance(values, list) else [None]
    offset = as_number(details.get("offset"))
    if len(nums) < 2 or any(v is None or not math.isfinite(v) for v in nums) or offset is None \
            or not math.isfinite(offset):
        raise InputError(f"{where}: {bound.probe}.details.probe_values/offset are not two or more finite numbers "
                         "and a number: the report was edited or cut")
    mean = sum(nums) / len(nums)
    se = gating_of(bound.probe).values_stderr(details, nums)
    scale = max(abs(offset), max(abs(v) for v in nums), 1e-300)
    # both sides are sums of the same float64 numbers in another order: agree to round-off
    if abs(offset + mean - b) > 1e-9 * scale or not math.isfinite(se) or abs(se - s_b) > 1e-9 * max(se, 1e-300):
        raise InputError(f"{where}: {bound.field} is {b:.6g} ± {s_b:.3g}, but its probe_values and offset give "
                         f"{offset + mean:.6g} ± {se:.3g}: the report was edited or corrupted")


def _planned_unpaired(bound: Bound, gate: GateConfig, baseline: Baseline, seed: int) -> str:
    """Why this gate's run of `bound`'s probe will not pair with the baseline ("" when it will),
    from the options it is about to run with; `pairing` decides again on the results."""
    if not bound.headline:
        return "only a headline value is paired"
    gating = gating_of(bound.probe)
    options = gate.options(bound.probe)
    estimator, matrix = gating.planned_identity(options)
    base = baseline.results.get(bound.probe) or {}
    return (other_draws(base, seed, estimator, matrix, baseline.schema)
            or gating.count_mismatch(base.get("details") or {}, options))


def _planned_precision(bound: Bound, gate: GateConfig, baseline: Baseline) -> float:
    """The gate run's standard error over the baseline's, from their counts where the probe's
    estimator says how its error falls with them; 1 otherwise (as precise as the baseline)."""
    if not bound.headline:
        return 1.0
    result = baseline.results.get(bound.probe) or {}
    return gating_of(bound.probe).precision_ratio(bound.probe, result, gate.options(bound.probe))


def _check_decidable(bound: Bound, b: float, s_b: float, baseline: Baseline, seed: int, level: float,
                     gate: GateConfig) -> None:
    """Refuse a rule that an unchanged model would not pass reliably, before the run.

    Paired, the per-probe statistic of an unchanged model is (1 − slope)·b_i = ∓x·b_i: v − T is
    x·|b| exactly, with error x·s_b, so it passes when z·x·s_b < x·|b| (a 0 % margin too: an
    unchanged model differs by 0).
    Unpaired, an unchanged model's v − T is x·|b| plus noise of σ = √(s_c² + slope²·s_b²), s_c
    the run's own error (s_b rescaled to the gate's count where the estimator's count is known),
    and it passes when v − T > z·σ: only about half the time if x·|b| is just above z·σ, which a
    gate must not do to an unchanged model. The rule is kept when x·|b| ≥ 2z·σ: the unchanged
    model then passes with probability at least (1 + confidence)/2 (97.5 % at 0.95)."""
    unpaired = _planned_unpaired(bound, gate, baseline, seed)
    if not unpaired:
        # paired, an unchanged model's differences are ∓x·b_i, so the verdict's error (the
        # probe's paired_stderr of them) is x times that rule applied to the baseline's values;
        # not the headline's stderr, which a probe may floor for the value alone
        details = (baseline.results.get(bound.probe) or {}).get("details") or {}
        values = [as_number(v) for v in details.get("probe_values") or ()]
        if len(values) >= 2 and all(v is not None and math.isfinite(v) for v in values):
            s_b = gating_of(bound.probe).paired_stderr(details, values)[0]
    if s_b == 0:
        return
    margin = bound.limit * abs(b)
    dof = dof_of(baseline.results, bound)
    z = quantile(level, dof)
    if not unpaired:
        if margin == 0 or z * bound.limit * s_b < margin:
            return
        factor, times = bound.limit, 1
    else:
        scale = _planned_precision(bound, gate, baseline)
        factor, times = math.sqrt(scale**2 + slope_of(bound, b) ** 2), 2
        if margin > 0 and times * z * factor * s_b <= margin:
            return
    how = f"unpaired ({unpaired})" if unpaired else "paired (same seed and estimator)"
    need_margin = ("twice that, for an unchanged model to pass in 97.5 % of runs rather than about half"
                   if unpaired else "more than that")
    msg = (f"{baseline.where}: rule {bound.name} cannot pass an unchanged model {how}: the baseline's "
           f"{bound.field} = {b:.6g} ± {s_b:.3g} gives an interval of ±{z * factor * s_b:.3g}, and the rule's "
           f"margin {margin:.3g} must be {need_margin}")
    gating, result = gating_of(bound.probe), baseline.results.get(bound.probe) or {}
    effort = gating.effort(result, bound.path)
    counted = dof is not None and margin > 0 and effort is not None
    if counted:
        m = int(dof) + 1
        # both runs at the new count: the run's error is then the baseline's (scale 1)
        both = math.sqrt(1 + slope_of(bound, b) ** 2) if unpaired else factor
        # s_b is itself estimated from m draws, to about √((κ − 1)/(4m)) of itself (κ the draws'
        # kurtosis, 3 for normal ones; the per-probe values' own where the baseline keeps them,
        # skewed draws such as vᵀHv's having far more): the count is said for its upper 97.5 %
        # value, so that following the advice is enough (a stranger's 40-probe baseline was told
        # 2578, and at 2578 measured a wider spread and was told 2855)
        draws = [as_number(v) for v in (result.get("details") or {}).get("probe_values") or ()]
        kurtosis = _kurtosis(draws) if len(draws) >= 4 and all(v is not None and math.isfinite(v) for v in draws) \
            else 3.0
        known = 1 + quantile(level, None) * math.sqrt(max(kurtosis - 1.0, 2.0) / (4 * m))
        need = math.ceil(m * (times * z * both * s_b * known / margin) ** 2) + 1
        # in the unit of the probe's effort option (Hutch++ spends 3 products per residual probe)
        per = gating.effort_per_draw(result, m)
        count, why = math.ceil(need * per), ""
        exact = gating.exact_effort(result)
        if exact is not None and count >= exact[0]:
            count, why = exact[0], f"; {exact[1]}"
        msg += (f"; make the baseline, and run the gate, with {effort} ≥ {count} "
                f"(the baseline has {round(m * per)}{why})")
    remedies = []
    if unpaired and bound.headline:
        remakes = no_probe_values(result, baseline.schema)
        if not remakes[0] or remakes[1]:
            # the same seed, estimator and count draw the same vectors: pairing is open to it
            remedies.append("make the baseline with this gate file at this seed (flatcheck gate … --no-baseline "
                            "--json) to compare paired")
    width = _width_needed(bound, b, s_b, z, times, _planned_precision(bound, gate, baseline)) if unpaired else None
    if width is not None:
        remedies.append(f"widen the rule to {bound.kind}: {width}% or more")
    if unpaired:
        remedies.append("bound the value itself with a max or min rule")
    if remedies:
        msg += (", or " if counted else "; ") + ", or ".join(remedies)
    raise InputError(msg)


def _width_needed(bound: Bound, b: float, s_b: float, z: float, times: int, scale: float) -> int | None:
    """The narrowest whole-percent margin x at which an unchanged model passes the rule
    unpaired (x·|b| ≥ times·z·√(scale² + slope(x)²)·s_b: the slope moves with x), up to
    1000 %; None beyond."""
    for percent in range(max(1, math.ceil(bound.limit * 100)), 1001):
        x = percent / 100
        slope = slope_of(dataclasses.replace(bound, limit=x), b)
        if x * abs(b) >= times * z * math.sqrt(scale**2 + slope**2) * s_b:
            return percent
    return None


def _check_bounded(bound: Bound, b: float, baseline: Baseline) -> None:
    """Refuse a rule whose margin an iterative value's own error bound fills: an unchanged model
    measured as tightly as the baseline is decided on an interval of ±(1 + slope)·h_b around a
    value x·|b| inside the threshold, so it can pass only if that is less than x·|b|."""
    h = error_bound(baseline.results, bound)
    if h == 0:
        return
    margin = bound.limit * abs(b)
    spread = (1 + abs(slope_of(bound, b))) * h
    if spread < margin:
        return
    option = gating_of(bound.probe).tolerance_option
    tighter = f"a smaller probes.{bound.probe}.{option}" if option else f"a tighter tolerance of {bound.probe}"
    raise InputError(f"{baseline.where}: rule {bound.name} cannot pass an unchanged model: the baseline's "
                     f"{bound.field} = {b:.6g} is good to ±{h:.3g} (its stated error bound), so the comparison "
                     f"is good to ±{spread:.3g}, not inside the rule's margin {margin:.3g}; widen the rule, or "
                     f"remake the baseline with {tighter} (or --dtype float64)")


def _kurtosis(values: list[float]) -> float:
    """The sample's kurtosis E(x − x̄)⁴ / (E(x − x̄)²)², 3 for a normal sample (0 spread: 3)."""
    n = len(values)
    mean = sum(values) / n
    second = sum((v - mean) ** 2 for v in values) / n
    if second <= 0:
        return 3.0
    return sum((v - mean) ** 4 for v in values) / n / second ** 2
