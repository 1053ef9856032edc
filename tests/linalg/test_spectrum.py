"""Stochastic Lanczos quadrature, its density and plot, against dense float64 truth.

Moment estimates are checked within Z = 4 standard errors of their spread over start
vectors (the per-start values vᵀHv and ‖Hv‖² are Hutchinson draws; a z-bound of 4 has a
false-alarm rate below 1e-4 for a normal mean, and 16 starts keep the skew of ‖Hv‖² from
dominating). Node bounds allow float64 round-off scaled by ‖H‖; the density's integral is
allowed the Gaussian mass the grid cuts off plus the trapezoid rule's error.
"""

from __future__ import annotations

import functools
import math
import sys

import numpy as np
import pytest
import torch
from scipy.special import erfc

from tests.support.dense import DenseOperator, dense, make_case
from flatcheck.config import probe_requests
from flatcheck.errors import ConfigError
from flatcheck.linalg.slq import density, slq
from flatcheck.probes.registry import ProbeContext, create_probe

Z = 4.0
EPS = torch.finfo(torch.float64).eps
STARTS, STEPS = 16, 12


@functools.lru_cache(maxsize=None)
def dense_pair(kind: str):
    H, G = dense(make_case(kind))
    return {"hessian": H, "ggn": G}


@functools.lru_cache(maxsize=None)
def spectrum_run(kind: str, matrix: str, steps: int = STEPS, starts: int = STARTS):
    (req,) = probe_requests(["spectrum"], {"spectrum": {"matrix": matrix, "lanczos_steps": steps, "starts": starts}})
    return create_probe("spectrum").run(ProbeContext(make_case(kind).backend(), seed=0), req.options)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("matrix", ["hessian", "ggn"])
def test_moments_within_spread_of_start_vectors(kind, matrix):
    M = dense_pair(kind)[matrix]
    r = spectrum_run(kind, matrix)
    d = r.details
    tr, tr2 = d["trace"], d["trace_sq"]
    assert abs(tr["value"] - M.trace().item()) <= Z * tr["stderr"]
    assert abs(tr2["value"] - (M @ M).trace().item()) <= Z * tr2["stderr"]
    # the reported numbers are the means of the per-start ones
    per = d["per_start"]
    assert tr["value"] == pytest.approx(np.mean([p["trace"] for p in per]), rel=1e-12)
    assert r.value == pytest.approx(math.sqrt(tr2["value"]), rel=1e-12)
    assert d["mean_eigenvalue"]["value"] == pytest.approx(tr["value"] / M.shape[0], rel=1e-12)
    assert r.matvecs == STARTS * (STEPS + 1) and r.seed == 0  # one product more a start: its deflated rest and d["bn_mode"] == "eval"


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("matrix", ["hessian", "ggn"])
def test_nodes_lie_inside_the_spectrum_and_weights_sum_to_one(kind, matrix):
    M = dense_pair(kind)[matrix]
    eigs = torch.linalg.eigvalsh(M)
    norm = eigs.abs().max().item()
    slack = M.shape[0] * EPS * norm  # round-off of two float64 evaluations of H and of T
    d = spectrum_run(kind, matrix).details
    for p in d["per_start"]:
        nodes, weights = np.array(p["nodes"]), np.array(p["weights"])
        assert eigs[0].item() - slack <= nodes.min() and nodes.max() <= eigs[-1].item() + slack
        assert np.all(weights >= 0) and abs(weights.sum() - 1) <= len(weights) * EPS
    # the largest node converges fastest: 12 steps already pin λmax (Kaniel–Paige)
    assert d["spectral_norm"] <= norm + slack and d["spectral_norm"] >= 0.99 * norm


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_without_the_basis_the_moments_are_those_of_the_first_step(kind):
    """The three-term recurrence (no basis kept) has the same α₁, β₁ from the same start
    vector, so each start's Tr and Tr² agree with the re-orthogonalised run's to round-off,
    and its early nodes (before orthogonality is lost) with the full run's nodes."""
    H = dense_pair(kind)["hessian"]
    runs = {flag: slq(DenseOperator(H), steps=6, starts=4, generator=torch.Generator().manual_seed(5),
                      reorthogonalise=flag) for flag in (True, False)}
    for power in (1, 2):
        np.testing.assert_allclose(runs[False].moment(power), runs[True].moment(power), rtol=1e-10)
    norm = torch.linalg.eigvalsh(H).abs().max().item()
    for a, b in zip(runs[True].rules, runs[False].rules):
        np.testing.assert_allclose(b.nodes, a.nodes, rtol=0, atol=1e-8 * norm)


def test_spectrum_without_reorthogonalisation_against_dense_truth():
    M = dense_pair("mlp")["hessian"]
    (req,) = probe_requests(["spectrum"], {"spectrum": {"lanczos_steps": STEPS, "starts": STARTS, "reorth": "none"}})
    r = create_probe("spectrum").run(ProbeContext(make_case("mlp").backend(), seed=0), req.options)
    tr, tr2 = r.details["trace"], r.details["trace_sq"]
    assert abs(tr["value"] - M.trace().item()) <= Z * tr["stderr"]
    assert abs(tr2["value"] - (M @ M).trace().item()) <= Z * tr2["stderr"]
    assert r.details["memory"]["reorthogonalization"] == "none" and r.matvecs == STARTS * STEPS


def test_density_integrates_to_one():
    d = spectrum_run("cnn", "hessian").details["density"]
    grid, values, sigma = np.array(d["grid"]), np.array(d["values"]), d["sigma"]
    h = grid[1] - grid[0]
    assert sigma / h >= 4  # the grid resolves every kernel
    # cut-off: the grid reaches 6σ past the outermost nodes; trapezoid error for a Gaussian
    # sampled every h is ≈ 2·exp(−2π²(σ/h)²) (Poisson summation); plus summation round-off
    tol = erfc(6 / math.sqrt(2)) + 2 * math.exp(-2 * math.pi**2 * (sigma / h) ** 2) + len(grid) * EPS
    assert abs(np.trapezoid(values, grid) - 1) <= tol
    assert values.min() >= 0


def test_breakdown_gives_the_exact_rule():
    """Four distinct eigenvalues: the Krylov space closes after 4 steps, the nodes are the
    eigenvalues and every moment is exact per start vector, vᵀAᵖv·P/‖v‖²."""
    n = 60
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    eig = torch.tensor([-1.0, 0.5, 2.0, 7.0], dtype=torch.float64).repeat_interleave(15)
    A = Q @ torch.diag(eig) @ Q.T
    res = slq(DenseOperator(A), steps=30, starts=3, generator=torch.Generator().manual_seed(1))
    assert res.matvecs == 12
    for rule in res.rules:
        assert rule.invariant and rule.steps == 4
        assert np.allclose(rule.nodes, [-1.0, 0.5, 2.0, 7.0], rtol=0, atol=1e3 * EPS * 7)
    from flatcheck.linalg.random import rademacher_signs

    gen = torch.Generator().manual_seed(1)
    for rule, m3 in zip(res.rules, res.moment(3)):
        v = rademacher_signs(1, n, gen, device="cpu")[0].to(torch.float64)  # slq's start vector
        assert m3 == pytest.approx((v @ A @ A @ A @ v).item(), rel=1e-10)


def test_explicit_sigma_is_used():
    res = slq(DenseOperator(torch.diag(torch.arange(1.0, 41.0, dtype=torch.float64))), steps=10, starts=2,
              generator=torch.Generator().manual_seed(0))
    dens = density(res, 0.5)
    assert dens.sigma == 0.5
    assert abs(np.trapezoid(dens.values, dens.grid) - 1) <= erfc(6 / math.sqrt(2)) + len(dens.grid) * EPS
    with pytest.raises(ValueError, match="grid points"):
        density(res, 1e-6)


# -- options and the plot ------------------------------------------------------------------------

@pytest.mark.parametrize("opts,flag", [({"lanczos_steps": 1}, "--lanczos-steps"), ({"starts": 1}, "--starts"),
                                       ({"sigma": -1.0}, "--sigma"), ({"plot": "esd.txt"}, "--plot")])
def test_spectrum_options_are_validated(opts, flag):
    """The CLI's words name the flag (Python callers get the keyword: errors.setting)."""
    from flatcheck.settings import flag_of

    with pytest.raises(ConfigError) as caught:
        probe_requests(["spectrum"], {"spectrum": opts})
    assert flag in caught.value.worded(flag_of)


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ConfigError, match=r"--plot needs matplotlib: pip install 'flatcheck\[plot\]'"):
        probe_requests(["spectrum"], {"spectrum": {"plot": str(tmp_path / "esd.png")}})


def test_plot_is_a_png_with_log_density(tmp_path):
    from matplotlib.image import imread

    path = tmp_path / "esd.png"
    (req,) = probe_requests(["spectrum"], {"spectrum": {"lanczos_steps": 10, "starts": 2, "plot": str(path)}})
    r = create_probe("spectrum").run(ProbeContext(make_case("cnn", bn_mode="train").backend(), seed=0), req.options)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    img = imread(path)
    assert img.ndim == 3 and img.shape[2] in (3, 4) and img.shape[0] > 300 and img.shape[1] > 500
    # something was drawn: not a blank canvas
    assert img[..., :3].std() > 0.05
    assert r.details["plot"] == str(path) and "bn train" in r.notes and r.details["bn_mode"] == "train"
    assert [p.name for p in tmp_path.iterdir()] == ["esd.png"]  # no temporary file left behind


def test_a_budget_cut_spectrum_is_unresolved_and_smooths_nothing(tmp_path, monkeypatch):
    """A deadline already past leaves each start two Lanczos steps of the 40 asked for: the
    result says it is unresolved in the JSON, the table and the figure, gives no smoothed
    density (a bell over two nodes would put mass where no node is), and draws the nodes."""
    import time

    import flatcheck.probes.spectrum as spectrum
    from flatcheck.report.render import fmt_result

    drawn = {}
    real_plot_nodes = spectrum.plot_nodes

    def plot_nodes(path, nodes, weights, **kw):
        drawn.update(nodes=nodes, weights=weights, **kw)
        real_plot_nodes(path, nodes, weights, **kw)

    monkeypatch.setattr(spectrum, "plot_nodes", plot_nodes)
    monkeypatch.setattr(spectrum, "plot_density", lambda *a, **k: pytest.fail("smoothed an unresolved rule"))
    path = tmp_path / "esd.png"
    (req,) = probe_requests(["spectrum"], {"spectrum": {"lanczos_steps": 40, "starts": 2, "plot": str(path)}})
    r = create_probe("spectrum").run(ProbeContext(make_case("mlp").backend(), seed=0, deadline=time.monotonic()),
                                     req.options)
    d = r.details
    assert d["steps_taken"] == [2, 2] and d["stop_reason"] == "budget"
    assert not r.resolved and r.to_dict()["resolved"] is False and not r.exact
    assert "--budget cut the Lanczos rules to 2 of 40 steps" in d["unresolved_reason"]
    assert "UNRESOLVED" in r.notes and "(unresolved)" in fmt_result(r.value, r.stderr, r.resolved)
    assert d["density"]["values"] is None and d["density"]["sigma"] is None and d["density"]["null_reason"]
    assert "UNRESOLVED" in drawn["title"] and "2 of 40 steps" in drawn["note"]
    assert sorted(drawn["nodes"].tolist()) == sorted(n for s in d["per_start"] for n in s["nodes"])
    assert drawn["weights"].sum() == pytest.approx(1.0, rel=1e-12)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the moments stay unbiased from two nodes on: within the starts' spread of dense truth
    H = dense_pair("mlp")["hessian"]
    from scipy.stats import t

    assert abs(d["trace"]["value"] - H.trace().item()) <= t.ppf(0.995, 1) * d["trace"]["stderr"]  # 99 %, 1 dof
