"""Reference backend: products by plain reverse-mode autograd (double backward).

It is the oracle other backends are tested against, so it favours the obvious
computation over the fast one; it still shares one forward and one first-order
gradient per batch across a whole block of vectors, and keeps that graph across
calls when the sample set is a single batch.
"""

from __future__ import annotations

import itertools
import re
import warnings
from typing import Callable, Iterator

import torch
from torch import Tensor
from torch.func import functional_call, vjp, vmap

from ..errors import ModelError, first_line
from ..linalg.reduce import rowsum64
from ..losses import apply_output_hessian, output_hessian_factors, per_sample_loss, sample_columns
from .base import GGNTrace, Problem, model_mode, register_backend
from .persample import layer_sqnorms
from .quadform import QuadraticForms
from .state import ModelState

# Memory allowed for one chunk of per-sample gradients in the exact GGN trace.
_PER_SAMPLE_BYTES = 256 * 2**20
# First-order graphs kept across products over several batches (estimated size, see
# _grad_with_graph). Each kept batch saves its forward and gradient (about a third of an
# HVP's cost) in every later product.
GRAPH_CACHE_BYTES = 1024 * 2**20


@register_backend("autograd")
class AutogradBackend:
    name = "autograd"
    capabilities = frozenset({"hvp", "hvp_sums", "vhv", "ggn_vp", "ggn_trace", "outputs"})

    def __init__(self, problem: Problem, per_sample: str = "layers"):
        self.problem = problem
        self.per_sample = per_sample  # "layers" or "vmap": how the exact GGN trace gets ‖J_nᵀu‖²
        self._params = problem.layout.params(problem.model)
        # first-order graphs and vᵀHv primals of batches 0, 1, … kept across calls: one
        # memory budget, and dropped together when a weight or buffer they saved moves
        self.state = ModelState(problem.model)
        self.state.register(self._refresh_params)
        pool = _Pool(self.state)
        self._graph_cache = _KeptPrefix(pool)
        self._primal_cache = _KeptPrefix(pool)
        self._quadforms: QuadraticForms | None = None
        self.vhv_error: str | None = None  # why vhv fell back to the HVP route, if it did

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
        outputs = 0

        def count(module, _inputs, out) -> None:
            nonlocal outputs
            if isinstance(out, Tensor) and next(module.children(), None) is None:
                outputs += out.numel() * out.element_size()

        handle = torch.nn.modules.module.register_module_forward_hook(count)
        try:
            logits = self.problem.model(batch.x)
        finally:
            handle.remove()
        loss = per_sample_loss(logits, batch.y, self.problem.loss).mean() * batch.weight
        grads = torch.autograd.grad(loss, self._params, create_graph=True, allow_unused=True)
        kept = [(j, g) for j, g in enumerate(grads) if g is not None and g.requires_grad]
        return kept, 2 * outputs + sum(g.numel() * g.element_size() for _, g in kept)

    def _pullback(self, output: Tensor, inputs, cotangents: Tensor) -> list[Tensor]:
        """VJPs of `output` for a block of cotangents (k, *output.shape), one backward each.

        A plain loop rather than is_grads_batched (vmap over the backward): for small CNNs
        on CPU the batched backward runs at about half the loop's speed, and a loop is the
        obvious computation an oracle should make.
        """
        k = cotangents.shape[0]
        if not output.requires_grad:
            return [torch.zeros(k, *x.shape, dtype=x.dtype, device=x.device) for x in inputs]
        rows = []
        for i in range(k):
            grads = torch.autograd.grad(output, inputs, cotangents[i], retain_graph=True, allow_unused=True)
            rows.append([_or_zeros(g, x) for g, x in zip(grads, inputs)])
        return [torch.stack(col) for col in zip(*rows)]

    def _graphs(self) -> Iterator[tuple[tuple[int, ...], tuple[Tensor, ...]]]:
        """(parameter indices, gradients with their graph) per batch; the caller holds the model mode.

        Graphs of batches 0, 1, … are kept across calls within GRAPH_CACHE_BYTES (_KeptPrefix);
        later products only backpropagate through them. Batches where the loss is linear in
        every parameter (H = 0) yield nothing.
        """
        for g in self._graph_cache.each(self.problem.samples, self._grad_with_graph):
            if g:
                yield tuple(zip(*g))  # type: ignore[misc]

    def _hv_row(self, index, outputs, v: list[Tensor]) -> tuple[Tensor | None, ...]:
        """H_batch v for one vector given per parameter; None where a part is zero."""
        try:
            return torch.autograd.grad(outputs, self._params, [v[j] for j in index], retain_graph=True,
                                       allow_unused=True)
        except RuntimeError as exc:
            missing = re.search(r"derivative for (\S+) is not implemented", str(exc))
            if missing is None:
                raise
            raise ModelError(f"the model uses {missing.group(1).removesuffix('_backward')}, which torch cannot "
                             "differentiate twice, so Hessian-vector products cannot be made; the Hessian "
                             "trace's total can (flatcheck trace --no-layers), and so can GGN products") from None

    # -- products ------------------------------------------------------------------------
    def hvp(self, V: Tensor) -> Tensor:
        layout = self.problem.layout
        out = torch.zeros_like(V)
        rows_out = [layout.split(out[i : i + 1]) for i in range(V.shape[0])]
        rows_in = [layout.unflatten(V[i]) for i in range(V.shape[0])]
        with self._mode():
            for index, outputs in self._graphs():
                # one backward per vector, added straight into its row of `out`: a block of
                # products costs no (k, P) temporaries beyond V and the result
                for i in range(V.shape[0]):
                    for acc, piece in zip(rows_out[i], self._hv_row(index, outputs, rows_in[i])):
                        if piece is not None:
                            acc.add_(piece.unsqueeze(0))
        return out

    def hvp_sums(self, S: Tensor) -> Tensor:
        """Σ over each parameter tensor of v ⊙ Hv, for every row v of S: (k, n_params) float64.

        S may be an int8 block of ±1 signs. Only one float vector and its product exist at a
        time, and each batch's forward and first-order graph serve the whole block, so a
        Hutchinson block over many batches costs k·P bytes instead of 2·k·P floats.
        """
        layout, dtype = self.problem.layout, self.problem.dtype
        sums = torch.zeros(S.shape[0], len(self._params), dtype=torch.float64, device=S.device)
        with self._mode():
            for index, outputs in self._graphs():
                for i in range(S.shape[0]):
                    v = layout.unflatten(S[i].to(dtype))
                    for j, piece in enumerate(self._hv_row(index, outputs, v)):
                        if piece is not None:
                            sums[i, j] += rowsum64((piece * v[j]).reshape(1, -1))[0]
        return sums

    def vhv(self, S: Tensor, scale: Tensor | None = None) -> Tensor:
        """vᵀHv for v = s ⊙ scale, every row s of S ((k, P), int8 signs allowed; scale (P,) or
        None): (k,) float64, the total only.

        By forward tangents against first-order adjoints (flatcheck.backends.quadform): about
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
        with self._mode():
            for primal, weight in self._primal_cache.each(self.problem.samples, build):
                for i in range(S.shape[0]):
                    row = S[i].to(dtype)
                    v = layout.unflatten(row if scale is None else row * scale)
                    out[i] += weight * primal.second_derivative(v)
        return out

    def ggn_vp(self, V: Tensor) -> Tensor:
        layout = self.problem.layout
        k = V.shape[0]
        out = torch.zeros_like(V)
        with self._mode():
            for batch in self.problem.samples:
                logits = self.problem.model(batch.x)
                # J v by the double-VJP trick: g(u) = Jᵀu is linear in u, so ∂(gᵀv)/∂u = J v.
                u = torch.zeros_like(logits, requires_grad=True)
                jt_u = torch.autograd.grad(logits, self._params, u, create_graph=True, allow_unused=True)
                jt_u_flat = torch.cat([_or_zeros(g, p).reshape(-1) for g, p in zip(jt_u, self._params)])
                (jv,) = self._pullback(jt_u_flat, [u], V)  # (k, B, C)
                scale = batch.weight / logits.shape[0]
                ajv = apply_output_hessian(logits, batch.y, self.problem.loss, jv) * scale
                out += layout.flatten(self._pullback(logits, self._params, ajv), k)
        return out

    def ggn_trace(self, class_samples: int | None = None, generator: torch.Generator | None = None,
                  progress: Callable[[int, int], None] | None = None) -> GGNTrace:
        """Tr(G) per parameter tensor: (1/N) Σ_n Σ_k λ_nk ‖J_nᵀ u_nk‖².

        Exact with all C columns of the factorisation. With `class_samples` = K, each
        sample uses K columns drawn with replacement, with probability ∝ |λ_nk|·‖u_nk‖²
        (p_c·‖e_c − p‖² for cross entropy; see losses.sample_columns), and
        importance weights λ/(K·q): unbiased, with a standard error from the spread of the
        K single-draw estimates within each sample.
        """
        total = torch.zeros(len(self._params), dtype=torch.float64, device=self.problem.device)
        variance, columns = 0.0, 0
        with self._mode():
            for i, batch in enumerate(self.problem.samples):
                with torch.no_grad():
                    logits = self.problem.model(batch.x)
                U, lam = output_hessian_factors(logits, batch.y, self.problem.loss)
                if class_samples is not None:
                    U, lam = sample_columns(U, lam, class_samples, generator)
                if self.problem.bn_mode == "eval":
                    sq = self._per_sample_sqnorms(batch.x, U)
                else:
                    # Batch statistics couple the samples: f_n depends on the whole batch,
                    # so per-sample forwards would be wrong. Pull back e_n ⊗ u_nk instead.
                    sq = self._coupled_sqnorms(batch.x, U)
                sq = sq.to(torch.float64)  # (B, K, n_params)
                scale = batch.weight / batch.x.shape[0]  # = 1/N
                total += torch.einsum("bk,bkp->p", lam.to(torch.float64), sq) * scale
                columns += U.shape[0] * U.shape[-1]
                if class_samples is not None and class_samples > 1:
                    draws = lam.to(torch.float64) * class_samples * sq.sum(-1)  # (B, K) single-draw estimates
                    variance += (draws.var(dim=1, unbiased=True) / class_samples).sum().item() * scale**2
                if progress is not None:
                    progress(i + 1, self.problem.samples.num_batches)
        stderr = None if class_samples is None else (variance**0.5 if class_samples > 1 else float("nan"))
        return GGNTrace(total, stderr, columns)

    def _per_sample_sqnorms(self, x: Tensor, U: Tensor) -> Tensor:
        """‖J_nᵀ U[n, :, k]‖² per sample, column and parameter tensor: (B, K, n_params).

        From layer inputs and output gradients where every probed parameter sits in a layer
        `layer_sqnorms` covers (one forward, K activation-only backwards), else by
        per-sample VJPs under vmap.
        """
        if self.per_sample == "layers":
            sq = layer_sqnorms(self.problem.model, self.problem.layout, x, U)
            if sq is not None:
                return sq
        return self._vmap_sqnorms(x, U)

    def _vmap_sqnorms(self, x: Tensor, U: Tensor) -> Tensor:
        model, layout = self.problem.model, self.problem.layout
        chosen, frozen = self.problem.split_params()

        def one(xn: Tensor, Un: Tensor) -> Tensor:
            def f(p):
                return functional_call(model, (p, frozen), (xn.unsqueeze(0),)).squeeze(0)

            _, pull = vjp(f, chosen)
            (g,) = vmap(pull)(Un.T)  # dict name -> (K, *shape)
            return torch.stack([g[n].reshape(g[n].shape[0], -1).pow(2).sum(1) for n in layout.names], dim=1)

        per_sample_bytes = U.shape[-1] * layout.dim * x.element_size() * 3
        chunk = max(1, _PER_SAMPLE_BYTES // max(per_sample_bytes, 1))
        try:
            parts = [vmap(one)(x[i : i + chunk], U[i : i + chunk]) for i in range(0, len(x), chunk)]
        except RuntimeError:
            return self._coupled_sqnorms(x, U)  # no vmap rule for some op: exact but slower
        return torch.cat(parts)

    def _coupled_sqnorms(self, x: Tensor, U: Tensor) -> Tensor:
        logits = self.problem.model(x)
        b, c, kk = U.shape
        rows = []
        for n in range(b):
            cot = torch.zeros(kk, b, c, dtype=x.dtype, device=x.device)
            cot[:, n, :] = U[n].T
            grads = self._pullback(logits, self._params, cot)
            rows.append(torch.stack([g.reshape(kk, -1).pow(2).sum(1) for g in grads], dim=1))
        return torch.stack(rows)

    def outputs(self) -> Iterator[tuple[Tensor, Tensor, float]]:
        # the mode is held for each forward only, never across a yield: a caller that stops
        # early, or raises between batches, must not be left with BatchNorm switched or
        # gradients off
        for batch in self.problem.samples:
            with self._mode(), torch.no_grad():
                logits = self.problem.model(batch.x)
            yield logits, batch.y, batch.weight


def _or_zeros(g: Tensor | None, like: Tensor) -> Tensor:
    return g if g is not None else torch.zeros_like(like)


class _Pool:
    """The kept per-batch state of one backend: the bytes it holds, against
    GRAPH_CACHE_BYTES, and the model state it was built on."""

    def __init__(self, state: ModelState):
        self.used = 0
        self.state = state


class _KeptPrefix:
    """Per-batch state (a first-order graph, a vᵀHv primal) kept across calls for batches
    0, 1, … while it fits GRAPH_CACHE_BYTES with the rest of its pool; the rest is rebuilt on
    every call. A single batch's is always kept, since every product needs it. Over several
    batches keeping starts with the second call: a single pass (one Hutchinson block) would
    hold the memory for nothing.
    """

    def __init__(self, pool: _Pool):
        self.pool = pool
        self.items: list = []
        self.bytes = 0
        self.passes = 0
        pool.state.register(self.clear)

    def each(self, samples, build: Callable) -> Iterator:
        """build(batch) → (item, bytes it holds); yields every batch's item, kept or rebuilt."""
        self.pool.state.check()
        self.passes += 1
        n = samples.num_batches
        yield from self.items
        if len(self.items) == n:
            return  # every batch's is kept: the data is not read again
        start = len(self.items)
        for i, batch in enumerate(itertools.islice(samples, start, None), start):
            item, held = build(batch)
            fits = self.passes > 1 and self.pool.used + held <= GRAPH_CACHE_BYTES
            # only right after the kept prefix, so that the kept items stay batches 0, 1, …
            if i == len(self.items) and (n == 1 or fits):
                self.items.append(item)
                self.bytes += held
                self.pool.used += held
            yield item

    def clear(self) -> None:
        self.pool.used -= self.bytes
        self.items, self.bytes = [], 0
