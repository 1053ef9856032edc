"""One rule per moving op of a traced loss: its tangent, and its source (the second
directional derivative of the op along its inputs' tangents; see flatcheck.engines.quadform).

Chosen once per graph from which of the op's inputs move, a rule says which primal values
it reads (only those are kept), whether it has a source, and makes its tangent and source.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch
from torch import Tensor, fx
from torch.func import jvp
from torch.utils._pytree import tree_map

from .graph import UnsupportedGraph, aten, arg_nodes

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



Lookup = Callable[[Any], Any]  # a node (or constant) → its value / its tangent (None: still)


class _Rule:
    """By default: nested forward mode of the op alone; reads every input, has a source."""

    def reads(self, node: fx.Node, moving: set) -> list[fx.Node]:
        return arg_nodes(node)

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
        return [a for a in arg_nodes(node) if a not in moving]

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
        return arg_nodes(node) + [node]

    def __call__(self, node, val, tan, want_source):
        return self.rule(node, val, tan, want_source)


_NESTED, _LINEAR, _PIECEWISE_RULE, _MAXPOOL_RULE, _BILINEAR_RULE = _Rule(), _Linear(), _Piecewise(), _MaxPool(), _Bilinear()


def choose_rule(node: fx.Node, moving: set) -> _Rule:
    t = node.target
    first = node.args[0] if node.args else None
    first_only = (isinstance(first, fx.Node) and first in moving
                  and not any(a in moving for a in arg_nodes(node)[1:]))
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
    if _saves_statistics(t):
        raise UnsupportedGraph(f"{t} reached the tangent pass whole: its forward-mode formula treats the batch "
                               "statistics it saves as constants, so a nested jvp would miss part of the second "
                               "derivative")
    return _NESTED


def _saves_statistics(target: Any) -> bool:
    """A fused normalisation (batch, layer, group, RMS norm: CPU, cuDNN or MIOpen kernel) whose
    forward-mode derivative reads its saved mean and inverse deviation (see graph._DECOMPOSE)."""
    name = getattr(getattr(target, "_schema", None), "name", "")
    return any(kind in name for kind in ("batch_norm", "layer_norm", "group_norm", "rms_norm", "instance_norm"))


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
    keys = list(dict.fromkeys(a for a in arg_nodes(node) if tan(a) is not None))
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

