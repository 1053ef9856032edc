"""Cross entropy's value, gradient and curvature on a saturated softmax, in float32.

Once 1 − p_y is below float32's eps (training accuracy 1, per-sample loss ~1e-8), torch's
F.cross_entropy keeps only round-off in its gradient (exp(log p_y) − 1) and in its second
derivatives (p⊙v − p(pᵀv)), and so did flatcheck's output Hessian: a stranger's float32 lmax
missed the dense float64 truth by 41× its bound. The truth here is the closed form
A = diag(p) − ppᵀ in float64 with 1 − p_j written as Σ_{k≠j} p_k: every entry a product or a
sum of terms of one sign, so it carries float64's relative accuracy at any saturation.

Tolerance: the float32 logits are taken as exact, so the products' error comes from rounding
z_j − z_m and exp (relative (|z_j − z_m| + 2)·eps/2 in each p_j, m the top class) and from the
sums of C terms; in norm that is within TOL(z) = 4·(C + max |z_j − z_m|)·eps32 (about 1e-5 at
the largest margins below), while the old formulas were off by 1e-2 to 1.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch.utils.data import TensorDataset

from flatcheck.backends import ParamLayout
from flatcheck.data.batches import SampleSet
from flatcheck.losses import apply_output_hessian, output_hessian_factors, per_sample_loss
from flatcheck.models.spec import LossSpec
from flatcheck.problem import Problem
from tests.support.dense import MODELS, Case, dense

EPS32 = torch.finfo(torch.float32).eps
C = 10
LOSSES = [LossSpec("cross_entropy"), LossSpec("label_smoothing", alpha=0.1)]


def _alpha(loss: LossSpec) -> float:
    return loss.alpha if loss.name == "label_smoothing" else 0.0


def saturated_logits(margin: float, n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 logits whose target class leads the others by `margin` ± a few units."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    z = 2 * torch.randn(n, C, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += margin
    return z.float(), y


def tolerance(z: torch.Tensor) -> float:
    gap = (z.max(-1, keepdim=True).values - z).abs().max().item()
    return 4 * (C + gap) * EPS32


def closed_form(z: torch.Tensor, y: torch.Tensor, loss: LossSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, gradient, A) in float64 from float32 logits, without a difference of near-equal numbers."""
    z = z.double()
    e = torch.exp(z - z.max(-1, keepdim=True).values)
    p = e / e.sum(-1, keepdim=True)
    off = 1 - torch.eye(C, dtype=z.dtype)
    rest = p @ off  # rest_j = Σ_{k≠j} p_k = 1 − p_j
    A = -p.unsqueeze(-1) * p.unsqueeze(-2) * off + torch.diag_embed(p * rest)
    alpha, hot = _alpha(loss), F.one_hot(y, C).bool()
    t = (1 - alpha) * hot.double() + alpha / C
    # p_y − t_y = −(1 − p_y) + α(1 − 1/C)
    grad = torch.where(hot, -rest + alpha * (1 - 1 / C), p - t)
    # −log p_j = log Σ_k exp(z_k − z_j) = log1p(rest_j / p_j)
    value = (t * torch.log1p(rest / p)).sum(-1)
    return value, grad, A


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def _products(fn, z: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradient and A v of Σ_n fn(z, y)_n by the routes the backends take (reverse mode,
    double backward, forward over reverse, and that per sample under vmap)."""
    zg = z.clone().requires_grad_()
    (g,) = torch.autograd.grad(fn(zg, y).sum(), zg, create_graph=True)
    (double_backward,) = torch.autograd.grad(g, zg, v)
    grad = torch.func.grad(lambda w, t: fn(w, t).sum())
    _, forward_over_reverse = torch.func.jvp(lambda w: grad(w, y), (z,), (v,))
    vmapped = torch.func.vmap(
        lambda zi, vi, yi: torch.func.jvp(lambda w: grad(w, yi[None]), (zi[None],), (vi[None],))[1][0])(z, v, y)
    return {"gradient": g.detach(), "double backward": double_backward,
            "forward over reverse": forward_over_reverse, "vmap": vmapped}


@pytest.mark.parametrize("loss", LOSSES, ids=lambda s: s.name)
@pytest.mark.parametrize("margin", [4.0, 18.0, 25.0, 40.0, 80.0])
def test_products_in_logit_space_keep_float32_accuracy(loss, margin):
    z, y = saturated_logits(margin)
    v = torch.randn(z.shape, generator=torch.Generator().manual_seed(1))
    _, grad, A = closed_form(z, y, loss)
    Av = torch.einsum("bjk,bk->bj", A, v.double())
    tol = tolerance(z)
    got = _products(lambda w, t: per_sample_loss(w, t, loss), z, y, v)
    assert _rel(got.pop("gradient"), grad) <= tol, margin
    for route, product in got.items():
        assert _rel(product, Av) <= tol, (route, margin)
    assert _rel(apply_output_hessian(z, y, loss, v), Av) <= tol
    U, lam = output_hessian_factors(z, y, loss)
    factored = torch.einsum("bck,bk,bdk,bd->bc", U.double(), lam.double(), U.double(), v.double())
    assert _rel(factored, Av) <= tol


@pytest.mark.parametrize("loss", LOSSES, ids=lambda s: s.name)
def test_the_old_formulas_fail_the_same_tolerance(loss):
    """The counter-example: torch's cross entropy and the difference p⊙u − p(pᵀu) that
    flatcheck used, on the same logits, miss by orders of magnitude (which is why the
    tolerance above says something)."""
    z, y = saturated_logits(25.0)
    v = torch.randn(z.shape, generator=torch.Generator().manual_seed(1))
    _, grad, A = closed_form(z, y, loss)
    Av = torch.einsum("bjk,bk->bj", A, v.double())
    tol = tolerance(z)
    got = _products(lambda w, t: F.cross_entropy(w, t, reduction="none", label_smoothing=_alpha(loss)), z, y, v)
    for route in ("double backward", "forward over reverse"):
        assert _rel(got[route], Av) > 1e3 * tol, route
    p = z.softmax(-1)
    assert _rel(p * v - p * (p * v).sum(-1, keepdim=True), Av) > 1e3 * tol
    if loss.name == "cross_entropy":  # the gradient's own cancellation: −(1 − p_y) ≈ 0
        assert _rel(got["gradient"], grad) > 1e3 * tol


@pytest.mark.parametrize("loss", LOSSES, ids=lambda s: s.name)
def test_value_and_gradient_equal_torch_on_unsaturated_logits(loss):
    g = torch.Generator().manual_seed(3)
    z = 3 * torch.randn(200, C, generator=g, dtype=torch.float64)
    y = torch.randint(0, C, (200,), generator=g)
    alpha = _alpha(loss)
    zg, zt = z.clone().requires_grad_(), z.clone().requires_grad_()
    ours, theirs = per_sample_loss(zg, y, loss), F.cross_entropy(zt, y, reduction="none", label_smoothing=alpha)
    assert torch.allclose(ours, theirs, rtol=1e-13, atol=0)
    ours.sum().backward()
    theirs.sum().backward()
    assert torch.allclose(zg.grad, zt.grad, rtol=0, atol=1e-14)
    assert per_sample_loss(z, y, loss).dtype == torch.float64


@pytest.mark.parametrize("loss", LOSSES, ids=lambda s: s.name)
def test_value_on_saturated_logits_is_more_accurate_than_torch(loss):
    z, y = saturated_logits(25.0)
    truth, _, _ = closed_form(z, y, loss)
    ours = per_sample_loss(z, y, loss)
    torch_ = F.cross_entropy(z, y, reduction="none", label_smoothing=_alpha(loss))
    assert _rel(ours, truth) <= tolerance(z)
    if loss.name == "cross_entropy":  # torch rounds log-sum-exp − z_y: ~1e-9 keeps no digit
        assert _rel(torch_, truth) > 1e3 * tolerance(z)


# ---------------------------------------------------------------- whole models, against dense float64

def saturated_case(kind: str, loss: float, dtype: torch.dtype, n: int = 24) -> Case:
    """A tiny model of tests.support.dense trained to accuracy 1 in effect: labels are its own
    predictions and its head is scaled until the mean loss is `loss`. The weights and inputs
    are rounded to float32 in both dtypes, so the float64 case is the float32 one exactly."""
    model = MODELS[kind]().eval()
    g = torch.Generator().manual_seed(0)
    shape = (n, 1, 3, 4) if kind == "mlp" else (n, 1, 6, 6)
    X = torch.randn(shape, generator=g, dtype=torch.float64)
    head = model[-1]
    with torch.no_grad():
        Y = model(X).argmax(-1)
        w, b = head.weight.clone(), head.bias.clone()
        lo, hi = 1.0, 1e4
        for _ in range(60):  # bisect the head's scale on log scale
            s = (lo * hi) ** 0.5
            head.weight.copy_(w * s)
            head.bias.copy_(b * s)
            lo, hi = (s, hi) if F.cross_entropy(model(X), Y).item() > loss else (lo, s)
    model, X = model.float().to(dtype), X.float().to(dtype)
    samples = SampleSet(TensorDataset(X, Y), samples=n, batch_size=n, dtype=dtype)
    problem = Problem(model=model, loss=LossSpec("cross_entropy"), samples=samples,
                      layout=ParamLayout.from_model(model), bn_mode="eval")
    return Case(model, problem, X, Y)


# A network's float32 products carry the forward's and backward's rounding on top of the
# loss's, some hundred eps in norm on these models (2.5e-6..4e-5 measured from loss 1e-4 to
# 1e-12); the cancelling loss was 4e-2..0.9 off at 1e-8 and 1e-12.
MODEL_TOL = 1e3 * EPS32


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("loss", [1e-8, 1e-12])
@pytest.mark.parametrize("backend", ["autograd", "func"])
def test_float32_products_of_a_saturated_model_match_dense_float64(kind, loss, backend):
    H, G = dense(saturated_case(kind, loss, torch.float64))
    be = saturated_case(kind, loss, torch.float32).backend(backend)
    g = torch.Generator().manual_seed(0)
    V = torch.randn(3, H.shape[0], generator=g, dtype=torch.float64)
    assert _rel(be.hvp(V.float()), V @ H) <= MODEL_TOL
    assert _rel(be.ggn_vp(V.float()), V @ G) <= MODEL_TOL
    if backend == "autograd":  # the traced vᵀHv route (flatcheck.engines.quadform)
        S = torch.randint(0, 2, (4, H.shape[0]), generator=g, dtype=torch.int8) * 2 - 1
        quad = be.vhv(S)
        assert be.vhv_error is None
        Sd = S.double()
        assert _rel(quad, ((Sd @ H) * Sd).sum(1)) <= MODEL_TOL


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_float32_lmax_of_a_saturated_model_is_within_its_bound(kind):
    """The stranger's case (a small CNN at loss ~5e-8): float32 lmax missed by 41× its bound.

    What float32 cannot avoid is left over: its forward rounds the logits by δ (1e-5 at logits
    of ~100), which moves every p_j = exp(z_j − z_m)/(1 + S) by a factor within e^{±2δ} and
    so the float32 model's curvature by up to 4δ relative; the bound is of the products
    taken, not of that (the cancelling loss missed by 100× more than this allowance)."""
    import flatcheck

    exact = saturated_case(kind, 1e-8, torch.float64)
    H, _ = dense(exact)
    truth = torch.linalg.eigvalsh(H)[-1].item()
    case = saturated_case(kind, 1e-8, torch.float32)
    with torch.no_grad():
        delta = (case.model(case.X).double() - exact.model(exact.X)).abs().max().item()
    allowance = 4 * delta * truth
    for seed in range(4):
        r = flatcheck.measure(case.model, (case.X, case.Y), probes={"lmax": {"k": 1}}, seed=seed).results["lmax"]
        assert abs(r.value - truth) <= r.error_bound + allowance, (seed, r.value, truth, r.error_bound, allowance)
