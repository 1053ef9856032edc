"""The numbers a verdict is made of: interval quantiles, degrees of freedom, hard error bounds,
and the pairing of two runs that drew the same probe vectors.

Every probe-specific fact comes from the probe's gating declaration (flatcheck.probes.gating).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from scipy.stats import norm, t as student_t

from ...linalg.random import SIGN_STREAM
from ...probes.gating import gating_of
from ..results_io import FieldMissing, as_number, field_sibling
from .baseline import schema_tuple
from .config import Bound


def quantile(confidence: float, dof: float | None = None) -> float:
    """Two-sided quantile of a `confidence` interval: Student's t with `dof` degrees of freedom
    (a standard error from few draws), else normal."""
    p = 1 - (1 - confidence) / 2
    return float(norm.ppf(p) if dof is None or not math.isfinite(dof) else student_t.ppf(p, dof))


def welch(s1: float, dof1: float | None, s2: float, dof2: float | None) -> float | None:
    """Welch–Satterthwaite degrees of freedom of √(s1² + s2²); None (normal) when either side's
    are unknown, inf when both sides are exact."""
    if s1 == 0 and s2 == 0:
        return None
    parts = [(s, d) for s, d in ((s1, dof1), (s2, dof2)) if s > 0]
    if any(d is None for _, d in parts):
        return None
    return (s1**2 + s2**2) ** 2 / sum(s**4 / d for s, d in parts)


def slope(bound: Bound, b: float) -> float:
    """T = slope·b: 1 + x·sign(b) for max_increase, 1 − x·sign(b) for max_decrease."""
    sign = 1.0 if bound.upper else -1.0
    return 1.0 + sign * bound.limit * (1.0 if b >= 0 else -1.0)


def distinct(a: float, b: float) -> tuple[str, str]:
    """a and b to as many digits as tell them apart (6 at least), so that a verdict never reads
    as a value compared with itself."""
    for digits in (6, 8, 10, 12, 17):
        sa, sb = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if sa != sb:
            break
    return sa, sb


def error_bound(results: Mapping[str, Any] | None, bound: Bound) -> float:
    """A hard bound on the error of the rule's value (0 where the result states none): an
    iterative value is good to its tolerance, not to the last digit. The headline's comes
    from the probe's declaration; any other field states its own as the sibling
    `<name>_error_bound` (a matrix-free norm's estimate route)."""
    if results is None:
        return 0.0
    result = results.get(bound.probe) or {}
    if bound.headline:
        found = gating_of(bound.probe).headline_error_bound(bound.probe, result)
    else:
        try:
            found = as_number(field_sibling(dict(results), bound.field, "_error_bound"))
        except FieldMissing:
            found = None
    return abs(found) if found is not None and math.isfinite(found) else 0.0


def dof(results: Mapping[str, Any], bound: Bound) -> float | None:
    """Degrees of freedom of the rule's stderr (the probe's declaration says which fields
    average over the draws its `dof` counts); None: normal."""
    return gating_of(bound.probe).dof(bound.probe, results.get(bound.probe) or {}, bound.path)


@dataclass(frozen=True)
class Pairing:
    """Per-probe values of the same probe vectors in two runs (see `pairing`)."""

    current: tuple[float, ...]
    baseline: tuple[float, ...]
    current_offset: float
    baseline_offset: float
    baseline_count: int  # probe values the baseline holds (≥ n)

    @property
    def n(self) -> int:
        return len(self.current)

    def baseline_value(self) -> float:
        return self.baseline_offset + sum(self.baseline) / self.n

    def current_value(self) -> float:
        return self.current_offset + sum(self.current) / self.n

    def differences(self, slope_: float) -> list[float]:
        """The per-probe differences c_i − slope·b_i."""
        return [c - slope_ * b for c, b in zip(self.current, self.baseline)]

    def excess(self, slope_: float) -> float:
        """v − slope·b, from the per-probe differences (its error: Gating.paired_stderr)."""
        return self.current_offset - slope_ * self.baseline_offset + sum(self.differences(slope_)) / self.n


def pairing(bound: Bound, current: Mapping[str, Any], baseline: Mapping[str, Any]) -> tuple[Pairing | None, str]:
    """The paired per-probe values of `bound`'s probe in both reports, or None and why not.

    Pairs only a probe's headline value, and only when both results say which probe vectors
    made it: the same seed and estimator (and matrix), per-probe values stored (schema ≥ 2).
    Runs of different counts pair over their common first draws where the probe declares the
    i-th draw to depend on the seed alone (`nested_draws`), else only at equal counts.
    """
    if not bound.headline:
        return None, ""
    cur, base = current.get(bound.probe) or {}, baseline.get(bound.probe) or {}
    cd, bd = cur.get("details") or {}, base.get("details") or {}
    if not isinstance(cd.get("probe_values"), list):
        return None, f"unpaired: this {bound.probe} result keeps no per-probe values"
    why = other_draws(base, cur.get("seed"), cd.get("estimator"), cd.get("matrix"))
    if why:
        return None, f"unpaired: {why}"
    c_vals, b_vals = cd["probe_values"], bd["probe_values"]
    if not gating_of(bound.probe).nested_draws(cd) and len(c_vals) != len(b_vals):
        return None, (f"unpaired: {cd.get('estimator')} draws other vectors at another count "
                      f"(baseline {len(b_vals)}, now {len(c_vals)})")
    n = min(len(c_vals), len(b_vals))
    values = [as_number(x) for x in (*c_vals[:n], *b_vals[:n], cd.get("offset", 0.0), bd.get("offset", 0.0))]
    if n < 2 or any(v is None or not math.isfinite(v) for v in values):
        return None, "unpaired: fewer than two finite per-probe values"
    return Pairing(tuple(values[:n]), tuple(values[n:2 * n]), values[-2], values[-1], len(b_vals)), ""


def no_probe_values(base: Mapping[str, Any], schema: Any = None) -> tuple[str, bool]:
    """Why no run can be paired with the baseline result `base` ("" when it keeps per-probe
    values), and whether a baseline remade by this flatcheck would be: reports kept them from
    schema 2.0 on, so a newer report without them is of a probe that keeps none (its runs are
    compared unpaired at every seed)."""
    if isinstance((base.get("details") or {}).get("probe_values"), list):
        return "", False
    probe = base.get("probe", "the probe")
    found = schema_tuple(schema)
    if found is not None and found < (2, 0):
        return f"the baseline is of schema {schema}, from before reports kept per-probe values", True
    if found is not None:
        return (f"the baseline's {probe} result keeps no per-probe values (its estimator keeps none), so it is "
                "compared with no run probe by probe, at any seed"), False
    return f"the baseline's {probe} result holds no per-probe values", False


def other_draws(base: Mapping[str, Any], seed: Any, estimator: Any, matrix: Any, schema: Any = None) -> str:
    """Why a run at `seed` with `estimator` on `matrix` draws other probe vectors than the
    baseline result `base` (of report schema `schema`) did, or cannot be matched to them
    ("" when it draws the same)."""
    details = base.get("details") or {}
    why = no_probe_values(base, schema)[0]
    if why:
        return why
    for key, now in (("estimator", estimator), ("matrix", matrix)):
        if details.get(key) != now:
            return f"{key} differs (baseline {details.get(key)}, now {now})"
    if base.get("seed") != seed:
        return f"seeds differ (baseline {base.get('seed')}, now {seed})"
    if details.get("sign_stream", 1) != SIGN_STREAM:
        return (f"the baseline's probe vectors come from another flatcheck's random stream (sign stream "
                f"{details.get('sign_stream', 1)}, now {SIGN_STREAM}): the same seed gave other vectors")
    return ""
