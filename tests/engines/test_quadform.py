"""vᵀHv by forward tangents against first-order adjoints (flatcheck.engines.quadform), against the
dense float64 Hessian and against the reference backend's double-backward HVPs."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from tests.support.dense import dense, make_case
from flatcheck.backends import ParamLayout, create_backend
from flatcheck.problem import Problem
from flatcheck.data.batches import SampleSet
from flatcheck.errors import ModelError
from flatcheck.linalg import hutchinson
from flatcheck.linalg.random import rademacher_signs
from flatcheck.models.spec import LossSpec
from flatcheck.operators import CurvatureOperator, LayoutParts
from tests.support.dense import mixer_case

EPS = torch.finfo(torch.float64).eps


def _signs(k: int, dim: int, seed: int = 0) -> torch.Tensor:
    return rademacher_signs(k, dim, torch.Generator().manual_seed(seed), device="cpu")


def _check_against_dense(case, k: int = 4, reverse: bool = False) -> None:
    """vᵀHv equals diag(V H Vᵀ) to float64 round-off: each of the P² terms of the sum is at most
    |H_ij| in size, so the error bound is a modest multiple of eps·Σ|H_ij|."""
    H, _ = dense(case, reverse)
    backend = case.backend("autograd")
    S = _signs(k, H.shape[0])
    V = S.double()
    want = ((V @ H) * V).sum(1)
    got = backend.vhv(S)
    assert backend.vhv_error is None
    assert got.dtype == torch.float64 and got.shape == (k,)
    assert (got - want).abs().max().item() <= 1e3 * EPS * H.abs().sum().item()


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("loss", ["cross_entropy", "label_smoothing", "mse", "sigmoid_mse"])
@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_vhv_matches_dense(kind, loss, bn_mode):
    _check_against_dense(make_case(kind, loss=loss, bn_mode=bn_mode))


def test_vhv_matches_dense_through_attention_norms_and_pooling():
    """Dense H by reverse-over-reverse autograd here: torch.func.hessian of a loss through
    layer norm with an affine weight is wrong on torch 2.14.1 (an asymmetric Hessian; see the
    docs/internals.md, "Things about torch worth knowing"). The func backend's products agree with
    autograd (tests/backends/test_conformance.py)."""
    _check_against_dense(mixer_case(), reverse=True)


@pytest.mark.workflow
@pytest.mark.parametrize("name", ["test_vit", "test_resnet", "test_efficientnet_gn"])
def test_vhv_equals_the_reference_hvps_on_timm_models(name):
    """Larger graphs than dense H allows: the double-backward reference, itself dense-tested.
    test_efficientnet_gn: group norm (decomposed) with timm's in-place SiLU on its output."""
    timm = pytest.importorskip("timm")
    from timm.layers import set_fused_attn

    set_fused_attn(False)  # the fused CPU attention kernel has no double backward (the reference)
    torch.manual_seed(0)
    kw = dict(img_size=8, patch_size=4) if name == "test_vit" else {}
    model = timm.create_model(name, pretrained=False, num_classes=5, **kw).double()
    g = torch.Generator().manual_seed(1)
    X = torch.randn(6, 3, 8, 8, generator=g, dtype=torch.float64)
    Y = torch.randint(0, 5, (6,), generator=g)
    samples = SampleSet(TensorDataset(X, Y), samples=6, batch_size=3, dtype=torch.float64)
    problem = Problem(model, LossSpec("cross_entropy"), samples, ParamLayout.from_model(model))
    backend = create_backend("autograd", problem)
    S = _signs(2, problem.layout.dim, seed=2)
    sums = backend.hvp_sums(S)
    got = backend.vhv(S)
    assert backend.vhv_error is None
    # each value is a sum of P per-parameter-tensor terms; their float64 rounding is what the
    # two routes may differ by
    assert ((got - sums.sum(1)).abs() <= 1e4 * EPS * sums.abs().sum(1)).all()


def test_single_batch_primal_is_kept_and_several_batches_are_rebuilt(monkeypatch):
    from flatcheck.engines.quadform import QuadraticForms

    built = []
    real = QuadraticForms.primal
    monkeypatch.setattr(QuadraticForms, "primal", lambda self, x, y: built.append(1) or real(self, x, y))
    one = make_case("cnn", n=10, batch_size=10).backend("autograd")
    S = _signs(2, one.problem.layout.dim)
    first = one.vhv(S)
    assert torch.equal(one.vhv(S), first) and len(built) == 1  # the second call ran no forward
    built.clear()
    three = make_case("cnn", n=23, batch_size=10).backend("autograd")
    three.vhv(S)
    assert len(built) == 3  # none kept by a single pass
    three.vhv(S)
    assert len(built) == 6  # kept now (they fit the budget)
    three.vhv(S)
    assert len(built) == 6


def test_untraceable_loss_falls_back_to_hvps_and_says_why(monkeypatch):
    import flatcheck.engines.quadform.plan as qp
    from flatcheck.engines.quadform import UnsupportedGraph

    def refuse(*_a, **_k):
        raise UnsupportedGraph("the loss's graph mutates a tensor (aten.fake_.default)")

    monkeypatch.setattr(qp, "trace_loss", refuse)
    case = make_case("mlp")
    H, _ = dense(case)
    backend = case.backend("autograd")
    S = _signs(3, H.shape[0])
    with pytest.warns(UserWarning, match="mutates a tensor"):
        got = backend.vhv(S)
    assert "UnsupportedGraph" in backend.vhv_error
    want = ((S.double() @ H) * S.double()).sum(1)
    assert (got - want).abs().max().item() <= 1e3 * EPS * H.abs().sum().item()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        backend.vhv(S)
        w = torch.linspace(0.5, 2.0, H.shape[0], dtype=torch.float64)  # a diagonal scale (adaptive sharpness's |w|)
        Vw = S.double() * w
        scaled = backend.vhv(S, w)
    assert (scaled - ((Vw @ H) * Vw).sum(1)).abs().max().item() <= 1e3 * EPS * 4 * H.abs().sum().item()  # |w_i w_j| ≤ 4


def test_scaled_rows_match_dense():
    case = make_case("cnn", loss="mse")
    H, _ = dense(case)
    backend = case.backend("autograd")
    S = _signs(3, H.shape[0], seed=4)
    w = torch.linspace(0.5, 2.0, H.shape[0], dtype=torch.float64)
    Vw = S.double() * w
    got = backend.vhv(S, w)
    assert backend.vhv_error is None
    assert (got - ((Vw @ H) * Vw).sum(1)).abs().max().item() <= 1e3 * EPS * 4 * H.abs().sum().item()


def test_mutation_of_a_shared_tensor_is_refused():
    """An in-place op on a tensor something else uses (a view of it, or its base) cannot
    become out-of-place; one on a private intermediate (an op's output, an element of the
    tuple an op returns, a view of a base nothing else reads) can."""
    import flatcheck.engines.quadform.graph as qf
    from torch.fx.experimental.proxy_tensor import make_fx

    def shared(x):
        y = x * 2
        v = y.view(3)
        y.add_(1)
        return (v * v).sum()

    def through_a_view(x):
        y = x * 2
        y[1:].add_(1)  # mutates y through a view nobody else holds
        return (y * y).sum()

    def private(x):
        return (x * 2).add_(1).sum()

    def view_of_a_private_base(x):
        return (x * 2).view(3, 1).add_(1).sum()  # nothing reads x * 2 but the view

    def tuple_element(x):
        var, mean = torch.var_mean(x.view(1, 3), 1)
        return (var + mean.add_(1)).sum()  # var_mean's mean is its own tensor

    cases = ((shared, False), (through_a_view, False), (private, True), (view_of_a_private_base, True),
             (tuple_element, True))
    for f, ok in cases:
        gm = make_fx(f)(torch.randn(3))
        assert any(str(n.target) == "aten.add_.Tensor" for n in gm.graph.nodes)
        if ok:
            qf._out_of_place(gm.graph)
            assert not any(str(n.target).endswith("_.Tensor") for n in gm.graph.nodes)
        else:
            with pytest.raises(qf.UnsupportedGraph, match="mutates"):
                qf._out_of_place(gm.graph)


def test_hutchinson_without_parts_takes_vhv_with_the_same_probes(monkeypatch):
    """Without parts the estimator asks for vᵀHv totals; the probes are the same as with
    parts, so the values agree to round-off."""
    case = make_case("cnn")
    backend = case.backend("autograd")
    calls = []
    real = backend.vhv
    monkeypatch.setattr(backend, "vhv", lambda S, scale=None: calls.append(S.shape[0]) or real(S, scale))
    fast = hutchinson(CurvatureOperator(backend), generator=torch.Generator().manual_seed(9), max_probes=12,
                      block_size=5)
    assert calls == [5, 5, 2] and fast.matvecs == 12 and fast.groups == {}
    ref_op = CurvatureOperator(case.backend("autograd"))
    ref = hutchinson(ref_op, generator=torch.Generator().manual_seed(9), max_probes=12, block_size=5,
                     split=LayoutParts(case.problem.layout))
    H, _ = dense(case)
    tol = 1e3 * EPS * H.abs().sum().item()
    assert math.isclose(fast.value, ref.value, abs_tol=tol)
    assert math.isclose(fast.stderr, ref.stderr, abs_tol=tol)


def test_ggn_operator_never_takes_vhv():
    case = make_case("mlp")
    op = CurvatureOperator(case.backend("autograd"), "ggn")
    assert not op.streams_total and not op.streams_quadratic
    func = CurvatureOperator(case.backend("func"))
    assert not func.streams_total
    # asked anyway, they refuse rather than hand back the Hessian's sums
    S = _signs(2, op.dim)
    for o in (op, func):
        with pytest.raises(ValueError, match="does not stream"):
            o.quadratic(S)
        assert o.matvecs == 0


def test_trace_probe_without_parts_is_within_error_and_says_its_route():
    from flatcheck.probes.registry import ProbeContext, get_probe_class
    from flatcheck.probes.trace import TraceOptions

    case = make_case("cnn", bn_mode="train")
    H, _ = dense(case)
    probe = get_probe_class("trace")()
    ctx = ProbeContext(backend=case.backend("autograd"), seed=3)
    res = probe.run(ctx, TraceOptions(probes_max=60, parts=False))
    assert "forward tangents" in res.notes and res.details["layers"] == {}
    true = torch.trace(H).item()
    # z = 4.5 standard errors: a false failure once in ~150 000 runs
    assert abs(res.value - true) <= 4.5 * res.stderr


_ELEMENTARY = {
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "softmax": lambda x: torch.softmax(x, 1),
    "var_mean": lambda x: torch.var_mean(x, dim=(0, 2), correction=0, keepdim=True),
    "var_mean_unbiased": lambda x: torch.var_mean(x, dim=[1]),
    "gelu": F.gelu,
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 0.5),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.5),
    "sqrt": lambda x: torch.sqrt(x.abs() + 0.5),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "reciprocal": lambda x: torch.reciprocal(x.abs() + 0.5),
}


def _evaluate(fn, *inputs):
    """fn traced to aten ops, every node's value, and the nodes that move with the first input."""
    import flatcheck.engines.quadform.plan as qf
    from flatcheck.engines.quadform.graph import arg_nodes
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn)(*inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    value, moving = dict(zip(placeholders, inputs)), {placeholders[0]}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            args, kwargs = qf._fill(n, value)
            value[n] = n.target(*args, **kwargs)
            if any(a in moving for a in arg_nodes(n)) and qf._floating(n):
                moving.add(n)
    return gm, value, moving


def _lookups(value: dict, tangent: dict):
    def val(a):
        return value[a] if isinstance(a, torch.fx.Node) else a

    def tan(a):
        return tangent.get(a) if isinstance(a, torch.fx.Node) else None

    return val, tan


def _pieces(t) -> list:
    return list(t) if isinstance(t, tuple) else [t]


def _x_and_tangent():
    g = torch.Generator().manual_seed(7)
    return (torch.randn(3, 4, 5, generator=g, dtype=torch.float64),
            torch.randn(3, 4, 5, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("name", list(_ELEMENTARY))
def test_written_out_rules_equal_nested_jvp(name):
    """Each op with a written-out tangent and source gives what nested forward-mode gives."""
    import flatcheck.engines.quadform.rules as qf

    x, x1 = _x_and_tangent()
    gm, value, moving = _evaluate(_ELEMENTARY[name], x)
    target = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target in qf._EXPLICIT)
    val, tan = _lookups(value, {target.args[0]: x1})  # x1 as the tangent of the explicit op's input

    rule = qf.choose_rule(target, moving)
    assert rule is qf._EXPLICIT[target.target]
    got = rule(target, val, tan, True)
    want = qf._NESTED(target, val, tan, True)
    for mine, ref in zip(got, want):  # the tangent, then the source
        assert len(_pieces(mine)) == len(_pieces(ref))
        for a, b in zip(_pieces(mine), _pieces(ref)):
            a = torch.zeros_like(b) if a is None else a  # no source written for a linear part
            assert torch.allclose(a, b, rtol=1e-12, atol=1e-12 * b.abs().max().item()), name


_LINEAR_OPS = {
    "nll_loss_mean": lambda x, y: F.nll_loss(x[:, :, 0], y, ignore_index=2),
    "nll_loss_none": lambda x, y: F.nll_loss(x[:, :, 0], y, reduction="none"),
    "constant_pad": lambda x, y: F.pad(x, (1, 2), value=0.3),
    "div_by_still": lambda x, y: x / (y.double() + 1.5)[:, None, None],
}


@pytest.mark.parametrize("name", list(_LINEAR_OPS))
def test_linear_rules_equal_nested_jvp(name):
    """Ops taken as linear in their moving input: the same tangent as nested forward mode, no source."""
    import flatcheck.engines.quadform.rules as qf

    x, x1 = _x_and_tangent()
    gm, value, moving = _evaluate(_LINEAR_OPS[name], x, torch.tensor([1, 2, 3]))
    xs = next(n for n in gm.graph.nodes if n.op == "placeholder")
    # the op under test: the first moving one after the x[:, :, 0] that some cases take
    target = next(n for n in gm.graph.nodes if n in moving and n is not xs and n.target != torch.ops.aten.select.int)
    first = target.args[0]
    # the tangent of the op's input, by forward mode from x′
    val, tan = _lookups(value, {first: torch.func.jvp(lambda t: t[:, :, 0] if first is not xs else t, (x,), (x1,))[1]})

    rule = qf.choose_rule(target, moving)
    assert rule is qf._LINEAR and not rule.has_source(target, moving)
    got, source = rule(target, val, tan, True)
    want, want_source = qf._NESTED(target, val, tan, True)
    assert source is None
    for a, b in zip(_pieces(got), _pieces(want)):
        assert torch.allclose(a, b, rtol=1e-13, atol=1e-13), name
    for s in _pieces(want_source):
        assert s is None or s.abs().max().item() == 0  # nested forward mode finds no source either


def test_hutchpp_without_parts_takes_quadratic_forms_for_two_thirds(monkeypatch):
    """Hutch++ without parts: the sketch by products, Tr(QᵀHQ) and the residual by vᵀHv
    (float rows), the same estimate as with parts to round-off, within its error of Tr(H)."""
    from flatcheck.linalg import hutchpp

    case = make_case("cnn", bn_mode="train")
    H, _ = dense(case)
    backend = case.backend("autograd")
    rows = []
    real = backend.vhv
    monkeypatch.setattr(backend, "vhv", lambda S, scale=None: rows.append(S.shape[0]) or real(S, scale))
    op = CurvatureOperator(backend)
    fast = hutchpp(op, generator=torch.Generator().manual_seed(2), matvecs=30)
    assert rows == [10, 10] and op.matvecs == 30 and fast.matvecs == 30 and fast.groups == {}
    ref = hutchpp(CurvatureOperator(case.backend("autograd")), generator=torch.Generator().manual_seed(2),
                  matvecs=30, split=LayoutParts(case.problem.layout))
    tol = 1e3 * EPS * H.abs().sum().item()
    assert math.isclose(fast.value, ref.value, abs_tol=tol) and math.isclose(fast.stderr, ref.stderr, abs_tol=tol)
    # z = 4.5 standard errors of its Hutchinson part
    assert abs(fast.value - torch.trace(H).item()) <= 4.5 * fast.stderr


class _SqueezeExcite(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.down, self.up = nn.Conv2d(c, 4, 1), nn.Conv2d(4, c, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.up(torch.relu(self.down(x.mean((2, 3), keepdim=True)))))


def _mobile_net() -> nn.Module:
    """MobileNetV3's and EfficientNet's activations: hardswish (in place, as torchvision has
    it), a squeeze-excite gate through hardsigmoid, SiLU, and a depthwise convolution."""
    torch.manual_seed(4)
    return nn.Sequential(
        nn.Conv2d(1, 6, 3), nn.BatchNorm2d(6), nn.Hardswish(inplace=True), _SqueezeExcite(6),
        nn.Conv2d(6, 6, 3, groups=6), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4),
    ).double()


def test_vhv_through_activations_without_second_derivatives_matches_finite_differences():
    """torch has no second derivative of hardsigmoid, so neither dense H nor the HVP route
    exists for this model; ground truth is a central difference of the gradient along v.
    Its error is estimated from two step sizes (h and h/2: error ∝ h²), and the test
    requires the two to agree first, i.e. that no activation kink lies within the steps."""
    from torch.func import functional_call

    model = _mobile_net()
    g = torch.Generator().manual_seed(6)
    X = 2 * torch.randn(8, 1, 7, 7, generator=g, dtype=torch.float64)
    Y = torch.randint(0, 4, (8,), generator=g)
    samples = SampleSet(TensorDataset(X, Y), samples=8, batch_size=8, dtype=torch.float64)
    problem = Problem(model, LossSpec("cross_entropy"), samples, ParamLayout.from_model(model))
    backend = create_backend("autograd", problem)
    with pytest.raises(ModelError, match=r"uses aten::hardsigmoid, which torch cannot differentiate twice.*--no-layers"):
        backend.hvp(torch.ones(1, problem.layout.dim, dtype=torch.float64))
    assert ModelError.exit_code == 2
    S = _signs(2, problem.layout.dim, seed=3)
    got = backend.vhv(S)
    assert backend.vhv_error is None
    layout, params = problem.layout, problem.layout.params(model)
    model.eval()

    def directional_gradient(v, h):
        moved = {n: (p.detach() + h * d).requires_grad_() for n, p, d in zip(layout.names, params, v)}
        loss = F.cross_entropy(functional_call(model, moved, (X,)), Y)
        return sum((gi * d).sum() for gi, d in zip(torch.autograd.grad(loss, list(moved.values())), v)).item()

    for i in range(2):
        v = [t[0] for t in layout.split(S[i : i + 1].double())]
        fd = [(directional_gradient(v, h) - directional_gradient(v, -h)) / (2 * h) for h in (1e-4, 5e-5)]
        err = abs(fd[0] - fd[1])  # ≈ 3/4 of fd[0]'s error, 3× fd[1]'s
        assert err <= 1e-5 * abs(fd[1])  # the steps cross no kink
        assert abs(got[i].item() - fd[1]) <= max(err, 1e-9 * abs(fd[1]))


def test_short_trace_of_a_model_without_second_derivatives_takes_forward_tangents():
    """A trace of few products takes HVPs (too few to repay tracing); on the hardsigmoid model
    the first HVP cannot be made, and the trace takes the tangent route instead of failing —
    the same probes, so the same values as asking for that route."""
    from flatcheck.probes.registry import ProbeContext, get_probe_class
    from flatcheck.probes.trace import TANGENT_MIN_PRODUCTS, TraceOptions

    model = _mobile_net()
    g = torch.Generator().manual_seed(6)
    X, Y = 2 * torch.randn(8, 1, 7, 7, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g)

    def run(route: str):
        samples = SampleSet(TensorDataset(X, Y), samples=8, batch_size=8, dtype=torch.float64)
        problem = Problem(model, LossSpec("cross_entropy"), samples, ParamLayout.from_model(model))
        ctx = ProbeContext(backend=create_backend("autograd", problem), seed=3)
        return get_probe_class("trace")().run(ctx, TraceOptions(probes_max=4, rtol=None, parts=False, route=route))

    assert 4 < TANGENT_MIN_PRODUCTS
    auto, tangent = run("auto"), run("tangent")
    assert auto.details["route"] == tangent.details["route"] == "vhv_tangent"
    assert auto.details["probe_values"] == tangent.details["probe_values"] and auto.matvecs == 4
    with pytest.raises(ModelError, match="cannot differentiate twice"):
        run("hvp")


@pytest.mark.workflow
def test_fused_attention_is_decomposed_and_equals_the_unfused_hvp_route():
    """timm's fused attention (scaled_dot_product_attention) has no double backward on the CPU,
    so the HVP route needs it unfused; the tangent route traces it into its primitive parts."""
    timm = pytest.importorskip("timm")
    from timm.layers import set_fused_attn

    def problem(fused: bool):
        set_fused_attn(fused)
        try:
            torch.manual_seed(0)
            model = timm.create_model("test_vit", pretrained=False, num_classes=5, img_size=8, patch_size=4).double()
        finally:
            set_fused_attn(False)
        g = torch.Generator().manual_seed(1)
        X = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
        Y = torch.randint(0, 5, (4,), generator=g)
        samples = SampleSet(TensorDataset(X, Y), samples=4, batch_size=4, dtype=torch.float64)
        return Problem(model, LossSpec("cross_entropy"), samples, ParamLayout.from_model(model))

    fused, plain = problem(True), problem(False)
    assert any(getattr(m, "fused_attn", False) for m in fused.model.modules())
    S = _signs(2, fused.layout.dim, seed=8)
    got_backend = create_backend("autograd", fused)
    got = got_backend.vhv(S)
    assert got_backend.vhv_error is None
    sums = create_backend("autograd", plain).hvp_sums(S)
    assert ((got - sums.sum(1)).abs() <= 1e4 * EPS * sums.abs().sum(1)).all()


def test_a_normalisation_left_whole_is_refused_not_differentiated_wrongly(monkeypatch):
    """A batch norm that reaches the tangent pass undecomposed (cuDNN's training-mode kernel did on
    CUDA, named apart from the CPU one) has a forward-mode formula that holds its saved batch
    statistics constant: its nested jvp misses part of the second derivative. The pass refuses
    it, and vᵀHv comes from HVPs, equal to the dense Hessian's."""
    import flatcheck.engines.quadform.graph as qg

    monkeypatch.setattr(qg, "_DECOMPOSE", tuple(op for op in qg._DECOMPOSE if "batch_norm" not in str(op)))
    case = make_case("cnn", bn_mode="train")
    H, _ = dense(case)
    backend = case.backend("autograd")
    S = _signs(4, H.shape[0])
    with pytest.warns(UserWarning, match="batch statistics"):
        got = backend.vhv(S)
    assert "UnsupportedGraph" in backend.vhv_error and "batch_norm" in backend.vhv_error
    want = ((S.double() @ H) * S.double()).sum(1)
    assert (got - want).abs().max().item() <= 1e3 * EPS * H.abs().sum().item()


def test_the_cuda_batch_norm_kernel_is_decomposed_like_the_cpu_one():
    """The list of normalisations traced as their parts names cuDNN's kernel too (the CUDA test
    suite checks the values on a GPU: test_vhv_by_forward_tangents_on_cuda_matches_dense)."""
    from flatcheck.engines.quadform.graph import _DECOMPOSE

    aten = torch.ops.aten
    assert {aten.native_batch_norm, aten.cudnn_batch_norm, aten.native_layer_norm} <= set(_DECOMPOSE)
