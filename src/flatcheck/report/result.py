"""What a run produces: one ProbeResult per probe inside a Report with the run's provenance."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# 2.0: `dof` of the standard error, and a Hutchinson/Hutch++ trace's per-probe values
# (details.probe_values, details.offset) and route (details.route), which gates pair on
# 2.1: jacobian, mls and decomposition report matvecs 0 and their backward passes in details.backward_passes
# 2.2: jacobian's estimate route takes ‖J‖₂ by Lanczos on JJᵀ: details.spectral.lanczos_iterations,
#      lanczos_tol and max_error_bound replace power_iterations and power_tol
# 2.3: rank's statistical_stderr is at least the sampling bound of its start vectors
#      (details.statistical_stderr_parts), and a float32 breakdown off 0 is no longer exact
# 2.4: `error_bound`: the bound of a value an iteration stopped within its tolerance (lmax's
#      residual, mls's estimate route); such a value is no longer called exact
# 2.5: decomposition's details.ggn_trace is Tr(G) over every probed parameter (it was the layers'
#      weights alone, now details.ggn_trace_weights); ggn_trace_stderr and ggn_trace_weights_stderr
#      replace ggn_trace_stderr_all_parameters; dense_ggn_trace_weights replaces dense_ggn_trace;
#      a shared dense weight's cross terms (details.shared_cross_terms) are part of the value;
#      a spectrum whose rules --budget cut is unresolved (details.unresolved_reason), its density
#      null (details.density.null_reason); mls's details.mls_bound_reason and nmls_bound_reason;
#      a Hutchinson trace's details.known_stderr (dof null where it floors the stderr), and
#      details.interval (which interval value ± q·stderr is: the floored normal one, or the t one
#      widened by the values' skewness), spread_stderr and skewness; under
#      --max-memory details.memory.peak_bytes, device and max_memory_covers; a rank whose rules
#      --budget cut is unresolved too; meta.checkpoint.cast (the stored dtype, and the tensors a
#      cast to --dtype rounded)
# 2.6: a Hutch++ trace's per-layer parts are unbiased (each carried a cross term 2·diag(QQᵀAP⊥)
#      that cancelled in the total only); spectrum's stderrs (the value's and details.trace,
#      trace_sq, frobenius) are floored by a start's known variance, for a normal interval (dof
#      null, details.interval "normal_start_variance_floor"; spread_stderr, known_stderr and
#      ritz_lower_bound beside them), and frobenius.stderr is always given
# 2.7: cross entropy's (and label smoothing's) curvature is computed without cancellation where
#      the softmax saturates (losses.py: before, a float32 run lost float32's eps of absolute
#      precision per sample, and a model whose samples leave 1e-7 below their top class had its
#      λmax off by 1 %); meta.allow_tf32; data.softmax_saturation (the samples under 1e-3, the
#      least and the mean share below the top class), by which a gate tells an older float32
#      baseline that the cancellation affected
SCHEMA_VERSION = "2.7"


@dataclass(frozen=True)
class ProbeResult:
    """The headline number of a probe and how it was obtained.

    stderr is None when nothing was sampled; error_bound is None when no iteration stopped at
    a tolerance; the value is exact when both are. seed is None when no randomness was used. `details` holds everything else (per-layer parts, counts …)
    and must be JSON-serialisable.
    """

    probe: str
    value: float | None
    stderr: float | None
    matvecs: int  # curvature (Hessian/GGN) products; other work is counted in `details`
    seconds: float
    seed: int | None = None
    label: str = ""  # what `value` is, e.g. "Tr(H)"
    notes: str = ""  # one human-readable line for tables
    details: dict[str, Any] = field(default_factory=dict)
    # degrees of freedom of `stderr` when it is a sample standard deviation over few draws
    # (intervals then take Student's t); None: a normal interval
    dof: int | None = None
    # False when an iteration stopped short of its own stopping rule (lmax not converged): the
    # value is where the iteration was, neither exact nor with an error bar, and no gate
    # decides on it
    resolved: bool = True
    # |value − the quantity| ≤ error_bound for a value an iteration stopped within its tolerance
    # (a Lanczos residual): a bound, not a standard error, and not exact either
    error_bound: float | None = None

    @property
    def exact(self) -> bool:
        return self.stderr is None and self.error_bound is None and self.resolved

    def to_dict(self) -> dict[str, Any]:
        return {
            "probe": self.probe,
            "label": self.label,
            "notes": self.notes,
            "value": _finite(self.value),
            "stderr": _finite(self.stderr),
            "dof": self.dof,
            "error_bound": _finite(self.error_bound),
            "exact": self.exact,
            "resolved": self.resolved,
            "matvecs": self.matvecs,
            "seconds": round(self.seconds, 6),
            "seed": self.seed,
            "details": _jsonable(self.details),
        }


@dataclass(frozen=True)
class Report:
    meta: dict[str, Any]
    results: dict[str, ProbeResult]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            **_jsonable(self.meta),
            "results": {name: r.to_dict() for name, r in self.results.items()},
        }


def _finite(x: float | None) -> float | None:
    # JSON has no NaN/Inf, and a "nan" string in a number's place breaks every reader that
    # does arithmetic on it; null says "no number here" in a way each reader must handle.
    # Headline values never get here non-finite: api.run refuses them.
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return _finite(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return _jsonable(obj.item())
    return obj
