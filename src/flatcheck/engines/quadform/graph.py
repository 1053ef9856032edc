"""The loss of one batch as an aten graph: tracing, in-place ops made out-of-place, and
what importing the tracer costs (see flatcheck.engines.quadform for why a graph is wanted)."""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch
from torch import Tensor, fx
from torch.func import functional_call, jvp
from torch.utils._pytree import tree_flatten

from ...problem import Problem
from ...losses import per_sample_loss

aten = torch.ops.aten

# The normalisations are traced as their primitive parts: mean and variance, rsqrt and
# products, each with an exact rule here; so is fused CPU attention, which has neither a
# second derivative nor a forward-mode one through its backward. A normalisation left whole
# would be wrong, not slow: its forward-mode formula reads the batch statistics it saved as
# outputs that carry no tangent, so the nested jvp of the generic rule drops every term of the
# second derivative that runs through them. The CUDA kernels are named apart from the CPU
# ones (cuDNN's training-mode batch norm), so both are listed; rules.py refuses any
# normalisation that still reaches it.
_DECOMPOSE = tuple(op for op in (
    aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
    aten._native_batch_norm_legit_functional, aten.cudnn_batch_norm, aten.native_layer_norm,
    aten.native_group_norm, getattr(aten, "_fused_rms_norm", None), aten._scaled_dot_product_flash_attention_for_cpu)
    if op is not None)



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



def arg_nodes(node: fx.Node) -> list[fx.Node]:
    return [a for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, fx.Node)]

