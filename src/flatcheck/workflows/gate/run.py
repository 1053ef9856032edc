"""A gate run: the probes on one model, the verdicts, reruns with more effort where a rule's
policy asks for them, and the outcome `flatcheck gate` prints and writes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ...probes.gating import gating_of
from ...report.result import ProbeResult
from .baseline import Baseline
from .checks import check_baseline
from .config import GateConfig
from .verdicts import Check, as_dicts, evaluate


def effort_option(probe: str, result: Any = None, field: str | None = None) -> str | None:
    """The option that buys a rule on `field` more samples, if the probe declares one (for
    `result`'s route, where the route decides which estimate is the headline)."""
    return gating_of(probe).effort(result, field)


def raise_effort(options: Any, names: Iterable[str], factor: float) -> Any:
    """`options` with each of the effort options `names` multiplied by `factor`."""
    more = {}
    for name in names:
        old = getattr(options, name)
        more[name] = type(old)(math.ceil(old * factor)) if isinstance(old, int) else old * factor
    return dataclasses.replace(options, **more)


def decide_with_reruns(gate: GateConfig, results: dict[str, ProbeResult], options: dict[str, Any],
                       rerun: Callable[[dict[str, Any]], dict[str, ProbeResult]],
                       baseline: Mapping[str, Any] | None = None, confidence: float | None = None,
                       no_baseline: bool = False,
                       rerun_baseline: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
                       ) -> tuple[list[Check], dict[str, ProbeResult]]:
    """Evaluate, and while rules with policy rerun are inconclusive, rerun their probes with
    more effort. `rerun({probe: options})` returns the new results of those probes.

    A paired comparison gains from a rerun only if both sides draw the new probes:
    `rerun_baseline({probe: options})` re-measures the baseline's model with the same options
    (None when its checkpoint is not at hand). Without it, pairing extends only over the
    probe values the baseline report holds, and a check paired over all of them is not rerun.
    """
    results, options = dict(results), dict(options)
    baseline = dict(baseline) if baseline is not None else None
    checks = evaluate(gate, results, baseline, confidence, no_baseline=no_baseline)
    reruns: dict[str, int] = {}
    remeasured: set[str] = set()

    def effort_of(c: Check) -> str | None:  # the option a rerun raises for this check's rule
        return effort_option(c.bound.probe, results.get(c.bound.probe), c.bound.path)

    def wanted() -> dict[str, Any]:
        names: dict[str, set[str]] = {}  # per probe, the effort options its inconclusive rules need
        for c in checks:
            stuck = c.capped and rerun_baseline is None  # paired over all the baseline's values
            if c.verdict == "inconclusive" and c.bound.inconclusive == "rerun" and not stuck:
                name = effort_of(c)
                if name is not None:
                    names.setdefault(c.bound.probe, set()).add(name)
        return {p: raise_effort(options[p], sorted(names[p]), gate.effort_factor) for p in sorted(names)}

    for _ in range(gate.max_reruns):
        more = wanted()
        paired = {c.bound.probe for c in checks if c.paired is not None and c.bound.probe in more}
        if paired and rerun_baseline is not None and baseline is not None:
            again = rerun_baseline({p: more[p] for p in sorted(paired)})
            if again is None:  # its checkpoint is not at hand: pairing stays within its values
                rerun_baseline = None
                more = wanted()
            else:
                baseline.update(as_dicts(again))
                remeasured |= paired
        if not more:
            break
        results.update(rerun(more))
        options.update(more)
        for p in more:
            reruns[p] = reruns.get(p, 0) + 1
        checks = evaluate(gate, results, baseline, confidence, no_baseline=no_baseline)
    for c in checks:
        if c.bound.probe in remeasured and c.paired is not None:
            c.message = f"{c.message}; baseline re-measured from its checkpoint"
    for c in checks:
        c.reruns = reruns.get(c.bound.probe, 0)
        if c.verdict == "inconclusive" and c.bound.inconclusive == "rerun":
            why = ("no effort option" if effort_of(c) is None
                   else "the baseline's last probe value was paired" if c.capped else f"{c.reruns} reruns")
            c.message = f"still inconclusive after {why}; counted as failed; {c.message}"
        elif c.reruns:
            # the verdict is the rerun's: a reader of the table or summary must not take it for
            # the first run's, nor miss that the first run was inconclusive
            name = effort_of(c)
            c.message = (f"{c.bound.probe} rerun {c.reruns}× ({name} {getattr(options[c.bound.probe], name, '?')}) "
                         f"after an inconclusive rule" + (f"; {c.message}" if c.message else ""))
    return checks, results


@dataclass
class GateOutcome:
    """What `flatcheck gate` prints and writes: the checks and the (final) report."""

    checks: list[Check]
    report: Any  # report.result.Report with the results after reruns
    confidence: float
    source: str = ""
    files: dict[str, str] = field(default_factory=dict)
    baseline: str = ""  # the baseline in words (file, its checkpoint), "" without one

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.checks)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def skipped_relative(self) -> list[Check]:
        """Relative rules left undecided (no baseline, or a baseline without their probe)."""
        return [c for c in self.checks if c.bound.relative and c.verdict == "skipped"]

    def skip_words(self) -> str:
        """`2 of 4 relative rules skipped (baseline has no PROBE result)`, "" when none was: a
        pass with rules undecided is not a plain pass, and every output says so beside it."""
        skipped = self.skipped_relative
        if not skipped:
            return ""
        relative = sum(c.bound.relative for c in self.checks)
        probes = ", ".join(dict.fromkeys(c.bound.probe for c in skipped))
        why = f"baseline has no {probes} result" if self.baseline else "--no-baseline"
        return f"{len(skipped)} of {relative} relative rule{'s' if relative != 1 else ''} skipped ({why})"

    @property
    def verdict(self) -> str:
        """PASSED or FAILED, and the skipped relative rules if any."""
        return " · ".join(w for w in ("PASSED" if self.passed else "FAILED", self.skip_words()) if w)

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "inconclusive": 0, "skipped": 0}
        for c in self.checks:
            out[c.verdict] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        # the report's own keys stay at the top, so a gate's JSON can be the next --baseline
        return {**self.report.to_dict(),
                "gate": {"passed": self.passed, "verdict": self.verdict, "confidence": self.confidence,
                         "config": self.source, "counts": self.counts(),
                         "skipped_relative": [c.bound.name for c in self.skipped_relative],
                         "checks": [c.to_dict() for c in self.checks]}}

    def render(self, console) -> None:
        from ...report.gate_formats import rules_heading, rules_table

        console.print(rules_heading(self), highlight=False)
        console.print(rules_table(self))


def follow_baseline(config, gate: GateConfig, baseline: Baseline):
    """The run config with the baseline's choices where the gate chose its own (each probe's
    declaration says which: the route of a total when both runs draw the same probes, so that an
    unchanged model reproduces the baseline's per-probe values exactly, not only to the
    round-off between two routes; an estimator route always)."""
    from ...config import ProbeRequest

    requests = []
    for req in config.probes:
        base = baseline.results.get(req.name) or {}
        chosen = frozenset(key.partition(".")[2] for key in gate.defaulted if key.partition(".")[0] == req.name)
        options = gating_of(req.name).follow(req.options, base, base.get("seed") == config.seed, chosen)
        requests.append(ProbeRequest(req.name, options) if options is not req.options else req)
    return dataclasses.replace(config, probes=tuple(requests))


def _baseline_rerun(config, baseline: Baseline, progress) -> Callable[[dict[str, Any]], dict | None]:
    """Re-measure the baseline's model with more probes (for a paired rerun): its checkpoint,
    if the file its report names is still there with the same sha256, under this run's spec,
    data and seed (check_baseline has made sure they describe the same model and samples).
    Opened on first use; None from the callable when the checkpoint is not at hand."""
    from ... import api
    from ...config import ProbeRequest
    from ...models.checkpoint import file_sha256

    state: dict[str, Any] = {}

    def rerun(more: dict[str, Any]) -> dict | None:
        if "session" not in state:
            ck = baseline.meta.get("checkpoint") or {}
            path = Path(ck["path"]) if isinstance(ck, dict) and isinstance(ck.get("path"), str) else None
            same = path is not None and path.is_file() and file_sha256(path) == ck.get("sha256")
            state["config"] = dataclasses.replace(config, checkpoint=path) if same else None
            state["session"] = api.open_session(state["config"]) if same else None
        if state["session"] is None:
            return None
        again = dataclasses.replace(state["config"], probes=tuple(ProbeRequest(p, o) for p, o in more.items()))
        return api.run(again, progress, state["session"]).results

    return rerun


def run_gate(config, gate: GateConfig, *, baseline: Baseline | None = None, confidence: float | None = None,
             progress=None, allow_foreign: bool = False) -> GateOutcome:
    """Run the gate's probes on one model (RunConfig), decide, rerun where asked. Without a
    baseline, relative rules are skipped (the caller asked for that: --no-baseline)."""
    import datetime
    import warnings

    from ... import api
    from ...config import ProbeRequest
    from ...report.result import Report

    if baseline is not None:
        config = follow_baseline(config, gate, baseline)
    session = api.open_session(config)
    if baseline is not None:
        now = datetime.datetime.now(datetime.timezone.utc)
        skipped = check_baseline(gate, baseline, api._meta(session, now, 0.0), seed=config.seed,
                                 confidence=confidence, allow_foreign=allow_foreign)
        for bound in skipped:  # before the run: a CI log shows it even if the job is cut short
            warnings.warn(f"rule {bound.name} is skipped: {baseline.where} has no {bound.probe} result (a probe "
                          "added since it was made); remake the baseline to decide it")
    report = api.run(config, progress, session)
    options = {r.name: r.options for r in config.probes}

    def rerun(more: dict[str, Any]) -> dict[str, ProbeResult]:
        again = dataclasses.replace(config, probes=tuple(ProbeRequest(p, o) for p, o in more.items()))
        return api.run(again, progress, session).results

    checks, results = decide_with_reruns(gate, report.results, options, rerun,
                                         None if baseline is None else baseline.results, confidence,
                                         no_baseline=baseline is None,
                                         rerun_baseline=None if baseline is None else
                                         _baseline_rerun(config, baseline, progress))
    final = Report(meta=report.meta, results=results)
    return GateOutcome(checks, final, confidence if confidence is not None else gate.confidence, gate.source,
                       baseline="" if baseline is None else _baseline_words(baseline))


def _baseline_words(baseline: Baseline) -> str:
    """`release.json, of model.safetensors (sha256 1a2b3c4d5e6f)`: the file and what it measured."""
    from ...report.gate_formats import checkpoint_words

    name = Path(baseline.where.removeprefix("--baseline ")).name
    return f"{name}, of {checkpoint_words(baseline.meta)}"
