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

graph.py traces the loss to aten ops; rules.py is the table of one rule per op (tangent and
source); plan.py works out a graph's tangent pass once (Plan) and runs it per batch (Primal).
"""

from .graph import UnsupportedGraph, preload, trace_loss
from .plan import Plan, Primal, QuadraticForms

__all__ = ["QuadraticForms", "Plan", "Primal", "UnsupportedGraph", "preload", "trace_loss"]
