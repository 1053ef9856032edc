"""vᵀHv without a Hessian-vector product: forward tangents against first-order adjoints.

Along θ + εv every intermediate value z_n of the loss's computation moves as
z_n + ε z′_n + ½ε² z″_n. The second-order parts propagate linearly, so

    vᵀHv = d²L/dε² = Σ_n ⟨λ_n, s_n⟩,

with λ_n = ∂L/∂z_n the ordinary backprop adjoint of node n and s_n its local source: the
second directional derivative of node n's op along the tangents of its inputs. It is zero
for ops linear in their moving inputs (views, sums, additions, ReLU, pooling),
2·op(a′, b′) for bilinear ones (convolutions, matrix products, products), written out for
the common nonlinear ones (softmax, log-softmax, var_mean, GELU, elementwise functions),
and taken by nested forward-mode differentiation of the single op for any other.

Per batch one forward and one input-only backward give every λ_n for the whole block. Per
vector one tangent pass and one source product per bilinear op remain: three forward-costs
for a convolution against the six of a double-backward HVP, and no create_graph gradient.

Only the total vᵀHv comes out, not its split over parameter tensors (which needs Hv): the
per-layer parts of a trace keep the HVP route.
"""

from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Callable

import torch
from torch import Tensor, fx
from torch.func import functional_call, jvp
from torch.utils._pytree import tree_flatten, tree_map

from ..losses import per_sample_loss
from .base import Problem

aten = torch.ops.aten

# The normalisations are traced as their primitive parts: mean and variance, rsqrt and
# products, each with an exact rule here; so is fused CPU attention, which has neither a
# second derivative nor a forward-mode one through its backward.
_DECOMPOSE = (aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
              aten._native_batch_norm_legit_functional, aten.native_layer_norm, aten.native_group_norm,
              aten._scaled_dot_product_flash_attention_for_cpu)

# Ops linear in their first argument with the other arguments held: tangent = op(a′, …), no source.
_LINEAR_FIRST = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.t.default, aten.transpose.int,
    aten.permute.default, aten.expand.default, aten.clone.default, aten.select.int, aten.slice.Tensor,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.mean.dim,
    aten.mean.default, aten.sum.dim_IntList, aten.sum.default, aten.neg.default, aten.alias.default,
    aten.unbind.int, aten.split.Tensor, aten.split_with_sizes.default, aten.constant_pad_nd.default,
    aten.avg_pool2d.default, aten._adaptive_avg_pool2d.default, aten.unfold.default, aten.flip.default,
    aten.roll.default, aten.index_select.default, aten.gather.default, aten.repeat.default,
}
# Ops of several tensors linear in them jointly: a missing tangent counts as zero.
_LINEAR_JOINT = {aten.cat.default, aten.stack.default}
# Bilinear in (argument i, argument j): tangent op(a′, b) + op(a, b′), source 2·op(a′, b′).
_BILINEAR = {
    aten.convolution.default: (0, 1), aten.mm.default: (0, 1), aten.bmm.default: (0, 1),
    aten.mul.Tensor: (0, 1), aten.addmm.default: (1, 2), aten.baddbmm.default: (1, 2),
}
# Piecewise linear: the tangent is masked by where the input is, the source is zero (as
# autograd's second derivative is).
_PIECEWISE = {aten.relu.default, aten.leaky_relu.default, aten.hardtanh.default, aten.hardsigmoid.default}


class UnsupportedGraph(RuntimeError):
    """The loss's graph has something the tangent pass cannot take (a mutation, say)."""


def trace_loss(problem: Problem, x: Tensor, y: Tensor) -> tuple[fx.GraphModule, list[str]]:
    """The batch-mean loss as an aten graph of (probed parameters…, frozen tensors…, x, y)."""
    from torch._decomp import get_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    model = problem.model
    chosen, frozen = problem.split_params()
    names, frozen_names = list(chosen), list(frozen)

    def loss(*args):
        p = dict(zip(names, args[: len(names)]))
        f = dict(zip(frozen_names, args[len(names) : len(names) + len(frozen_names)]))
        logits = functional_call(model, (p, f), (args[-2],))
        return per_sample_loss(logits, args[-1], problem.loss).mean()

    inputs = list(chosen.values()) + list(frozen.values()) + [x, y]
    gm = make_fx(loss, decomposition_table=get_decompositions(list(_DECOMPOSE)), tracing_mode="fake")(*inputs)
    gm.graph.eliminate_dead_code()
    _out_of_place(gm.graph)
    gm.recompile()
    return gm, frozen_names


def _out_of_place(graph: fx.Graph) -> None:
    """In-place ops (torchvision's ReLU(inplace=True), label smoothing's masked_fill_, timm's
    fused norm + activation) become their out-of-place forms where the mutated tensor is a
    private intermediate (see `_private`), so no other reader can see the change. Anything
    else that mutates is refused."""
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        name = schema.name.split("::")[-1]
        pure = getattr(getattr(aten, name[:-1], None), node.target._overloadname, None) if name.endswith("_") else None
        if pure is None or not _private(node.args[0] if node.args else None):
            raise UnsupportedGraph(f"the loss's graph mutates a tensor ({node.target})")
        node.target = pure


def _private(node: Any) -> bool:
    """Only its one user can see the node's storage: an op's own output (an element of a
    tuple it returns included), or a view of a private base."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or len(node.users) != 1:
        return False
    if node.target is operator.getitem:
        parent, i = node.args
        returns = getattr(getattr(parent.target, "_schema", None), "returns", ())
        return isinstance(i, int) and i < len(returns) and returns[i].alias_info is None
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    if any(r.alias_info is not None for r in schema.returns):
        return _private(node.args[0])  # a view: the base has no reader but this view
    return True


class QuadraticForms:
    """Per batch: the traced loss graph (one per batch shape), its forward and adjoints."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self._graphs: dict[tuple, tuple[Plan, list[str]]] = {}
        preload()

    def primal(self, x: Tensor, y: Tensor) -> "Primal":
        """The batch-mean loss's forward and adjoints on (x, y); the caller holds the model mode."""
        chosen, frozen = self.problem.split_params()
        # parameters and buffers are the graph's inputs, not constants in it: a graph stays
        # valid when weights are rewritten, and is traced again when a shape, dtype or device changes
        key = tuple((n, t.shape, t.dtype, t.device) for n, t in [*chosen.items(), *frozen.items(), ("x", x), ("y", y)])
        if key not in self._graphs:
            gm, frozen_names = trace_loss(self.problem, x, y)
            self._graphs[key] = (Plan(gm, len(chosen)), frozen_names)
        plan, frozen_names = self._graphs[key]
        return Primal(plan, list(chosen.values()), [frozen[n] for n in frozen_names] + [x, y])


def preload() -> None:
    """Import what tracing and the first jvp load: make_fx imports torch._inductor's config,
    and with it torch._dynamo, seconds of importing in a process that has not imported them
    yet (importing timm does; a model of flatcheck's own zoo alone does not)."""
    import torch._inductor.config  # noqa: F401
    from torch.fx.experimental.proxy_tensor import make_fx  # noqa: F401

    with warnings.catch_warnings():
        # torch loads its forward-AD decompositions on the first jvp, through the
        # deprecated torch.jit.script: a FutureWarning that is torch's, not the user's
        warnings.simplefilter("ignore", FutureWarning)
        jvp(torch.sin, (torch.zeros(1),), (torch.ones(1),))


class Plan:
    """What one traced graph's tangent pass needs, worked out once per graph (not per batch):
    the nodes that move with θ, the rule of each, the nodes with a source, which values the
    rules read, and where each value is last used."""

    def __init__(self, gm: fx.GraphModule, n_params: int):
        self.gm = gm
        self.nodes = [n for n in gm.graph.nodes if n.op != "output"]
        self.out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.params = [n for n in self.nodes if n.op == "placeholder"][:n_params]
        moving = set(self.params)
        for node in self.nodes:
            if node.op == "call_function" and any(a in moving for a in _arg_nodes(node)) and _floating(node):
                moving.add(node)
        self.moving = [n for n in self.nodes if n in moving and n.op == "call_function"]
        self.rules = {n: _choose(n, moving) for n in self.moving}
        self.sources = [n for n, rule in self.rules.items() if rule.has_source(n, moving)]
        self.last_use = _last_uses(self.nodes)
        # only what the tangent pass reads is kept: about the inputs of the bilinear and
        # nonlinear ops, not every intermediate
        self.read = {a for n, rule in self.rules.items() for a in rule.reads(n, moving)}


class Primal:
    """One batch's forward: the values its plan's rules read, and the adjoints λ_n of the
    nodes with a source."""

    def __init__(self, plan: Plan, params: list[Tensor], rest: list[Tensor]):
        self.plan = plan
        value, self.adjoint = self._forward(params, rest)
        self.value = {n: v for n, v in value.items() if n in plan.read}
        owned = [v for n, v in self.value.items() if n.op != "placeholder"] + list(self.adjoint.values())
        self.nbytes = sum(t.numel() * t.element_size() for t in tree_flatten(owned)[0] if isinstance(t, Tensor))

    def _forward(self, params: list[Tensor], rest: list[Tensor]) -> tuple[dict, dict]:
        plan = self.plan
        value: dict[fx.Node, Any] = {}
        args = iter([p.detach().requires_grad_() for p in params] + rest)
        keep = plan.read | set(plan.sources) | {plan.out}
        with torch.enable_grad():
            for node in plan.nodes:
                if node.op == "placeholder":
                    value[node] = next(args)
                elif node.op == "get_attr":
                    value[node] = getattr(plan.gm, node.target)
                else:
                    a, kw = _fill(node, value)
                    value[node] = node.target(*a, **kw)
                for dead in plan.last_use.get(node, ()):
                    if dead not in keep:
                        del value[dead]  # what autograd saved of it stays alive there
            loss = value[plan.out]
            wanted = [(n, i, t) for n in plan.sources for i, t in enumerate(tree_flatten(value[n])[0])
                      if isinstance(t, Tensor) and t.requires_grad]
            # input-only backward: no parameter is asked for, so no weight gradient is made
            grads = torch.autograd.grad(loss, [t for _, _, t in wanted], allow_unused=True) if wanted else []
        adjoint: dict[fx.Node, dict[int, Tensor]] = {}
        for (n, i, _), g in zip(wanted, grads):
            if g is not None:
                adjoint.setdefault(n, {})[i] = g
        value = {n: tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, v) for n, v in value.items()}
        return value, adjoint

    def second_derivative(self, param_tangents: list[Tensor]) -> float:
        """vᵀ H_batch v = Σ_n ⟨λ_n, s_n⟩ for the direction v given per parameter tensor."""
        plan = self.plan
        tangent: dict[fx.Node, Any] = dict(zip(plan.params, param_tangents))
        total = torch.zeros((), dtype=torch.float64, device=param_tangents[0].device)

        def val(a):
            return self.value[a] if isinstance(a, fx.Node) else a

        def tan(a):
            return tangent.get(a) if isinstance(a, fx.Node) else None

        with torch.no_grad():
            for node in plan.moving:
                lam = self.adjoint.get(node)
                t_out, source = plan.rules[node](node, val, tan, want_source=lam is not None)
                tangent[node] = t_out
                if source is not None:
                    for i, s in enumerate(tree_flatten(source)[0]):
                        if i in lam and isinstance(s, Tensor):
                            total += (lam[i] * s).sum(dtype=torch.float64)
                for dead in plan.last_use.get(node, ()):
                    tangent.pop(dead, None)
        return total.item()


def _arg_nodes(node: fx.Node) -> list[fx.Node]:
    return [a for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, fx.Node)]


def _floating(node: fx.Node) -> bool:
    """Whether any of the node's outputs is a floating tensor (integers, indices and masks
    do not move with θ), as the trace recorded it; unknown counts as floating."""
    outs = [t for t in tree_flatten(node.meta.get("val"))[0] if isinstance(t, Tensor)]
    return not outs or any(t.is_floating_point() or t.is_complex() for t in outs)


def _fill(node: fx.Node, env: dict) -> tuple[tuple, dict]:
    return tree_map(lambda a: env[a] if isinstance(a, fx.Node) else a, (node.args, node.kwargs))


def _last_uses(nodes: list[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    """node → the values whose last user it is (their tangents can be freed after it)."""
    last: dict[fx.Node, fx.Node] = {}
    for node in nodes:
        for a in _arg_nodes(node):
            last[a] = node
    out: dict[fx.Node, list[fx.Node]] = {}
    for value, user in last.items():
        out.setdefault(user, []).append(value)
    return out


# ------------------------------------------------------------------ one rule per moving op
# Chosen once per graph from which of the op's inputs move, a rule says which primal values
# it reads (only those are kept), whether it has a source, and makes its tangent and source.

Lookup = Callable[[Any], Any]  # a node (or constant) → its value / its tangent (None: still)


class _Rule:
    """By default: nested forward mode of the op alone; reads every input, has a source."""

    def reads(self, node: fx.Node, moving: set) -> list[fx.Node]:
        return _arg_nodes(node)

    def has_source(self, node: fx.Node, moving: set) -> bool:
        return True

    def __call__(self, node: fx.Node, val: Lookup, tan: Lookup, want_source: bool) -> tuple[Any, Any]:
        return _generic(node, val, tan, want_source)


class _Linear(_Rule):
    """Linear in its moving inputs: the tangent is the op of the tangents, no source; reads
    only the inputs that stay still."""

    def reads(self, node, moving):
        if node.target is operator.getitem or node.target in (aten.add.Tensor, aten.sub.Tensor):
            return []  # a still addend drops out of the tangent
        return [a for a in _arg_nodes(node) if a not in moving]

    def has_source(self, node, moving):
        return False

    def __call__(self, node, val, tan, want_source):
        t, args, kwargs = node.target, node.args, node.kwargs
        if t is operator.getitem:
            parent = tan(args[0])
            return (None if parent is None else parent[args[1]]), None
        if t in (aten.add.Tensor, aten.sub.Tensor):
            a, b = tan(args[0]), tan(args[1])
            if b is not None:
                alpha = kwargs.get("alpha", 1)
                b = b * (alpha if t == aten.add.Tensor else -alpha)
            return (b if a is None else a if b is None else a + b), None
        if t in _LINEAR_JOINT:  # a still part's tangent is zero
            parts = [tan(a) if tan(a) is not None else torch.zeros_like(val(a)) for a in args[0]]
            rest, kw = tree_map(val, (args[1:], kwargs))
            return t(parts, *rest, **kw), None
        rest, kw = tree_map(val, (args[1:], kwargs))
        if t == aten.nll_loss_forward.default:  # (loss, total weight): only the loss moves
            out, total = t(tan(args[0]), *rest, **kw)
            return (out, torch.zeros_like(total)), None
        if t == aten.constant_pad_nd.default:
            rest = rest[:1]  # padding with c is affine: its tangent pads with zeros
        return t(tan(args[0]), *rest, **kw), None  # _LINEAR_FIRST, and division by a still tensor


class _Piecewise(_Linear):
    """Piecewise linear: the tangent masked by where the input is; no source (as autograd's
    second derivative has none). ReLU reads its output, the others their input."""

    def reads(self, node, moving):
        return [node if node.target == aten.relu.default else node.args[0]]

    def __call__(self, node, val, tan, want_source):
        x = val(node if node.target == aten.relu.default else node.args[0])
        return tan(node.args[0]) * _slope(node.target, x, node.args[1:], node.kwargs), None


class _MaxPool(_Linear):
    def reads(self, node, moving):
        return [node]  # the indices

    def __call__(self, node, val, tan, want_source):
        idx = val(node)[1]
        picked = tan(node.args[0]).flatten(-2).gather(-1, idx.flatten(-2)).view(idx.shape)
        return (picked, None), None


class _Bilinear(_Rule):
    def reads(self, node, moving):
        i, j = _BILINEAR[node.target]
        a, b = node.args[i], node.args[j]
        # op(a′, b) reads b, op(a, b′) reads a
        return [x for x, other in ((a, b), (b, a)) if isinstance(x, fx.Node) and other in moving]

    def has_source(self, node, moving):
        return all(node.args[k] in moving for k in _BILINEAR[node.target])

    def __call__(self, node, val, tan, want_source):
        return _bilinear(node, val, tan, want_source)


class _Explicit(_Rule):
    """A written-out tangent and source; they use f(x) as well as x."""

    def __init__(self, rule: Callable[[fx.Node, Lookup, Lookup, bool], tuple[Any, Any]]):
        self.rule = rule

    def reads(self, node, moving):
        return _arg_nodes(node) + [node]

    def __call__(self, node, val, tan, want_source):
        return self.rule(node, val, tan, want_source)


_NESTED, _LINEAR, _PIECEWISE_RULE, _MAXPOOL_RULE, _BILINEAR_RULE = _Rule(), _Linear(), _Piecewise(), _MaxPool(), _Bilinear()


def _choose(node: fx.Node, moving: set) -> _Rule:
    t = node.target
    first = node.args[0] if node.args else None
    first_only = (isinstance(first, fx.Node) and first in moving
                  and not any(a in moving for a in _arg_nodes(node)[1:]))
    if t is operator.getitem or t in (aten.add.Tensor, aten.sub.Tensor) or t in _LINEAR_JOINT:
        return _LINEAR
    if t in _LINEAR_FIRST and first_only:
        return _LINEAR
    if t in (aten.div.Tensor, aten.nll_loss_forward.default) and first_only:
        return _LINEAR
    if t in _PIECEWISE and first_only:
        return _PIECEWISE_RULE
    if t == aten.max_pool2d_with_indices.default:
        return _MAXPOOL_RULE
    if t in _BILINEAR:
        return _BILINEAR_RULE
    if t in _EXPLICIT and first_only and _explicit_form(node):
        return _EXPLICIT[t]
    return _NESTED


# Ops common enough that nested jvp's overhead shows (nested, log-softmax alone costs about a
# fifth of a demo probe):
# their tangent f′(x)x′ and source f″(x)[x′, x′] written out. Each is checked against the
# nested-jvp rule in the tests.
def _unary(df: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]):
    """An elementwise f, given (x, f(x)) → (f′(x), f″(x))."""

    def rule(node, val, tan, want_source):
        x, x1 = val(node.args[0]), tan(node.args[0])
        d1, d2 = df(x, val(node))
        return d1 * x1, (d2 * x1 * x1 if want_source else None)

    return rule


def _gelu(x: Tensor, _y: Tensor) -> tuple[Tensor, Tensor]:
    pdf = torch.exp(-0.5 * x * x) * (2 * math.pi) ** -0.5
    cdf = 0.5 * (1 + torch.erf(x * 0.5**0.5))
    return cdf + x * pdf, pdf * (2 - x * x)


def _silu(x: Tensor, _y: Tensor) -> tuple[Tensor, Tensor]:
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s)), s * (1 - s) * (2 + x * (1 - 2 * s))


def _log_softmax(node, val, tan, want_source):
    dim = node.args[1]
    x1 = tan(node.args[0])
    p = val(node).exp()
    m1 = (p * x1).sum(dim, keepdim=True)
    # log-softmax = x − logsumexp(x): the second derivative is −Var_p(x′) in every component
    source = None
    if want_source:
        source = ((p * x1 * x1).sum(dim, keepdim=True) - m1 * m1).neg().expand_as(p)
    return x1 - m1, source


def _softmax(node, val, tan, want_source):
    dim = node.args[1]
    x1, p = tan(node.args[0]), val(node)
    c = x1 - (p * x1).sum(dim, keepdim=True)
    p1 = p * c
    source = (p1 * c - p * (p1 * x1).sum(dim, keepdim=True)) if want_source else None
    return p1, source


def _var_mean(node, val, tan, want_source):
    """(var, mean) over dims with a correction: var = Σ(x − μ)²/(n − c), a quadratic form."""
    x, x1 = val(node.args[0]), tan(node.args[0])
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    correction = node.kwargs.get("correction", 1)
    keepdim = node.kwargs.get("keepdim", False)
    if dims is None:
        dims = list(range(x.dim()))
    n = 1
    for d in dims:
        n *= x.shape[d]
    scale = 2.0 / (n - correction)
    mean1 = x1.mean(dims, keepdim=True)
    c1 = x1 - mean1
    xc = x - x.mean(dims, keepdim=True)
    var1 = (xc * c1).sum(dims, keepdim=keepdim) * scale
    mean1 = mean1 if keepdim else mean1.squeeze(dims)
    source = ((c1 * c1).sum(dims, keepdim=keepdim) * scale, None) if want_source else None
    return (var1, mean1), source


def _explicit_form(node: fx.Node) -> bool:
    """The op is in the form its written-out rule is for."""
    t = node.target
    if t == aten.gelu.default:
        return node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") == "none"
    if t in (aten._softmax.default, aten._log_softmax.default):
        return not node.args[2]  # half_to_float
    if t == aten.var_mean.correction:
        return isinstance(node.kwargs.get("correction", 1), (int, float))
    return True


_EXPLICIT = {op: _Explicit(rule) for op, rule in {
    aten._log_softmax.default: _log_softmax,
    aten._softmax.default: _softmax,
    aten.var_mean.correction: _var_mean,
    aten.gelu.default: _unary(_gelu),
    aten.exp.default: _unary(lambda x, y: (y, y)),
    aten.log.default: _unary(lambda x, y: (x.reciprocal(), -x.reciprocal().square())),
    aten.rsqrt.default: _unary(lambda x, y: (-0.5 * y / x, 0.75 * y / (x * x))),
    aten.sqrt.default: _unary(lambda x, y: (0.5 / y, -0.25 / (y * x))),
    aten.tanh.default: _unary(lambda x, y: (1 - y * y, -2 * y * (1 - y * y))),
    aten.sigmoid.default: _unary(lambda x, y: (y * (1 - y), y * (1 - y) * (1 - 2 * y))),
    aten.reciprocal.default: _unary(lambda x, y: (-y * y, 2 * y * y * y)),
    # x·relu6(x + 3)/6, with autograd's one-sided derivatives at ±3; torch has no second
    # derivative of hardswish or hardsigmoid, so nested jvp cannot take them
    aten.silu.default: _unary(_silu),
    aten.hardswish.default: _unary(lambda x, y: (
        torch.where(x < -3, 0.0, torch.where(x <= 3, x / 3 + 0.5, 1.0)).to(x.dtype),
        ((x >= -3) & (x <= 3)).to(x.dtype) / 3)),
}.items()}


def _slope(t: Any, x: Tensor, args: tuple, kwargs: dict) -> Tensor:
    """The derivative of a piecewise-linear op where autograd takes it (0 at ReLU's kink);
    for ReLU `x` is its output, which is positive exactly where its input is."""
    if t == aten.relu.default:
        return (x > 0).to(x.dtype)
    if t == aten.leaky_relu.default:
        neg = args[0] if args else kwargs.get("negative_slope", 0.01)
        return torch.where(x > 0, torch.ones_like(x), torch.full_like(x, neg))
    if t == aten.hardsigmoid.default:  # relu6(x + 3)/6
        return ((x > -3) & (x < 3)).to(x.dtype) / 6
    lo = args[0] if len(args) > 0 else kwargs.get("min_val", -1.0)
    hi = args[1] if len(args) > 1 else kwargs.get("max_val", 1.0)
    return ((x > lo) & (x < hi)).to(x.dtype)


def _bilinear(node: fx.Node, val: Callable, tan: Callable, want_source: bool) -> tuple[Any, Any]:
    """op(a, b) bilinear: tangent op(a′, b) + op(a, b′) (+ the bias's tangent), source 2·op(a′, b′)."""
    t, args, kwargs = node.target, node.args, node.kwargs
    scale, extra = 1, None
    if t == aten.convolution.default:
        a, b = args[0], args[1]
        rest = [val(x) for x in args[3:]]
        if tan(args[2]) is not None:
            extra = tan(args[2]).reshape((-1,) + (1,) * (val(a).dim() - 2))

        def apply(x, y):
            return t(x, y, None, *rest)
    elif t in (aten.addmm.default, aten.baddbmm.default):
        a, b = args[1], args[2]
        scale = kwargs.get("alpha", 1)
        if tan(args[0]) is not None:
            extra = tan(args[0]) * kwargs.get("beta", 1)
        base = aten.mm.default if t == aten.addmm.default else aten.bmm.default

        def apply(x, y):
            return base(x, y)
    else:
        a, b = args[0], args[1]

        def apply(x, y):
            return t(x, y)

    ta, tb = tan(a), tan(b)
    terms = ([apply(ta, val(b))] if ta is not None else []) + ([apply(val(a), tb)] if tb is not None else [])
    out = sum(terms[1:], terms[0]) if terms else None
    if out is not None and scale != 1:
        out = out * scale
    if extra is not None:
        out = extra if out is None else out + extra
    source = None
    if want_source and ta is not None and tb is not None:
        source = apply(ta, tb) * (2 * scale)
    return out, source


def _generic(node: fx.Node, val: Callable, tan: Callable, want_source: bool) -> tuple[Any, Any]:
    """Tangent and second directional derivative of one op by nested jvp of that op alone."""
    keys = list(dict.fromkeys(a for a in _arg_nodes(node) if tan(a) is not None))
    order = {a: k for k, a in enumerate(keys)}

    def op(*xs):
        args, kwargs = tree_map(lambda a: xs[order[a]] if a in order else val(a), (node.args, node.kwargs))
        return node.target(*args, **kwargs)

    primals = tuple(val(a) for a in keys)
    tangents = tuple(tan(a) for a in keys)
    if not want_source:
        return jvp(op, primals, tangents)[1], None
    (_, t_out), (_, source) = jvp(lambda *p: jvp(op, p, tangents), primals, tangents)
    return t_out, source
