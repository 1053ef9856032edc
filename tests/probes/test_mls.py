"""MLS family against dense jacrev Jacobians and their SVD; the MLS/NMLS bounds on a trained MLP."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import jacrev

from tests.support.dense import MODELS, make_case
from flatcheck.backends import ParamLayout, create_backend
from flatcheck.problem import Problem, model_mode
from flatcheck.data.batches import SampleSet
from flatcheck.data.preprocess import Preprocess
from flatcheck.data.registry import create_dataset
from flatcheck.models.spec import LossSpec
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options

EXACT = 1e-8


def run(backend, **opts):
    return create_probe("mls").run(ProbeContext(backend, seed=0), parse_options("mls", opts))


def tail_jacobians(model, H, start):
    """∂f/∂h for the input h of model[start] (a Sequential), one jacrev per sample: (N, C, dim h)."""
    tail = model[start:]
    with model_mode(model, "eval"):
        return torch.stack([jacrev(lambda h: tail(h.unsqueeze(0)).squeeze(0))(h) for h in H]).flatten(2)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_against_dense_svd(kind):
    case = make_case(kind)
    model, X = case.model, case.X
    J = tail_jacobians(model, X, 0)
    sv = torch.linalg.svdvals(J)
    lam = sv**2
    c, d = J.shape[1:]
    keep = sv > torch.finfo(torch.float64).eps * max(c, d) * sv[:, :1]
    d_ = run(case.backend()).details
    assert d_["mls"] == pytest.approx(sv[:, 0].mean().item(), rel=EXACT)
    assert d_["normalized_mls"] == pytest.approx((X.flatten(1).norm(dim=1) * sv[:, 0]).mean().item(), rel=EXACT)
    assert d_["log_volume"] == pytest.approx((sv.log() * keep).sum(1).mean().item(), rel=EXACT)
    assert d_["mean_rank"] == keep.sum(1).double().mean().item()
    ld = (lam.sum(1) ** 2 / (lam**2).sum(1)).mean().item()
    assert d_["local_dimensionality"] == pytest.approx(ld, rel=EXACT)
    # NMLS: the input of every Linear/Conv, with the rest of the Sequential as the map to f
    taps = [i for i, m in enumerate(model) if isinstance(m, (nn.Linear, nn.Conv2d))]
    nmls = 0.0
    with torch.no_grad(), model_mode(model, "eval"):
        inputs = {i: model[:i](X) for i in taps}
    for i in taps:
        sens = torch.linalg.matrix_norm(tail_jacobians(model, inputs[i], i), ord=2).mean().item()
        assert d_["per_layer"][str(i)]["sensitivity"] == pytest.approx(sens, rel=EXACT)
        nmls += sens
    assert d_["nmls"] == pytest.approx(nmls, rel=EXACT)
    if kind == "cnn":  # conv layers: no bound rather than a false one
        assert d_["mls_bound"] is None and d_["nmls_bound"] is None
        assert d_["per_layer"]["0"]["bound"] is None and d_["per_layer"]["7"]["bound"] is not None


def test_dense_bound_formula():
    case = make_case("mlp")
    model, X = case.model, case.X
    d_ = run(case.backend()).details
    lin = model[1]
    H = X.flatten(1)
    dz = tail_jacobians(model, lin(H), 2)  # ∂f/∂z for z = W_1 x + b
    grad_sq = dz.pow(2).sum((1, 2)) * H.pow(2).sum(1)
    bound = torch.linalg.matrix_norm(lin.weight.detach(), ord=2) * H.pow(2).sum(1).reciprocal().mean().sqrt() \
        * grad_sq.mean().sqrt()
    assert d_["mls_bound"] == pytest.approx(bound.item(), rel=EXACT)


def _trained_digits_mlp():
    data = create_dataset("digits", split="train", preprocess=Preprocess(input_size=(1, 8, 8)))
    samples = SampleSet(data, samples=256, batch_size=256, dtype=torch.float64)
    (batch,) = list(samples)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(),
                          nn.Linear(16, 10)).double()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(model(batch.x), batch.y).backward()
        opt.step()
    return model, samples, batch


def test_bounds_hold_on_trained_mlp():
    model, samples, batch = _trained_digits_mlp()
    with torch.no_grad():
        assert (model(batch.x).argmax(1) == batch.y).double().mean() > 0.9  # it did train
    problem = Problem(model, LossSpec(), samples, ParamLayout.from_model(model))
    for output in ("logits", "softmax"):
        d_ = run(create_backend("autograd", problem), output=output).details
        assert d_["mls"] <= d_["mls_bound"]
        assert d_["nmls"] <= d_["nmls_bound"]
        for layer in d_["per_layer"].values():
            assert layer["dense"] and layer["sensitivity"] <= layer["bound"]


# -- the matrix-free route against the exact one ------------------------------

Z = 4.0  # Hutchinson estimates: within 4 reported standard errors (a 6e-5 two-sided miss rate)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_estimate_route_within_its_reported_error(kind):
    case = make_case(kind)
    exact_result = run(case.backend(), method="exact")
    exact = exact_result.details
    # 3 Lanczos steps on C = 4 classes: not converged, so the error bounds are not zero
    est_result = run(case.backend(), method="estimate", lanczos_iters=3)
    est = est_result.details
    # the headline says which it is: exact, or within its bound (it said exact on both before)
    assert exact_result.exact and exact_result.error_bound is None
    assert not est_result.exact and est_result.to_dict()["exact"] is False and est_result.stderr is None
    assert est_result.error_bound == est["mls_error_bound"]
    assert abs(est_result.value - exact_result.value) <= est_result.error_bound
    assert exact["route"] == "exact" and est["route"] == "estimate"
    assert est["lanczos"]["unconverged"] > 0
    for key in ("mls", "normalized_mls", "nmls"):
        err = est[f"{key}_error_bound"]
        assert err > 0 and abs(est[key] - exact[key]) <= err, key
        assert est[key] <= exact[key] * (1 + 1e-12), key  # Ritz values approach σ² from below
    for name, layer in exact["per_layer"].items():
        e = est["per_layer"][name]
        assert abs(e["sensitivity"] - layer["sensitivity"]) <= e["sensitivity_error_bound"], name
        if layer["bound"] is not None:
            assert abs(e["bound"] - layer["bound"]) <= Z * e["bound_stderr"] + 1e-12 * layer["bound"], name
        else:
            assert e["bound"] is None
    assert abs(est["local_dimensionality"] - exact["local_dimensionality"]) <= Z * est["local_dimensionality_stderr"]
    J = tail_jacobians(case.model, case.X, 0)
    fro = J.pow(2).sum((1, 2)).mean().item()
    assert abs(est["frobenius_sq_mean"] - fro) <= Z * est["frobenius_sq_mean_stderr"]
    # what needs every singular value is null, with the reason
    assert est["log_volume"] is None and est["mean_rank"] is None and "singular value" in est["null_reason"]


def test_estimate_route_converged_to_tolerance():
    case = make_case("mlp")
    exact = run(case.backend(), method="exact").details
    est = run(case.backend(), method="estimate", lanczos_tol=1e-8).details
    assert est["lanczos"]["unconverged"] == 0 and est["lanczos"]["max_relative_residual"] <= 1e-8
    assert est["mls"] == pytest.approx(exact["mls"], rel=1e-7)
    assert est["mls_error_bound"] <= 1e-8 * est["mls"]


def test_auto_route_by_size():
    case = make_case("mlp")
    assert run(case.backend()).details["route"] == "exact"  # 4 classes
    wide = nn.Sequential(nn.Flatten(), nn.Linear(12, 200)).double()
    problem = Problem(wide, LossSpec(), case.problem.samples, ParamLayout.from_model(wide))
    d_ = run(create_backend("autograd", problem), lanczos_tol=1e-10).details
    assert d_["route"] == "estimate" and d_["route_reason"] == "auto: 200 classes > 128"
    assert run(case.backend(), method="estimate").details["route_reason"] == "method=estimate"
    # one linear layer: J = W for every sample, so σ_max(W) and ‖W‖²_F are the truth
    W = wide[1].weight.detach()
    assert d_["mls"] == pytest.approx(torch.linalg.matrix_norm(W, ord=2).item(), rel=1e-8)
    assert abs(d_["frobenius_sq_mean"] - W.pow(2).sum().item()) <= Z * d_["frobenius_sq_mean_stderr"]


def test_sigmoid_output_against_dense_svd():
    """output=sigmoid (Chen et al. 2023, App. F): J of sigmoid(f), checked against jacrev."""
    case = make_case("mlp")
    model, X = case.model, case.X
    with model_mode(model, "eval"):
        J = torch.stack([jacrev(lambda x: model(x.unsqueeze(0)).squeeze(0).sigmoid())(x) for x in X]).flatten(2)
    d_ = run(case.backend(), output="sigmoid").details
    assert d_["mls"] == pytest.approx(torch.linalg.matrix_norm(J, ord=2).mean().item(), rel=EXACT)


@pytest.mark.parametrize("method", ["exact", "estimate"])
def test_without_nmls_the_input_jacobian_quantities_are_unchanged(method):
    """nmls=false (the mls-vs-sharpness preset) skips every per-layer sensitivity, nearly all of
    the estimate route's cost on a deep model: MLS, normalized MLS and the local dimensionality
    are those of the full run (the input Jacobian's draws are the same), against dense truth,
    and NMLS and the per-layer bounds are null with the reason."""
    case = make_case("cnn")
    full = run(case.backend(), method=method, lanczos_iters=3).details
    lean = run(case.backend(), method=method, lanczos_iters=3, nmls=False).details
    for key in ("mls", "normalized_mls", "local_dimensionality"):
        assert lean[key] == pytest.approx(full[key], rel=1e-12), key
    sv = torch.linalg.svdvals(tail_jacobians(case.model, case.X, 0))
    truth = (case.X.flatten(1).norm(dim=1) * sv[:, 0]).mean().item()
    err = lean.get("normalized_mls_error_bound") or EXACT * truth
    assert abs(lean["normalized_mls"] - truth) <= err
    assert lean["nmls"] is None and lean["nmls_bound"] is None and lean["mls_bound"] is None
    assert lean["per_layer"] == {} and "nmls=false" in lean["nmls_reason"]
    assert run(case.backend(), method=method, nmls="false").details["nmls"] is None  # -o mls.nmls=false


def test_budget_ends_the_sample_loop_and_the_result_says_over_how_many():
    """--budget spent: the matrix-free loop stops after the chunk in hand (it used to run every
    chunk, one Lanczos per sample and layer at a time, well past the budget on a ViT-B). The
    means are over the samples used, which the result names; it is not resolved, so no gate
    compares it with a run over all of them."""
    import time

    from flatcheck.workflows.gate import unresolved

    case = make_case("cnn")  # 23 samples in batches of 10, 10, 3
    ctx = ProbeContext(case.backend(), seed=0, deadline=time.monotonic() - 1)
    r = create_probe("mls").run(ctx, parse_options("mls", {"method": "estimate"}))
    d = r.details
    used = d["samples_used"]
    assert 1 <= used < 23 and d["samples_requested"] == 23 and d["stop_reason"] == "budget"
    assert r.resolved is False and f"after {used} of 23 samples" in r.notes
    X = case.X[:used]
    sv = torch.linalg.svdvals(tail_jacobians(case.model, X, 0))
    truth = (X.flatten(1).norm(dim=1) * sv[:, 0]).mean().item()
    assert abs(d["normalized_mls"] - truth) <= d["normalized_mls_error_bound"] + EXACT * truth
    assert f"after {used} of 23 samples" in unresolved(r.to_dict())


@pytest.mark.parametrize("probe, opts", [("jacobian", {"method": "exact"}), ("jacobian", {"method": "estimate"}),
                                         ("decomposition", {"method": "estimate"}),
                                         ("decomposition", {"method": "exact"}), ("mls", {"method": "exact"})])
def test_budget_ends_the_other_sample_loops_too(probe, opts):
    """Every per-sample loop, on both routes, stops after the chunk in hand once the budget is spent."""
    import time

    case = make_case("cnn")
    ctx = ProbeContext(case.backend(), seed=0, deadline=time.monotonic() - 1)
    r = create_probe(probe).run(ctx, parse_options(probe, opts))
    assert r.resolved is False and r.details["stop_reason"] == "budget"
    assert 1 <= r.details["samples_used"] < 23 and "of 23 samples" in r.notes
    full = create_probe(probe).run(ProbeContext(case.backend(), seed=0), parse_options(probe, opts))
    assert full.resolved is True and "samples_used" not in full.details
    if probe == "decomposition":
        # its comparison with Tr(G), which is over every sample, is not made on fewer
        assert r.details["relative_difference"] is None and "not compared" in r.notes
        assert f"first {r.details['samples_used']} of 23 samples" in r.details["relative_difference_null_reason"]
        assert full.details["relative_difference"] is not None


def test_a_bool_option_that_is_neither_says_what_it_accepts():
    from flatcheck.errors import ConfigError

    with pytest.raises(ConfigError, match=r"mls.nmls .*must be true or false .*got 'maybe'"):
        parse_options("mls", {"nmls": "maybe"})


@pytest.mark.parametrize("probe, opts", [("mls", {"method": "estimate"}), ("jacobian", {"method": "estimate"}),
                                         ("decomposition", {"method": "exact"})])
def test_budget_ends_a_loop_whose_samples_are_one_batch(probe, opts):
    """All 23 samples in one batch (a memory-sized chunk can hold them all): under a budget the
    probe still takes them in chunks, the first of one sample, so the budget can end the loop."""
    import time

    case = make_case("cnn", batch_size=23)
    ctx = ProbeContext(case.backend(), seed=0, deadline=time.monotonic() - 1)
    r = create_probe(probe).run(ctx, parse_options(probe, opts))
    assert r.resolved is False and r.details["samples_used"] == 1


def test_budget_chunks_are_sized_to_the_time_left(monkeypatch):
    """A sample of a large model can take minutes: after a first chunk of one sample, which
    times it, each chunk holds what the time left takes at that rate, never none and never
    more than BUDGET_CHUNK, so the budget is overrun by about one sample, not a chunk."""
    from flatcheck.probes import kit

    clock = [100.0]
    monkeypatch.setattr(kit.time, "monotonic", lambda: clock[0])
    backend = make_case("mlp").backend()
    budget = kit.SampleBudget(ProbeContext(backend, seed=0, deadline=130.0), "x")
    assert budget.chunk(64, 0) == 1
    clock[0] = 105.0  # 5 s a sample, 25 s left
    assert budget.chunk(64, 1) == 5
    clock[0] = 129.0  # 1 s left, less than a sample: one more, never none
    assert budget.chunk(64, 6) == 1
    clock[0] = 100.5  # a fast sample: the cap
    assert budget.chunk(64, 1) == kit.BUDGET_CHUNK and budget.chunk(3, 1) == 3
    assert kit.SampleBudget(ProbeContext(backend, seed=0), "x").chunk(64, 0) == 64


def test_a_budget_stop_is_told_to_the_progress_display():
    """The display's end line says "stopped by the budget" (ProgressRenderer.stopped), as for
    the iterative probes, instead of an ordinary "done": the stop is told, and no report before
    it says the loop complete (the display would end the line there). One batch holds every
    sample, so a report per chunk of "batch 1 of 1" would have."""
    import time

    class Listener:
        def __init__(self):
            self.events = []

        def __call__(self, desc, done, total, **_k):
            self.events.append(("progress", desc, done, total))

        def stopped(self, desc, reason):
            self.events.append(("stopped", desc, reason))

    for probe, opts, desc in (("mls", {"method": "estimate"}, "mls (estimate)"), ("mls", {"method": "exact"}, "mls"),
                              ("jacobian", {"method": "exact"}, "jacobian (exact)"),
                              ("jacobian", {"method": "estimate"}, "jacobian (estimate)"),
                              ("decomposition", {"method": "exact"}, "decomposition"),
                              ("decomposition", {"method": "estimate"}, "decomposition (estimate)")):
        listener = Listener()
        ctx = ProbeContext(make_case("cnn", batch_size=23).backend(), seed=0, progress=listener,
                           deadline=time.monotonic() - 1)
        create_probe(probe).run(ctx, parse_options(probe, opts))
        stops = [e for e in listener.events if e[0] == "stopped"]
        assert stops == [("stopped", desc, "budget")], (probe, opts)
        before = listener.events[:listener.events.index(stops[0])]
        assert not [e for e in before if e[1] == desc and e[3] and e[2] >= e[3]], (probe, opts, before)

@pytest.mark.parametrize("method", ["exact", "estimate"])
def test_a_missing_bound_carries_its_reason(method, monkeypatch):
    """"(bound n/a)" said nothing: the note and the JSON name the layer that rules the bound out."""
    conv = run(make_case("cnn").backend(), method=method, lanczos_iters=3)
    d = conv.details
    assert d["mls_bound"] is None and "first layer 0 is a Conv2d" in d["mls_bound_reason"]
    assert d["nmls_bound"] is None and "0 (Conv2d), 3 (Conv2d)" in d["nmls_bound_reason"]
    assert f"(bound n/a: {d['mls_bound_reason']})" in conv.notes
    dense = run(make_case("mlp").backend(), method=method, lanczos_iters=3).details
    assert dense["mls_bound"] is not None and dense["mls_bound_reason"] is None
    assert dense["nmls_bound"] is not None and dense["nmls_bound_reason"] is None
    torch.manual_seed(4)
    monkeypatch.setitem(MODELS, "squashed", lambda: nn.Sequential(nn.Flatten(), nn.Tanh(), nn.Linear(36, 4)).double())
    squashed = run(make_case("squashed").backend(), method=method, lanczos_iters=3).details
    assert squashed["mls_bound"] is None and "does not take the input x itself" in squashed["mls_bound_reason"]
    assert squashed["nmls_bound"] is not None  # its one layer is dense


@pytest.mark.parametrize("method", ["exact", "estimate"])
def test_a_linear_fed_a_sequence_is_named_with_its_input(method, monkeypatch):
    """A Linear over (N, T, D) (a transformer block's) was listed as "1 (Linear)" under "not every
    layer is dense": a Linear refused as not dense, with no word of why. The reason names the
    input it got against the one vector a sample the bound needs, and that MLS stands without it."""
    torch.manual_seed(5)
    monkeypatch.setitem(MODELS, "tokens", lambda: nn.Sequential(nn.Flatten(1, 2), nn.Linear(6, 5), nn.Tanh(),
                                                                nn.Flatten(), nn.Linear(30, 4)).double())
    r = run(make_case("tokens").backend(), method=method, lanczos_iters=3)
    d = r.details
    assert d["mls_bound"] is None and d["nmls_bound"] is None
    assert d["mls_bound_reason"].startswith(
        "the first layer 1 is a Linear fed (N, 6, 6), 6 vectors a sample, where the bound needs one, (N, 6): ")
    assert "MLS does not need the bound and stands as measured" in d["mls_bound_reason"]
    assert d["nmls_bound_reason"].startswith("not every layer is dense (1 (Linear fed (N, 6, 6))): ")
    assert d["per_layer"]["1"]["input_shape"] == [6, 6] and d["per_layer"]["4"]["input_shape"] == [30]
    assert d["per_layer"]["4"]["dense"] and d["per_layer"]["4"]["bound"] is not None
    assert f"(bound n/a: {d['mls_bound_reason']})" in r.notes
