"""The tangent pass of one traced graph: which nodes move with θ and by which rule (a Plan,
once per graph), and one batch's forward and adjoints that every vector's pass reuses (a
Primal); QuadraticForms keeps a plan per batch shape (see flatcheck.engines.quadform)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, fx
from torch.utils._pytree import tree_flatten, tree_map

from ...problem import Problem
from .graph import arg_nodes, preload, trace_loss
from .rules import choose_rule

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
            if node.op == "call_function" and any(a in moving for a in arg_nodes(node)) and _floating(node):
                moving.add(node)
        self.moving = [n for n in self.nodes if n in moving and n.op == "call_function"]
        self.rules = {n: choose_rule(n, moving) for n in self.moving}
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
        for a in arg_nodes(node):
            last[a] = node
    out: dict[fx.Node, list[fx.Node]] = {}
    for value, user in last.items():
        out.setdefault(user, []).append(value)
    return out

