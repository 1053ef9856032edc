"""Reference backend: products by plain reverse-mode autograd (double backward).

It is the oracle other backends are tested against, so it favours the obvious
computation over the fast one; it still shares one forward and one first-order
gradient per batch across a whole block of vectors, and keeps that graph across
calls when the sample set is a single batch. Besides the required products it has every
optional capability: per-parameter sums of v ⊙ Hv (HvpSums), vᵀHv by forward tangents
(Vhv, flatcheck.engines.quadform) and the exact GGN trace (ExactGGN,
flatcheck.engines.ggn_trace).
"""

from __future__ import annotations

import re
import time
import warnings
from typing import Callable, Iterator

import torch
from torch import Tensor

from ..engines.ggn_trace import ggn_trace
from ..engines.kept import GRAPH_CACHE_BYTES, KeptPrefix, Pool
from ..engines.microbatch import BatchPlan, batch_sizes, micro_batches, plan_products
from ..report.pulse import Passes, listened
from ..engines.pullback import or_zeros, pullback
from ..engines.quadform import QuadraticForms
from ..engines.state import ModelState
from ..errors import ModelError, first_line
from ..linalg.reduce import rowsum64
from ..losses import apply_output_hessian, per_sample_loss
from ..problem import Problem, model_mode
from .base import BackendSpec, GGNTrace
from .registry import register_backend


@register_backend("autograd")
class AutogradBackend:
    name = "autograd"

    def __init__(self, problem: Problem, per_sample: str = "layers"):
        self.problem = problem
        self.spec = BackendSpec(self.name)
        self.per_sample = per_sample  # "layers" or "vmap": how the exact GGN trace gets ‖J_nᵀu‖²
        self._params = problem.layout.params(problem.model)
        # first-order graphs and vᵀHv primals of batches 0, 1, … kept across calls: one
        # memory budget, and dropped together when a weight or buffer they saved moves
        self.state = ModelState(problem.model)
        self.state.register(self._refresh_params)
        self._pool = pool = Pool(self.state)
        self._graph_cache = KeptPrefix(pool)
        self._primal_cache = KeptPrefix(pool)
        self._ggn_cache = KeptPrefix(pool)
        # --max-memory: batches cut so that one micro-batch's graph fits (limit_memory)
        self.batch_plan: BatchPlan | None = None
        self._quadforms: QuadraticForms | None = None
        self.vhv_error: str | None = None  # why vhv fell back to the HVP route, if it did
        # the op torch cannot differentiate twice, once an HVP has met one: the trace then
        # takes vᵀHv by forward tangents, which need no second derivative
        self.hvp_error: str | None = None

    def limit_memory(self, allowance: int | None, what: str = "products") -> BatchPlan | None:
        """Products from here on hold at most about `allowance` bytes of graph: batches whose
        graph would not fit are cut into micro-batches (values unchanged to round-off, see
        flatcheck.engines.microbatch); refuses (exit 2) when one sample cannot fit. None: no limit."""
        self._graph_cache.clear()
        self._primal_cache.clear()
        self._ggn_cache.clear()
        self.batch_plan = None if allowance is None else plan_products(self.problem, allowance, what)
        self._pool.budget = GRAPH_CACHE_BYTES
        if self.batch_plan is not None:
            size = self.batch_plan.size or self.batch_plan.largest_batch
            # graphs kept across calls share the allowance with the micro-batch in flight
            self._pool.budget = min(GRAPH_CACHE_BYTES, max(0, allowance - size * self.batch_plan.per_sample))
        return self.batch_plan

    @property
    def _samples(self):
        """The batches products run over: the sample set's, or its micro-batches (limit_memory)."""
        return micro_batches(self.problem.samples, self.batch_plan)

    # -- helpers -------------------------------------------------------------------------
    def _refresh_params(self) -> None:
        """A parameter replaced by another tensor (not written in place) is read anew."""
        self._params = self.problem.layout.params(self.problem.model)

    def _mode(self):
        return model_mode(self.problem.model, self.problem.bn_mode)

    def _grad_with_graph(self, batch) -> tuple[list[tuple[int, Tensor]], int]:
        """(index, gradient with its graph) for each parameter the loss depends on, and an
        estimate of the bytes the graph holds, so that the caller can decide whether to keep it.

        The estimate is twice the outputs of the model's leaf modules (what the forward and
        the first-order backward save, roughly) plus the gradients. Not the saved tensors
        themselves through saved_tensors_hooks: the hooks cost more memory than the estimate
        is there to save (a ResNet-18 trace's peak rose by a third with them).

        Kept per tensor rather than concatenated: a flat copy would hold one more
        parameter-sized tensor inside the kept graph.
        """
        logits, outputs = self._forward_sized(batch.x)
        loss = per_sample_loss(logits, batch.y, self.problem.loss).mean() * batch.weight
        grads = torch.autograd.grad(loss, self._params, create_graph=True, allow_unused=True)
        kept = [(j, g) for j, g in enumerate(grads) if g is not None and g.requires_grad]
        return kept, 2 * outputs + sum(g.numel() * g.element_size() for _, g in kept)

    def _forward_sized(self, x: Tensor) -> tuple[Tensor, int]:
        """The model's outputs on x, and the bytes its leaf modules' outputs take (what a
        kept graph's size is estimated from)."""
        outputs = 0

        def count(module, _inputs, out) -> None:
            nonlocal outputs
            if isinstance(out, Tensor) and next(module.children(), None) is None:
                outputs += out.numel() * out.element_size()

        handle = torch.nn.modules.module.register_module_forward_hook(count)
        try:
            return self.problem.model(x), outputs
        finally:
            handle.remove()

    def _graphs(self, passes: Passes) -> Iterator[tuple[tuple[int, ...], tuple[Tensor, ...]]]:
        """(parameter indices, gradients with their graph) per batch; the caller holds the model mode.

        Graphs of batches 0, 1, … are kept across calls within GRAPH_CACHE_BYTES (flatcheck.engines.kept);
        later products only backpropagate through them. Batches where the loss is linear in
        every parameter (H = 0) yield nothing.
        """
        for g in self._kept(self._graph_cache, self._grad_with_graph, passes):
            if g:
                yield tuple(zip(*g))  # type: ignore[misc]

    def _kept(self, cache: KeptPrefix, build: Callable, passes: Passes) -> Iterator:
        """`cache.each` over the samples, telling `passes` how long each build that the cache
        keeps took (Passes.built): later calls reuse it, so a progress display leaves it out of
        the rate of the products to come. A build the cache does not keep is repeated by every
        call, and stays in the rate."""
        if passes.listener is None:
            yield from cache.each(self._samples, build)
            return
        took = 0.0

        def timed(batch):
            nonlocal took
            start = time.perf_counter()
            try:
                return build(batch)
            finally:
                took = time.perf_counter() - start

        for item in cache.each(self._samples, timed):
            if took and cache.items and cache.items[-1] is item:
                passes.built(took)
            took = 0.0
            yield item

    def _hv_row(self, index, outputs, v: list[Tensor]) -> tuple[Tensor | None, ...]:
        """H_batch v for one vector given per parameter; None where a part is zero.

        The gradient of the scalar Σ_j ⟨g_j, v_j⟩ rather than the backward of the g_j with
        grad_outputs v_j: the same backward (the product's derivative hands each g_j exactly
        1·v_j = v_j, so H v agrees bit for bit), but torch checks tensor grad_outputs' shapes
        with torch.fx.experimental.symbolic_shapes, whose first import (sympy with it) costs
        about a second of a short run."""
        try:
            inner = sum((g * v[j]).sum() for j, g in zip(index, outputs))
            return torch.autograd.grad(inner, self._params, retain_graph=True, allow_unused=True)
        except RuntimeError as exc:
            missing = re.search(r"derivative for (\S+) is not implemented", str(exc))
            if missing is None:
                raise
            self.hvp_error = f"{missing.group(1).removesuffix('_backward')} has no second derivative"
            raise ModelError(f"the model uses {missing.group(1).removesuffix('_backward')}, which torch cannot "
                             "differentiate twice, so Hessian-vector products cannot be made; the Hessian "
                             "trace's total can (flatcheck trace --no-layers), and so can GGN products") from None

    # -- products ------------------------------------------------------------------------
    def hvp(self, V: Tensor) -> Tensor:
        layout = self.problem.layout
        # not zeroed first: the first batch writes every part (its product, or zero where it has
        # none), later ones add; a zero fill would be one more pass over (k, P) per call
        out = torch.empty_like(V)
        rows_out = [layout.split(out[i : i + 1]) for i in range(V.shape[0])]
        rows_in = [layout.unflatten(V[i]) for i in range(V.shape[0])]
        passes = self._passes(V.shape[0])
        written = False
        with self._mode():
            for b, (index, outputs) in enumerate(self._graphs(passes)):
                # one backward per vector, written straight into its row of `out`: a block of
                # products costs no (k, P) temporaries beyond V and the result
                for i in range(V.shape[0]):
                    for acc, piece in zip(rows_out[i], self._hv_row(index, outputs, rows_in[i])):
                        if piece is None:
                            if not written:
                                acc.zero_()
                        elif written:
                            acc.add_(piece.unsqueeze(0))
                        else:
                            acc.copy_(piece.unsqueeze(0))
                    passes.batch(b)
                written = True
        return out if written else out.zero_()

    def _passes(self, vectors: int) -> Passes:
        """The count of a call's passes over the batches (report.pulse), for a progress display
        to show within a call; only a count: a batch skipped for having no graph (a loss linear
        in every parameter) shifts it, and the call's own report follows it."""
        sizes = batch_sizes(self._samples) if listened() else []
        return Passes(sum(sizes), vectors, sizes)

    def hvp_sums(self, S: Tensor) -> Tensor:
        """Σ over each parameter tensor of v ⊙ Hv, for every row v of S: (k, n_params) float64.

        S may be an int8 block of ±1 signs. Only one float vector and its product exist at a
        time, and each batch's forward and first-order graph serve the whole block, so a
        Hutchinson block over many batches costs k·P bytes instead of 2·k·P floats.
        """
        layout, dtype = self.problem.layout, self.problem.dtype
        sums = torch.zeros(S.shape[0], len(self._params), dtype=torch.float64, device=S.device)
        passes = self._passes(S.shape[0])
        with self._mode():
            for b, (index, outputs) in enumerate(self._graphs(passes)):
                for i in range(S.shape[0]):
                    v = layout.unflatten(S[i].to(dtype))
                    for j, piece in enumerate(self._hv_row(index, outputs, v)):
                        if piece is not None:
                            sums[i, j] += rowsum64((piece * v[j]).reshape(1, -1))[0]
                    passes.batch(b)
        return sums

    def vhv(self, S: Tensor, scale: Tensor | None = None) -> Tensor:
        """vᵀHv for v = s ⊙ scale, every row s of S ((k, P), int8 signs allowed; scale (P,) or
        None): (k,) float64, the total only.

        By forward tangents against first-order adjoints (flatcheck.engines.quadform): about
        half the work of a double-backward HVP per vector, one float vector at a time. Where
        the loss's graph cannot be traced or taken that way, it says why once and sums
        `hvp_sums` instead.
        """
        if self.vhv_error is None:
            try:
                return self._vhv(S, scale)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:  # noqa: BLE001  any op the tangent pass cannot take: the HVP route
                self.vhv_error = f"{type(exc).__name__}: {first_line(exc)}"
                self._primal_cache.clear()
                warnings.warn(f"vᵀHv by forward tangents is not available for this model ({self.vhv_error[:200]}); "
                              "using Hessian-vector products")
        if scale is None:
            return self.hvp_sums(S).sum(1)
        V = S.to(self.problem.dtype) * scale
        return rowsum64(self.hvp(V).mul_(V))

    def _vhv(self, S: Tensor, scale: Tensor | None) -> Tensor:
        layout, dtype = self.problem.layout, self.problem.dtype
        if self._quadforms is None:
            self._quadforms = QuadraticForms(self.problem)
        quad = self._quadforms

        def build(batch):
            primal = quad.primal(batch.x, batch.y)
            return (primal, batch.weight), primal.nbytes

        out = torch.zeros(S.shape[0], dtype=torch.float64, device=S.device)
        passes = self._passes(S.shape[0])
        with self._mode():
            for b, (primal, weight) in enumerate(self._kept(self._primal_cache, build, passes)):
                for i in range(S.shape[0]):
                    row = S[i].to(dtype)
                    v = layout.unflatten(row if scale is None else row * scale)
                    out[i] += weight * primal.second_derivative(v)
                    passes.batch(b)
        return out

    def ggn_vp(self, V: Tensor) -> Tensor:
        layout = self.problem.layout
        k = V.shape[0]
        out = torch.zeros_like(V)
        passes = self._passes(k)
        with self._mode():
            for b, (logits, u, jt_u_flat, batch) in enumerate(self._kept(self._ggn_cache, self._ggn_graph, passes)):
                (jv,) = pullback(jt_u_flat, [u], V)  # (k, B, C)
                scale = batch.weight / logits.shape[0]
                ajv = apply_output_hessian(logits, batch.y, self.problem.loss, jv) * scale
                out += layout.flatten(pullback(logits, self._params, ajv), k)
                passes.batch(b, k)
        return out

    def _ggn_graph(self, batch) -> tuple[tuple, int]:
        """A batch's logits and Jᵀu with its graph in u, for J v by the double-VJP trick:
        g(u) = Jᵀu is linear in u, so ∂(gᵀv)/∂u = J v. Kept across products like the HVP's
        first-order graphs (the forward and this backward are two of a product's four passes),
        with the same size estimate: twice the leaf modules' outputs plus Jᵀu."""
        logits, outputs = self._forward_sized(batch.x)
        u = torch.zeros_like(logits, requires_grad=True)
        jt_u = torch.autograd.grad(logits, self._params, u, create_graph=True, allow_unused=True)
        jt_u_flat = torch.cat([or_zeros(g, p).reshape(-1) for g, p in zip(jt_u, self._params)])
        return (logits, u, jt_u_flat, batch), 2 * outputs + jt_u_flat.numel() * jt_u_flat.element_size()

    def ggn_trace(self, class_samples: int | None = None, generator: torch.Generator | None = None,
                  progress: Callable[[int, int], None] | None = None) -> GGNTrace:
        """Tr(G) per parameter tensor (flatcheck.engines.ggn_trace), the per-sample norms by
        the `per_sample` strategy."""
        return ggn_trace(self.problem, class_samples, generator, progress, self.per_sample)

    def outputs(self) -> Iterator[tuple[Tensor, Tensor, float]]:
        return self.problem.outputs()
