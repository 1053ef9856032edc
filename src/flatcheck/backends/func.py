"""The `func` backend: torch.func transforms, a block of vectors per pass.

- HVP: forward-over-reverse, jvp of grad, vmapped over the block — one traced computation
  per batch for all k vectors instead of k double-backward passes.
- GGN-vector product: J v by jvp (vmapped), A(Jv) in output space, Jᵀ(·) by one vjp whose
  pullback is vmapped — no double backward.
- Blocks are cut into chunks; a CUDA out-of-memory halves the chunk, says so, and retries.

torch.func's second derivative through BatchNorm with batch statistics is wrong (~1.6 %
against finite differences, torch 2.14.1), so in --bn-mode train a model with BatchNorm
gets its Hessian products from the autograd reference instead; first-order transforms
(the GGN path) are exact there and stay on torch.func.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, jvp, vjp, vmap

from ..losses import apply_output_hessian, per_sample_loss
from .autograd import AutogradBackend
from .base import Problem, register_backend

DEFAULT_CHUNK = 16


@register_backend("func")
class FuncBackend(AutogradBackend):
    name = "func"
    capabilities = AutogradBackend.capabilities

    def __init__(self, problem: Problem, chunk: int = DEFAULT_CHUNK):
        super().__init__(problem)
        self.chunk = chunk
        has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in problem.model.modules())
        self.hvp_fallback = problem.bn_mode == "train" and has_bn

    def _as_dicts(self, V: Tensor) -> dict[str, Tensor]:
        return dict(zip(self.problem.layout.names, self.problem.layout.split(V)))

    def _chunked(self, fn, V: Tensor) -> Tensor:
        """fn over row-chunks of V, halving the chunk on CUDA out-of-memory."""
        while True:
            try:
                return torch.cat([fn(V[i : i + self.chunk]) for i in range(0, V.shape[0], self.chunk)])
            except torch.cuda.OutOfMemoryError:
                if self.chunk == 1:
                    raise
                self.chunk = max(1, self.chunk // 2)
                torch.cuda.empty_cache()
                warnings.warn(f"func backend: CUDA out of memory; retrying with {self.chunk} vectors per pass")

    def hvp(self, V: Tensor) -> Tensor:
        if self.hvp_fallback:
            return super().hvp(V)
        model, loss_spec, layout = self.problem.model, self.problem.loss, self.problem.layout
        params, frozen = self._split_params()

        def block(W: Tensor) -> Tensor:
            out = torch.zeros_like(W)
            for batch in self.problem.samples:
                def loss(p):
                    logits = functional_call(model, (p, frozen), (batch.x,))
                    return per_sample_loss(logits, batch.y, loss_spec).mean() * batch.weight

                g = grad(loss)
                hv = vmap(lambda v: jvp(g, (params,), (v,))[1])(self._as_dicts(W))
                out += layout.flatten([hv[n] for n in layout.names], W.shape[0])
            return out

        with self._mode():
            return self._chunked(block, V)

    def ggn_vp(self, V: Tensor) -> Tensor:
        model, loss_spec, layout = self.problem.model, self.problem.loss, self.problem.layout
        params, frozen = self._split_params()

        def block(W: Tensor) -> Tensor:
            out = torch.zeros_like(W)
            for batch in self.problem.samples:
                def f(p):
                    return functional_call(model, (p, frozen), (batch.x,))

                logits, pull = vjp(f, params)
                jv = vmap(lambda v: jvp(f, (params,), (v,))[1])(self._as_dicts(W))  # (k, B, C)
                ajv = apply_output_hessian(logits, batch.y, loss_spec, jv) * (batch.weight / logits.shape[0])
                (g,) = vmap(pull)(ajv)
                out += layout.flatten([g[n] for n in layout.names], W.shape[0])
            return out

        with self._mode():
            return self._chunked(block, V)
