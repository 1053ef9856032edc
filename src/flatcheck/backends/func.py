"""The `func` backend: torch.func transforms, a block of vectors per pass.

- HVP: forward-over-reverse, jvp of grad, vmapped over the block — one traced computation
  per batch for all k vectors instead of k double-backward passes.
- GGN-vector product: J v by jvp (vmapped), A(Jv) in output space, Jᵀ(·) by one vjp whose
  pullback is vmapped — no double backward.
- Blocks are cut into chunks; a CUDA out-of-memory halves the chunk, says so, and retries.
- compile=True (`--compile`) hands the per-batch HVP block to torch.compile; if compiling
  or running the compiled code fails, the backend says why once and goes on eagerly.

torch.func's second derivative through BatchNorm with batch statistics is wrong (~1.6 %
against finite differences, torch 2.14.1), so in --bn-mode train a model with BatchNorm
gets its Hessian products from the autograd reference instead; first-order transforms
(the GGN path) are exact there and stay on torch.func.

Capabilities: the required products and the exact GGN trace (flatcheck.engines.ggn_trace).
Not HvpSums or Vhv: those would be the autograd reference's double backward and tangent
pass, and Hutchinson here takes vmapped (k, P) products instead.
"""

from __future__ import annotations

import warnings
from typing import Callable, Iterator

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vjp, vmap

from ..engines.ggn_trace import ggn_trace
from ..engines.microbatch import BatchPlan, micro_batches, plan_products
from ..report.pulse import Passes
from ..errors import ConfigError, first_line
from ..losses import apply_output_hessian, per_sample_loss
from .autograd import AutogradBackend
from ..problem import Problem, model_mode
from .base import BackendSpec, GGNTrace
from .registry import register_backend

DEFAULT_CHUNK = 16


@register_backend("func", options={"compile": "it compiles the torch.func Hessian-vector product"})
class FuncBackend:
    name = "func"

    def __init__(self, problem: Problem, chunk: int = DEFAULT_CHUNK, compile: bool = False):
        self.problem = problem
        self.spec = BackendSpec(self.name)
        self.chunk = chunk
        has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in problem.model.modules())
        self.hvp_fallback = problem.bn_mode == "train" and has_bn
        # the autograd reference makes the Hessian products the fallback above is for
        self._reference = AutogradBackend(problem) if self.hvp_fallback else None
        self._hv_eager = _hv_block_fn(problem.model, problem.loss)
        # the batch weight is applied outside: a Python float argument would make
        # torch.compile specialise (and recompile) on every distinct weight
        self._hv = torch.compile(self._hv_eager, dynamic=False) if compile and not self.hvp_fallback else None
        self.compile_error: str | None = None
        self.batch_plan: BatchPlan | None = None  # --max-memory's micro-batches (limit_memory)

    def limit_memory(self, allowance: int | None, what: str = "products") -> BatchPlan | None:
        """As AutogradBackend.limit_memory; a vmapped pass carries `chunk` vectors, each with
        its own tangents of the graph, so the chunk is halved first (values are per vector,
        whatever the chunk) until one sample fits."""
        if self._reference is not None:
            self.batch_plan = self._reference.limit_memory(allowance, what)
            return self.batch_plan
        if allowance is None:
            self.batch_plan = None
            return None
        while True:
            try:
                self.batch_plan = plan_products(self.problem, allowance, what, vectors=self.chunk)
                return self.batch_plan
            except ConfigError:
                if self.chunk == 1:
                    raise
                self.chunk = max(1, self.chunk // 2)

    def _hv_block(self, params, frozen, x, y, W: dict[str, Tensor]) -> dict[str, Tensor]:
        if self._hv is not None:
            try:
                return self._hv(params, frozen, x, y, W)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:  # noqa: BLE001  any compiler failure: fall back, say why
                self._hv = None
                self.compile_error = f"{type(exc).__name__}: {first_line(exc)}"
                warnings.warn(f"--compile: torch.compile could not run the HVP ({self.compile_error[:200]}); "
                              "continuing eagerly")
        return self._hv_eager(params, frozen, x, y, W)

    def _mode(self):
        return model_mode(self.problem.model, self.problem.bn_mode)

    def _as_dicts(self, V: Tensor) -> dict[str, Tensor]:
        return dict(zip(self.problem.layout.names, self.problem.layout.split(V)))

    def _chunked(self, fn, V: Tensor) -> Tensor:
        """fn over row-chunks of V (each (rows, P) → (rows, P), V's dtype), halving the chunk on
        CUDA out-of-memory. The chunks are written into one output made first, so the rows
        done never sit in memory twice (a list of chunks and their concatenation), and a retry
        keeps that output: at one vector per pass the need is V, the output and one product."""
        out = torch.empty_like(V)
        while True:
            try:
                for i in range(0, V.shape[0], self.chunk):
                    out[i : i + self.chunk] = fn(V[i : i + self.chunk])
                return out
            except torch.cuda.OutOfMemoryError:
                if self.chunk == 1:
                    raise
                self.chunk = max(1, self.chunk // 2)
                torch.cuda.empty_cache()
                warnings.warn(f"func backend: CUDA out of memory; retrying with {self.chunk} vectors per pass")

    def hvp(self, V: Tensor) -> Tensor:
        if self._reference is not None:
            return self._reference.hvp(V)
        layout = self.problem.layout
        params, frozen = self.problem.split_params()
        passes = Passes(self.problem.samples.n, V.shape[0])  # what a progress display counts within the call

        def block(W: Tensor) -> Tensor:
            out = torch.zeros_like(W)
            for batch in micro_batches(self.problem.samples, self.batch_plan):
                hv = self._hv_block(params, frozen, batch.x, batch.y, self._as_dicts(W))
                out.add_(layout.flatten([hv[n] for n in layout.names], W.shape[0]), alpha=batch.weight)
                passes.add(batch.x.shape[0], W.shape[0])
            return out

        with self._mode():
            return self._chunked(block, V)

    def ggn_vp(self, V: Tensor) -> Tensor:
        model, loss_spec, layout = self.problem.model, self.problem.loss, self.problem.layout
        params, frozen = self.problem.split_params()
        passes = Passes(self.problem.samples.n, V.shape[0])

        def block(W: Tensor) -> Tensor:
            out = torch.zeros_like(W)
            for batch in micro_batches(self.problem.samples, self.batch_plan):
                def f(p):
                    return functional_call(model, (p, frozen), (batch.x,))

                logits, pull = vjp(f, params)
                jv = vmap(lambda v: jvp(f, (params,), (v,))[1])(self._as_dicts(W))  # (k, B, C)
                ajv = apply_output_hessian(logits, batch.y, loss_spec, jv) * (batch.weight / logits.shape[0])
                (g,) = vmap(pull)(ajv)
                out += layout.flatten([g[n] for n in layout.names], W.shape[0])
                passes.add(batch.x.shape[0], W.shape[0])
            return out

        with self._mode():
            return self._chunked(block, V)

    def ggn_trace(self, class_samples: int | None = None, generator: torch.Generator | None = None,
                  progress: Callable[[int, int], None] | None = None) -> GGNTrace:
        """Tr(G) per parameter tensor (flatcheck.engines.ggn_trace)."""
        return ggn_trace(self.problem, class_samples, generator, progress)

    def outputs(self) -> Iterator[tuple[Tensor, Tensor, float]]:
        return self.problem.outputs()


def _hv_block_fn(model: nn.Module, loss_spec):
    """(params, frozen, x, y, {name: (k, *shape)}) → H_batch V for the batch-mean loss.

    A pure function of its tensors (forward-over-reverse, vmapped over the k vectors), so
    torch.compile can trace it whole.
    """

    def hv_block(params, frozen, x, y, W):
        def loss(p):
            return per_sample_loss(functional_call(model, (p, frozen), (x,)), y, loss_spec).mean()

        g = grad(loss)
        return vmap(lambda v: jvp(g, (params,), (v,))[1])(W)

    return hv_block
