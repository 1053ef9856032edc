"""Rank degeneracy from SLQ against the exact rank of dense float64 matrices.

With N = 10 samples and C = 4 classes, rank(G) ≤ N·(C − 1) = 30 < P, so the GGN's null space
is known exactly (matrix_rank of the dense G). The probe's bracket (rank.py docstring,
Chebyshev–Markov–Stieltjes): E[D] lies between the null space's share (P − rank)/P and the
share of eigenvalues strictly inside the reported window; the test allows Z = 4 standard
errors over start vectors on either side. Eigenvalues within √eps·‖M‖ of a window end count
as on it (the precision of a Ritz value of an invariant subspace, see breakdown_threshold).
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

from tests.support.dense import dense, make_case
from flatcheck.config import probe_requests
from flatcheck.errors import ConfigError
from flatcheck.linalg.lanczos import breakdown_threshold
from flatcheck.probes.rank import count_neurons, input_positions, output_hessian_rank
from flatcheck.probes.registry import ProbeContext, create_probe

Z = 4.0
N = 10
STARTS = 8


@functools.lru_cache(maxsize=None)
def spectrum_of(kind: str, matrix: str):
    H, G = dense(make_case(kind, n=N))
    M = G if matrix == "ggn" else H
    return torch.linalg.eigvalsh(M), int(torch.linalg.matrix_rank(M)), M.shape[0]


def run_rank(kind: str, matrix: str, steps: int, loss: str = "cross_entropy"):
    (req,) = probe_requests(["rank"], {"rank": {"matrix": matrix, "lanczos_steps": steps, "starts": STARTS}})
    return create_probe("rank").run(ProbeContext(make_case(kind, n=N, loss=loss).backend(), seed=0), req.options)


def bracket(kind: str, matrix: str, r) -> tuple[float, float]:
    eigs, rank, P = spectrum_of(kind, matrix)
    lo, hi = r.details["window"]
    slack = breakdown_threshold(torch.float64) * eigs.abs().max().item()
    inside = ((eigs > lo + slack) & (eigs < hi - slack)).sum().item()
    return (P - rank) / P, inside / P


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_ggn_degeneracy_matches_exact_rank(kind):
    """More steps than rank(G) + 1: each start vector's Krylov space closes after rank + 1
    steps, the rule is exact and both ends of the bracket are the null space's share."""
    _, rank, P = spectrum_of(kind, "ggn")
    assert rank == N * 3  # generic: the batch bound N·(C − 1) is attained
    r = run_rank(kind, "ggn", steps=45)
    d = r.details
    # rank + 1 in exact arithmetic; a start with little weight on the smallest non-zero
    # eigenvalues (here 6e-5·‖G‖) can leave β just above √eps·‖T‖ at that step (seen: 1.9e-8
    # against a threshold of 1.6e-8 on one machine's BLAS), and one more step closes it
    assert all(s in (rank + 1, rank + 2) for s in d["steps_taken"]), d["steps_taken"]
    assert d["steps_taken"].count(rank + 1) >= STARTS - 1
    assert all(p["invariant"] and p["lower_bound_holds"] for p in d["per_start"])
    assert d["stop_reason"] == "closed"  # it said "steps" with fewer steps taken than asked (stranger test)
    null, upper = bracket(kind, "ggn", r)
    assert upper == null
    assert abs(r.value - (1 - rank / P)) <= Z * r.stderr
    assert r.stderr < 0.02  # the comparison above has teeth: a 2 % band, not "anything goes"


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_ggn_degeneracy_within_resolution_with_few_steps(kind):
    """Fewer steps than the rank: the origin node lumps small eigenvalues in with the null
    space, and the window says how many."""
    r = run_rank(kind, "ggn", steps=12)
    null, upper = bracket(kind, "ggn", r)
    assert upper > null  # the resolution is finite and matters here
    assert null - Z * r.stderr <= r.value <= upper + Z * r.stderr
    assert r.details["resolution"] == r.details["window"][1] > 0


def test_hessian_combines_two_nodes_within_resolution():
    r = run_rank("cnn", "hessian", steps=45)
    d = r.details
    assert d["origin_nodes"] == 2 and r.label == "degeneracy D(H)"
    lo, hi = d["window"]
    assert lo < 0 < hi and d["resolution"] == max(-lo, hi)
    null, upper = bracket("cnn", "hessian", r)
    assert upper + Z * r.stderr >= r.value
    if all(p["lower_bound_holds"] for p in d["per_start"]):
        assert r.value >= null - Z * r.stderr


def test_bounds_and_small_sample_warning():
    r = run_rank("mlp", "ggn", steps=12)
    d = r.details
    P = d["parameters"]
    # Linear(12,10), Linear(10,8), Linear(8,4): 22 neurons; input 1×3×4: 12 positions
    assert d["paper_bound"]["neurons"] == 22 and d["paper_bound"]["d_x"] == 12
    assert d["paper_bound"]["rank"] == 4 * 4 * (22 + 12)
    assert d["paper_bound"]["value"] == pytest.approx(1 - 544 / P) and d["paper_bound"]["vacuous"]
    assert d["batch_bound"]["value"] == pytest.approx(1 - N * 3 / P) and d["batch_bound"]["output_hessian_rank"] == 3
    assert "Σ out_features" in d["paper_bound"]["rule"]
    assert any("samples alone force" in w for w in d["warnings"]) and "WARNING" in r.notes
    assert d["bn_mode"] == "eval" and "bn eval" in r.notes
    assert r.value >= d["batch_bound"]["value"] - Z * r.stderr


def test_paper_neuron_count_for_vgg16():
    """001: VGG-16 has 13,416 neurons and 4·10·(13,416 + 1,024) = 577,600 on CIFAR-10."""
    channels = [64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512]
    convs, c_in = [], 3
    for c in channels:
        convs.append(nn.Conv2d(c_in, c, 3, padding=1, device="meta"))
        c_in = c
    head = [nn.Linear(512 * 7 * 7, 4096, device="meta"), nn.Linear(4096, 4096, device="meta"),
            nn.Linear(4096, 1000, device="meta")]
    neurons = count_neurons(nn.Sequential(*convs, *head))
    assert neurons == 13_416
    assert 4 * 10 * (neurons + input_positions((3, 32, 32))) == 577_600
    assert input_positions((784,)) == 784


def test_output_hessian_rank_per_loss():
    assert output_hessian_rank("cross_entropy", 10) == 9
    assert output_hessian_rank("label_smoothing", 10) == 9
    assert output_hessian_rank("mse", 10) == 10 and output_hessian_rank("sigmoid_mse", 10) == 10


def test_mse_ggn_rank_is_n_times_c():
    r = run_rank("cnn", "ggn", steps=45, loss="mse")
    P = spectrum_of("cnn", "ggn")[2]
    assert r.details["batch_bound"]["rank"] == N * 4
    assert r.details["steps_taken"] == [N * 4 + 1] * STARTS
    assert math.isclose(r.details["batch_bound"]["value"], 1 - N * 4 / P)


@pytest.mark.parametrize("opts,flag", [({"lanczos_steps": 1}, "--lanczos-steps"), ({"starts": 1}, "--starts"),
                                       ({"matrix": "fisher"}, "matrix")])
def test_rank_options_are_validated(opts, flag):
    """The CLI's words name the flag (Python callers get the keyword: errors.setting)."""
    from flatcheck.settings import flag_of

    with pytest.raises(ConfigError) as caught:
        probe_requests(["rank"], {"rank": opts})
    assert flag in caught.value.worded(flag_of)


def test_origin_nodes_within_round_off_of_zero_are_one_node():
    """A step on a residual just above the breakdown threshold leaves a weightless node beside
    the true origin node (seen on the cnn case: nodes at −4e-21 with weight 1e-19 and at
    2.5e-16 with weight 0.88); taking the nearest alone reported a null share of 1e-19."""
    import numpy as np

    from flatcheck.linalg.slq import Quadrature
    from flatcheck.probes.rank import origin_mass

    rule = Quadrature(np.array([-4e-21, 2.5e-16, 6e-5, 1.0]), np.array([1e-19, 0.88, 0.05, 0.07]), 4, True)
    m = origin_mass(rule, 1, zero_tol=1.5e-8)
    assert m.weight == pytest.approx(0.88, rel=1e-12) and m.window == (-math.inf, 6e-5) and m.lower_bound_holds
    # a node beyond the tolerance stays outside the block and bounds the window
    m = origin_mass(rule, 1, zero_tol=1e-16)
    assert m.weight == pytest.approx(1e-19) and m.window == (-math.inf, 2.5e-16)


def tanh_mlp_case(distinct: int, copies: int):
    """A tanh MLP 12→32→8→4 in float64 (P = 716) on N = distinct·copies samples. Copies of a
    sample add nothing to the GGN's rank, so its null share is 1 − distinct·3/P: the batch
    bound 1 − N·3/P is attained for copies = 1 and far below the truth otherwise."""
    from torch.utils.data import TensorDataset

    from tests.support.dense import Case
    from flatcheck.backends import ParamLayout
    from flatcheck.problem import Problem
    from flatcheck.data.batches import SampleSet
    from flatcheck.models.spec import LossSpec

    torch.manual_seed(3)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 8), nn.Tanh(),
                          nn.Linear(8, 4)).double()
    g = torch.Generator().manual_seed(3)
    X = torch.randn(distinct, 1, 3, 4, generator=g, dtype=torch.float64).repeat(copies, 1, 1, 1)
    Y = torch.randint(0, 4, (distinct,), generator=g).repeat(copies)
    samples = SampleSet(TensorDataset(X, Y), samples=len(X), batch_size=len(X), dtype=torch.float64)
    problem = Problem(model=model, loss=LossSpec("cross_entropy"), samples=samples,
                      layout=ParamLayout.from_model(model), bn_mode="eval")
    return Case(model, problem, X, Y)


@pytest.mark.parametrize("distinct, copies, steps", [(64, 1, 40), (16, 4, 12)],
                         ids=["64 samples", "16 samples 4 times"])
def test_degeneracy_error_covers_the_true_null_share(distinct, copies, steps):
    """40 steps cannot resolve the 192 (or 48) non-zero eigenvalues, the smallest 4e-6·‖G‖:
    the origin node takes in small ones with the null space. Before the stderr carried the
    bracket: D = 0.8103 ± 0.0076 against a null share of 0.7318 (10 standard errors)."""
    case = tanh_mlp_case(distinct, copies)
    _, G = dense(case)
    P = G.shape[0]
    rank = int(torch.linalg.matrix_rank(G))
    assert rank == distinct * 3
    truth = 1 - rank / P
    (req,) = probe_requests(["rank"], {"rank": {"matrix": "ggn", "lanczos_steps": steps, "starts": 8}})
    r = create_probe("rank").run(ProbeContext(case.backend(), seed=0), req.options)
    d = r.details
    print(f"D = {r.value:.4f} ± {r.stderr:.4f} (statistical {d['statistical_stderr']:.4f}), null share {truth:.4f}")
    assert not any(p["invariant"] for p in d["per_start"])  # the resolution is what is at stake
    assert d["stop_reason"] == "steps"
    assert r.value - truth > 3 * d["statistical_stderr"]  # the origin weight alone overstates it
    eps = 1e-12  # the batch bound is the bracket's low end, and attained for copies = 1
    assert abs(r.value - truth) <= 2 * r.stderr + eps
    assert d["bracket"]["low"] - eps <= truth <= d["bracket"]["high"] + eps
    assert d["bracket"]["low"] == pytest.approx(1 - distinct * copies * 3 / P, rel=1e-12)
    assert r.stderr == max(d["statistical_stderr"], d["bracket"]["half_width"])


def structured_mlp_case(dtype: torch.dtype):
    """8→6→3 tanh MLP (P = 75) on 48 samples: its GGN's null space is 7 directions that
    shift a class-independent amount into the logits (the output bias and each hidden unit's
    outgoing weights along the all-ones vector), 0.0933 of P. Rademacher shares of such a
    structured space are discrete (7/3 + 8K/3 over P, K ~ Bin(7, 1/4)), and the smallest
    non-zero eigenvalue is 5e-6·‖G‖: far below float32's breakdown threshold √eps·‖G‖."""
    from torch.utils.data import TensorDataset

    from tests.support.dense import Case
    from flatcheck.backends import ParamLayout
    from flatcheck.problem import Problem
    from flatcheck.data.batches import SampleSet
    from flatcheck.models.spec import LossSpec

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3)).to(dtype)
    X, Y = torch.randn(48, 8).to(dtype), torch.randint(0, 3, (48,))
    samples = SampleSet(TensorDataset(X, Y), samples=48, batch_size=48, dtype=dtype)
    problem = Problem(model=model, loss=LossSpec("cross_entropy"), samples=samples,
                      layout=ParamLayout.from_model(model), bn_mode="eval")
    return Case(model, problem, X, Y)


@functools.lru_cache(maxsize=None)
def structured_truth() -> float:
    case = structured_mlp_case(torch.float64)
    _, G = dense(case)
    rank = int(torch.linalg.matrix_rank(G))
    assert rank == 68
    return 1 - rank / G.shape[0]


def run_default_rank(case, seed: int):
    (req,) = probe_requests(["rank"], {"rank": {}})  # the defaults: 2 starts × 100 steps
    return create_probe("rank").run(ProbeContext(case.backend(), seed=seed), req.options)


@pytest.mark.parametrize("seed", [0, 1])
def test_float32_breakdown_above_round_off_is_not_exact(seed):
    """In float32 every start closed after 9 steps, with 61 % of P lumped into an origin node
    at λ ≈ 5e-5 (‖G‖ 0.54), and the rule was called exact: D = 0.325 ± 0.021 in a bracket
    [0.325, 0.325] where the share is 0.093."""
    truth = structured_truth()
    r = run_default_rank(structured_mlp_case(torch.float32), seed)
    d = r.details
    assert all(p["invariant"] for p in d["per_start"])  # the case still exercises an early breakdown
    assert not d["bracket"]["source"].startswith("exact") and "above round-off" in d["bracket"]["source"]
    assert "(--dtype float64 resolves smaller ones)" in d["bracket"]["source"]  # a finer dtype exists
    assert d["bracket"]["low"] <= truth <= d["bracket"]["high"]
    assert abs(r.value - truth) <= 2 * r.stderr


@pytest.mark.parametrize("dtype, advised", [(torch.float32, True), (torch.bfloat16, True), (torch.float64, False)])
def test_a_lumped_origin_advises_float64_only_where_the_run_is_not(dtype, advised):
    """`rank … --dtype float64` said "(--dtype float64 resolves smaller ones)" (stranger test):
    the run's dtype decides whether a finer one exists (kit.finer_dtype, as rank passes it)."""
    from flatcheck.probes.kit import finer_dtype
    from flatcheck.probes.rank import null_share_bracket

    source = null_share_bracket(0.3, False, None, lumped=4.5e-9, finer=finer_dtype(dtype)).source
    assert "too small to resolve in this dtype" in source
    assert ("--dtype float64" in source) == advised, source


@pytest.mark.parametrize("seed", range(4))
def test_exact_rule_error_counts_the_start_vectors_sampling(seed):
    """float64: each start's Krylov space truly closes (69 steps = rank + 1) and its share is
    exact for that start, but two starts can draw the same discrete share: seed 0 gave
    0.0667 ± 1.5e-13 and seed 1 0.1022 ± 1.2e-13 against 0.0933."""
    from flatcheck.probes.rank import sampling_stderr_bound

    truth = structured_truth()
    r = run_default_rank(structured_mlp_case(torch.float64), seed)
    d = r.details
    assert d["bracket"]["source"].startswith("exact") and d["steps_taken"] == [69, 69]
    bound = sampling_stderr_bound(r.value, P=75, starts=2)
    assert d["statistical_stderr_parts"]["bound"] == bound and r.stderr >= bound > 0.02
    assert abs(r.value - truth) <= Z * r.stderr


def test_spectrum_does_not_call_a_float32_breakdown_exact():
    """The same early float32 closure in spectrum's note: it said "found an invariant subspace
    (exact, fewer steps)" where nodes within √eps·‖H‖ had merged."""
    (req,) = probe_requests(["spectrum"], {"spectrum": {}})
    r = create_probe("spectrum").run(ProbeContext(structured_mlp_case(torch.float32).backend(), seed=0), req.options)
    assert "closed their Krylov space early (to √eps·‖H‖ in float32: nodes closer than that merge" in r.notes
    assert "exact" not in r.notes
    assert r.details["stop_reason"] == "closed"


def test_a_budget_cut_rank_says_the_budget_cut_its_steps():
    """The resolution warning said "raise --lanczos-steps (now 40)" when the budget had left 2."""
    import time

    (req,) = probe_requests(["rank"], {"rank": {"lanczos_steps": 40, "starts": 2}})
    r = create_probe("rank").run(ProbeContext(make_case("mlp").backend(), seed=0, deadline=time.monotonic()),
                                 req.options)
    assert r.details["steps_taken"] == [2, 2] and r.details["warnings"]
    assert "--budget cut the Lanczos rules to 2 of 40 steps" in r.notes
    assert "raise --lanczos-steps" not in r.notes and "raise --budget" in r.notes


def test_a_budget_cut_rank_is_unresolved_and_no_gate_decides_on_it():
    """Two of 100 steps left the origin unresolved (the window as wide as the largest node), yet
    the JSON said "resolved": true and the table "0.9995 ± 0.08": a D from two nodes is another
    quantity than a full run's, as a budget-cut spectrum's density is."""
    import time

    from flatcheck.report.render import fmt_result

    (req,) = probe_requests(["rank"], {"rank": {"lanczos_steps": 40, "starts": 2}})
    probe = create_probe("rank")
    r = probe.run(ProbeContext(make_case("mlp").backend(), seed=0, deadline=time.monotonic()), req.options)
    d = r.to_dict()
    assert r.details["stop_reason"] == "budget" and r.details["steps_taken"] == [2, 2]
    assert d["resolved"] is False and d["exact"] is False
    assert "--budget cut the Lanczos rules to 2 of 40 steps" in d["details"]["unresolved_reason"]
    assert "UNRESOLVED" in r.notes and "(unresolved)" in fmt_result(r.value, r.stderr, r.resolved)
    assert probe.gating.unresolved("rank", d).startswith("rank --budget cut the Lanczos rules")
    # a run its steps were not cut in stands behind its value
    full = probe.run(ProbeContext(make_case("mlp").backend(), seed=0), req.options).to_dict()
    assert full["resolved"] is True and "unresolved_reason" not in full["details"]
    assert probe.gating.unresolved("rank", full) is None
