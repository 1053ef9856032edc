"""A paired relative rule on a trace whose vᵀHv are skewed: the comparison's interval is the
per-probe differences' spread widened for their skewness (Gating.paired_stderr), as the value's
own interval is. Checked against the exact traces of dense matrices."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import binom

from flatcheck.linalg.random import SIGN_STREAM, rademacher_signs
from flatcheck.linalg.trace import INTERVAL_SKEW, interval_stderr, skew_widening, skewness
from flatcheck.report.result import ProbeResult
from flatcheck.workflows.gate.config import parse_gate_config
from flatcheck.workflows.gate.verdicts import evaluate

RULE = parse_gate_config({"rules": [{"field": "trace.value", "max_increase": "20%"}]})


def matrices(top: float = 30.0, shrink: float = 0.3, dim: int = 60) -> tuple[torch.Tensor, torch.Tensor]:
    """B: a bulk of small eigenvalues and one of `top` (most of ‖B‖_F², so vᵀBv is right-skewed);
    C: the same eigenvectors with that eigenvalue times `shrink` and the bulk grown so that
    Tr C = 1.2·Tr B exactly. C − 1.2·B is then dominated by one negative direction: its vᵀ(·)v
    are left-skewed, and a run that misses their tail sits above the truth, 0."""
    g = torch.Generator().manual_seed(5)
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))
    bulk = 0.2 + 0.8 * torch.rand(dim - 1, generator=g, dtype=torch.float64)
    lam_b = torch.cat([torch.tensor([top], dtype=torch.float64), bulk])
    grow = (1.2 * lam_b.sum() - shrink * top) / bulk.sum()
    lam_c = torch.cat([torch.tensor([shrink * top], dtype=torch.float64), grow * bulk])
    return (q * lam_b) @ q.T, (q * lam_c) @ q.T


def traced(values: torch.Tensor, seed: int) -> dict:
    """A Hutchinson trace result as the probe reports it where only vᵀHv exists (INTERVAL_SKEW)."""
    n = values.shape[0]
    spread = values.std().item() / math.sqrt(n)
    details = {"probe_values": values.tolist(), "offset": 0.0, "estimator": "hutchinson", "matrix": "hessian",
               "sign_stream": SIGN_STREAM, "interval": INTERVAL_SKEW, "spread_stderr": spread,
               "skewness": skewness(values)}
    return ProbeResult("trace", values.mean().item(), interval_stderr(spread, values), n, 0.0, seed=seed,
                       details=details, dof=n - 1).to_dict()


def paired_checks(B: torch.Tensor, C: torch.Tensor, m: int, seeds: int):
    """The gate's check of C against the baseline B, each seed's m probes shared by both."""
    for seed in range(seeds):
        S = rademacher_signs(m, B.shape[0], torch.Generator().manual_seed(seed), device="cpu").double()
        b, c = ((S @ B) * S).sum(1), ((S @ C) * S).sum(1)
        (check,) = evaluate(RULE, {"trace": traced(c, seed)}, {"trace": traced(b, seed)})
        yield check, b, c


def false_fails(B: torch.Tensor, C: torch.Tensor, m: int, seeds: int) -> int:
    return sum(check.verdict == "fail" for check, _, _ in paired_checks(B, C, m, seeds))


def test_a_model_at_the_threshold_of_a_paired_rule_fails_it_no_more_often_than_nominal():
    """Tr C = 1.2·Tr B exactly: the model meets `max_increase: 20%`, and the verdict's interval
    of v − T should hold the true difference with the truth below it (a failure) in at most
    2.5 % of runs. On 400 seeds of 100 shared probes the bare t interval of the differences
    put it below in 20 (5 %), above the 99th percentile of 400 draws at 2.5 %; widened for
    the differences' skewness, in 11."""
    B, C = matrices()
    truth = (C.trace() - 1.2 * B.trace()).item()  # 0 up to round-off: the exact difference
    seeds, below, above = 400, 0, 0
    for check, b, c in paired_checks(B, C, 100, seeds):
        lo, hi = (x - check.threshold for x in check.ci)
        below += truth < lo
        above += truth > hi
        assert (check.verdict == "fail") == (lo > 0)
    allowed = binom.ppf(0.99, seeds, 0.025)
    assert below <= allowed, f"the truth below the interval in {below} of {seeds} runs"
    assert above <= allowed, f"the truth above the interval in {above} of {seeds} runs"


def test_the_paired_interval_is_the_differences_spread_widened_and_the_check_names_it():
    B, C = matrices()
    ((check, b, c),) = paired_checks(B, C, 30, 1)
    d = c - 1.2 * b
    spread = d.std().item() / math.sqrt(30)
    assert skew_widening(d) > 1.05  # the differences are skewed: widening changes the interval
    assert check.stderr == pytest.approx(spread * skew_widening(d), rel=1e-12)
    assert check.paired == 30 and f"interval {INTERVAL_SKEW} of the differences" in check.message
    assert check.to_dict()["message"] == check.message  # the JSON says which interval it was
    # values of an estimator whose interval is plain t keep the differences' bare spread
    plain = [traced(x, 0) for x in (c, b)]
    for res in plain:
        res["details"]["interval"] = "t"
    (bare,) = evaluate(RULE, {"trace": plain[0]}, {"trace": plain[1]})
    assert bare.stderr == pytest.approx(spread, rel=1e-12) and "interval t of" in bare.message


def test_an_unchanged_model_passes_a_paired_rule_at_every_seed():
    """C = B: v − T = −0.2·b̄ with error 0.2·s·widening, far from 0 at 100 probes."""
    B, _ = matrices()
    verdicts = {check.verdict for check, _, _ in paired_checks(B, B, 100, 100)}
    assert verdicts == {"pass"}


def test_a_baseline_from_before_the_interval_field_is_planned_as_it_will_be_decided():
    """A Hutchinson record of schema 2.4 names no details.interval, so the plan read it as a bare
    t interval while the verdict (the run's record) widened: the plan admitted baselines on
    which the unchanged model then came out inconclusive (a reviewer's replay: 189 of 900 at
    6–10 probes, with `inconclusive: fail` a failed gate). Planned as decided: every baseline
    the plan admits passes its unchanged model."""
    from flatcheck.workflows.gate import checks
    from flatcheck.workflows.gate.baseline import Baseline

    cfg = parse_gate_config({"rules": [{"field": "trace.value", "max_increase": "40%"}], "inconclusive": "fail"})
    B, _ = matrices(top=60.0)
    admitted = 0
    for seed in range(60):
        S = rademacher_signs(6, B.shape[0], torch.Generator().manual_seed(seed), device="cpu").double()
        values = ((S @ B) * S).sum(1)
        base = traced(values, seed)
        for key in ("interval", "spread_stderr", "skewness"):  # as schema 2.4 wrote it
            base["details"].pop(key)
        base["stderr"] = values.std().item() / math.sqrt(6)
        baseline = Baseline({"trace": base}, {"schema_version": "2.4", "seed": seed}, "--baseline old.json")
        try:
            checks._check_decidable(cfg.bounds[0], base["value"], base["stderr"], baseline, seed, 0.95, cfg)
        except Exception:  # noqa: BLE001  refused up front, with the probes it needs
            continue
        admitted += 1
        (check,) = evaluate(cfg, {"trace": traced(values, seed)}, {"trace": base})
        assert check.verdict == "pass", (seed, check.message)
    assert admitted >= 10  # the plan still admits the baselines that support the rule
