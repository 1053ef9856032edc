"""CI gates: rules on probe results, decided with the estimate's own uncertainty.

A rule bounds a field of a probe's result (a dotted path: `PROBE.value`,
`PROBE.details.KEY`) from above (`max`), from below (`min`), or relative to the same
field of a baseline report (`max_increase`, `max_decrease`).

Decision. An exact value (stderr None) is compared directly. A stochastic value v with
standard error s has the interval v ± q·s: q is Student's t quantile where the result says
how many draws its stderr came from (`dof`), else the normal one. The rule fails only when
the whole interval lies beyond the threshold, passes when the whole interval lies inside it,
and is inconclusive when the interval straddles it. An inconclusive rule then follows its
`inconclusive` policy: `pass`, `fail`, or `rerun` — rerun the probe with its effort option
(the option the probe declares for it) multiplied by `effort_factor`,
up to `max_reruns` times; still inconclusive after that counts as failed.

Baseline rules. With baseline value b and fraction x the threshold is T = slope·b with
slope = 1 ± x·sign(b) (b + x·|b| for max_increase, b − x·|b| for max_decrease, so that "20%
more" means the same thing for negative values); the test is on v − T.
- Paired, when both runs drew the same probe vectors (same seed and estimator, the per-probe
  values stored in both reports; see `pairing`): with per-probe values c_i and b_i and the
  parts known without sampling error o_c, o_b, v − T = (o_c − slope·o_b) + mean_i(c_i − slope·b_i),
  and its standard error is that of the per-probe differences, t with n − 1 degrees of
  freedom, their spread widened for their skewness where the probe widens its own values'
  (`Gating.paired_stderr`; the check's message names the interval). The probe-to-probe
  spread that both runs share cancels: an unchanged model gives c_i = b_i, so v − T = −x·|b|
  with error x·s_b, and the rule passes.
- Unpaired otherwise: σ = √(s² + slope²·s_b²) (the baseline's uncertainty moves the
  threshold), degrees of freedom by Welch–Satterthwaite.
A baseline is checked before any probe runs (`check_baseline`): it must hold results, each
filed under its own probe's key, every value a rule reads must be a finite number, it must come from the same model and data
(unless allowed), and its own error must leave the rule decidable at all.
A rule on a probe the baseline does not hold (a probe added since) is skipped, not failed, and
said (a warning, and the verdict counts it: "PASSED · 1 of 2 relative rules skipped"); a
baseline that holds none of the relative rules' probes decides nothing and is refused; a
field the baseline's result of that probe lacks is a misspelt rule (exit 2, before any probe
runs), and so is a max/min rule's where that result was measured with the gate's options. A
value its probe does not stand behind (an iteration short of its own tolerance, `unresolved`)
gets no verdict: exit 2, in the baseline or in the current run.

Modules: config (the gate file), statistics (quantiles, degrees of freedom, error bounds,
pairing), verdicts (one rule decided), baseline (the report compared with, its records),
checks (the baseline refused up front), run (the run, its reruns and outcome). Whatever is
particular to a probe comes from its gating declaration (flatcheck.probes.gating); this
package names no probe.
"""

from .baseline import IDENTITY, Baseline, foreign_fields, load_baseline
from .checks import check_baseline, check_coverage
from .config import BOUNDS, POLICIES, Bound, GateConfig, load_gate_config, parse_gate_config
from .run import GateOutcome, decide_with_reruns, effort_option, follow_baseline, raise_effort, run_gate
from .statistics import Pairing, error_bound, pairing, quantile
from .verdicts import Check, decide, evaluate, unresolved

__all__ = ["BOUNDS", "IDENTITY", "POLICIES", "Baseline", "Bound", "Check", "GateConfig", "GateOutcome", "Pairing",
           "check_baseline", "check_coverage", "decide", "decide_with_reruns", "effort_option", "error_bound",
           "evaluate", "follow_baseline", "foreign_fields", "load_baseline", "load_gate_config", "pairing",
           "parse_gate_config", "quantile", "raise_effort", "run_gate", "unresolved"]
