"""Matrix-free norms of per-sample Jacobians J = ∂f/∂t (t = the input x, a layer's input h or
its output z) for models whose C × D Jacobian rows cannot be held (1,000 classes, 150k-value
token inputs per layer): only products with J and Jᵀ, batched over the samples of a chunk.

- Jᵀu: one reverse pass from the outputs with cotangent u (every tapped t at once).
- J v: the double-VJP trick — g(w) = Jᵀw is linear in w, so ∂⟨g(w), v⟩/∂w = J v; it needs
  reverse mode only, which every op of a model supports (forward-mode AD does not cover all).
- ‖J‖₂ by Lanczos on the C × C matrix J Jᵀ (Krylov vectors live in the C-dimensional output
  space), full reorthogonalisation, per sample: a sample is frozen the iteration its relative
  residual ‖JJᵀy − θy‖/θ falls below the tolerance, so its value does not depend on which
  other samples share its chunk. Error bound: for symmetric A a Ritz pair (θ, y) with residual r
  has an eigenvalue within r of θ, so |√θ − σ| ≤ r/√θ if that eigenvalue is the top one (Lanczos
  from a random start finds the top one first, barring an exactly orthogonal start).
- ‖J‖²_F = Tr(JJᵀ) = E‖Jᵀr‖² and Tr((JJᵀ)²) = E‖JJᵀr‖² for Rademacher r (Hutchinson), the
  draws shared by every tap.

Random vectors come from one generator per (seed, sample index, stream), so values do not
depend on the chunking either. Callers set the model mode and check `require_independent`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import Tensor, nn

from ..engines.microbatch import saved_bytes
from ..errors import ConfigError
from ..linalg.memory import chunk_size, gib, memory_limit
from ._hooks import Call, record
from ._inputjac import AUTO_MAX_CLASSES, ROW_BYTES, Output, apply_output
from .kit import SampleBudget, option

# streams of the per-sample generators
LANCZOS_STREAM, PROBE_STREAM = 1, 2


def sample_generator(seed: int, index: int, stream) -> torch.Generator:
    """The generator of one sample's draws: fixed by the run's seed, the sample's position in
    the sample set and the stream, whatever the batching or chunking. (Python hashes tuples
    of ints deterministically.)"""
    return torch.Generator().manual_seed(hash((seed, index, stream)) & (2**63 - 1))


def rademacher(seed: int, first: int, count: int, dim: int, stream, draws: int = 1) -> Tensor:
    """(draws, count, dim) float64 ±1, sample `first + i` from its own generator."""
    out = torch.empty(draws, count, dim, dtype=torch.float64)
    for i in range(count):
        g = sample_generator(seed, first + i, stream)
        out[:, i] = torch.randint(0, 2, (draws, dim), generator=g).to(torch.float64) * 2 - 1
    return out


def gaussian(seed: int, first: int, count: int, dim: int, stream) -> Tensor:
    """(count, dim) float64 standard normal, sample `first + i` from its own generator."""
    return torch.stack([torch.randn(dim, generator=sample_generator(seed, first + i, stream), dtype=torch.float64)
                        for i in range(count)])


def twice_differentiable():
    """Attention by its math kernel: the fused CPU kernels (flash attention) have no
    derivative of their backward, which J v by the double-VJP trick needs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


class JacobianProducts:
    """One forward of a chunk with the tapped calls recorded, and products with the Jacobians of
    the outputs with respect to x and the tapped layers' inputs (`tap_inputs`) or outputs.

    Holds the forward graph and, after `enable_jv`, the graph of g(w) = Jᵀw (create_graph),
    about three forwards' worth of saved tensors for the chunk."""

    def __init__(self, model: nn.Module, x: Tensor, output: Output, taps: list[tuple[str, nn.Module]],
                 tap_outputs: bool = False):
        self.x = x.detach().requires_grad_(True)
        with torch.enable_grad(), twice_differentiable():
            with record(list(taps)) as rec:  # hooks off after the forward; the calls stay recorded
                self.logits = model(self.x)
            self.out = apply_output(self.logits, output)
        self.calls: list[Call] = list(rec.calls)
        # the tensors J is taken with respect to: x, each call's input, then (tap_outputs) each output
        self.targets: list[Tensor] = [self.x] + [c.input for c in self.calls] + (
            [c.output for c in self.calls] if tap_outputs else [])
        self._g: list[Tensor | None] | None = None
        self._w: Tensor | None = None
        self.backward_passes = 0  # batched reverse passes, double-VJP ones included

    def input_index(self, i: int) -> int:
        return 1 + i

    def output_index(self, i: int) -> int:
        return 1 + len(self.calls) + i

    @property
    def num_classes(self) -> int:
        return self.out.shape[1]

    def vjp(self, u: Tensor, which: list[int]) -> list[Tensor]:
        """J_tᵀ u for the targets `which` (zero where the output does not depend on one)."""
        with torch.enable_grad():
            grads = torch.autograd.grad(self.out, [self.targets[i] for i in which],
                                        u.to(device=self.out.device, dtype=self.out.dtype),
                                        retain_graph=True, allow_unused=True)
        self.backward_passes += 1
        return [torch.zeros_like(self.targets[i]) if g is None else g for g, i in zip(grads, which)]

    def enable_jv(self) -> None:
        if self._g is not None:
            return
        with torch.enable_grad():
            self._w = torch.zeros_like(self.out, requires_grad=True)
            self._g = list(torch.autograd.grad(self.out, self.targets, self._w, create_graph=True,
                                               allow_unused=True))
        self.backward_passes += 1

    def jv(self, i: int, v: Tensor) -> Tensor:
        """J_t v for target i, (B, C) in float64; zero when f does not depend on t."""
        self.enable_jv()
        g = self._g[i]
        if g is None or not g.requires_grad:
            return torch.zeros(self.out.shape, dtype=torch.float64, device=self.out.device)
        with torch.enable_grad():
            (jv,) = torch.autograd.grad(g, self._w, v.to(device=g.device, dtype=g.dtype), retain_graph=True,
                                        allow_unused=True)
        self.backward_passes += 1
        return torch.zeros(self.out.shape, dtype=torch.float64, device=self.out.device) if jv is None \
            else jv.to(torch.float64)

    def gram(self, i: int) -> Callable[[Tensor], Tensor]:
        """u ↦ J_t J_tᵀ u on (B, C) float64."""
        def apply(u: Tensor) -> Tensor:
            (jt_u,) = self.vjp(u, [i])
            if jt_u is None:
                return torch.zeros_like(u)
            return self.jv(i, jt_u)

        return apply

    def close(self) -> None:
        self._g = self._w = None


@dataclass
class LanczosNorms:
    sigma: Tensor  # (B,) float64: √θ, θ the top Ritz value of J Jᵀ
    error: Tensor  # (B,) float64: r/√θ, the bound on |√θ − σ_max| (0 when θ = r = 0)
    residual: Tensor  # (B,) relative residual r/θ at the returned value
    iterations: Tensor  # (B,) iterations each sample used
    converged: Tensor  # (B,) bool: relative residual ≤ tol (or the Krylov space exhausted)


def lanczos_sigma(apply: Callable[[Tensor], Tensor], start: Tensor, max_iters: int, tol: float,
                  should_stop: Callable[[], bool] | None = None) -> LanczosNorms:
    """σ_max of each sample's J from Lanczos on J Jᵀ; start: (B, C) float64 random vectors."""
    b, c = start.shape
    tiny = torch.finfo(torch.float64).tiny
    q = start / start.norm(dim=1, keepdim=True).clamp_min(tiny)
    basis = [q]
    alphas: list[Tensor] = []
    betas: list[Tensor] = []
    sigma = torch.zeros(b, dtype=torch.float64)
    error = torch.zeros(b, dtype=torch.float64)
    residual = torch.zeros(b, dtype=torch.float64)
    iterations = torch.zeros(b, dtype=torch.long)
    done = torch.zeros(b, dtype=torch.bool)
    converged = torch.zeros(b, dtype=torch.bool)
    scale = torch.zeros(b, dtype=torch.float64)
    for k in range(min(max_iters, c)):
        w = apply(basis[-1]).cpu()
        a = (w * basis[-1]).sum(1)
        alphas.append(a)
        Q = torch.stack(basis, 1)  # (B, k+1, C)
        for _ in range(2):  # full reorthogonalisation, twice is enough (Parlett's "twice is enough")
            w = w - torch.einsum("bkc,bk->bc", Q, torch.einsum("bkc,bc->bk", Q, w))
        beta = w.norm(dim=1)
        T = torch.diag_embed(torch.stack(alphas, 1))
        if betas:
            off = torch.stack(betas, 1)
            T = T + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)
        evals, evecs = torch.linalg.eigh(T)
        theta = evals[:, -1].clamp_min(0)
        r = (beta * evecs[:, -1, -1]).abs()
        scale = torch.maximum(scale, a.abs())
        exhausted = (beta <= 1e-13 * scale) | (k + 1 == c)  # an invariant subspace: θ exact
        rel = torch.where(theta > 0, r / theta.clamp_min(tiny), torch.where(r > 0, torch.inf, 0.0))
        now = ~done & ((rel <= tol) | exhausted)
        last = k + 1 == min(max_iters, c) or (should_stop is not None and should_stop())
        take = now | (~done & torch.tensor(last))
        r_used = torch.where(exhausted, torch.zeros_like(r), r)
        sigma = torch.where(take, theta.sqrt(), sigma)
        error = torch.where(take, torch.where(theta > 0, r_used / theta.sqrt().clamp_min(tiny), r_used.sqrt()), error)
        residual = torch.where(take, torch.where(exhausted, torch.zeros_like(rel), rel), residual)
        iterations = torch.where(take, torch.full_like(iterations, k + 1), iterations)
        converged |= now
        done |= take
        if bool(done.all()):
            break
        betas.append(beta)
        basis.append(torch.where((beta > 0).unsqueeze(1), w / beta.clamp_min(tiny).unsqueeze(1), torch.zeros_like(w)))
    return LanczosNorms(sigma, error, residual, iterations, converged)


@dataclass
class Hutchinson:
    """Per-sample draws t_k (B, K) of an unbiased estimator; mean and its standard error."""

    draws: Tensor

    @property
    def mean(self) -> Tensor:
        return self.draws.mean(1)

    @property
    def stderr(self) -> Tensor:
        k = self.draws.shape[1]
        return self.draws.var(1, unbiased=True).sqrt() / math.sqrt(k)


def local_dimension(t1: Tensor, t2: Tensor) -> tuple[Tensor, Tensor]:
    """(Tr JJᵀ)² / Tr((JJᵀ)²) per sample from paired draws t1, t2 (B, K), with the delta-method
    standard error from their sample covariance (the ratio of means is consistent, its bias
    O(1/K) is below the standard error)."""
    k = t1.shape[1]
    m1, m2 = t1.mean(1), t2.mean(1)
    tiny = torch.finfo(torch.float64).tiny
    ld = m1.pow(2) / m2.clamp_min(tiny)
    d1, d2 = 2 * m1 / m2.clamp_min(tiny), -m1.pow(2) / m2.pow(2).clamp_min(tiny)
    c1, c2 = t1 - m1.unsqueeze(1), t2 - m2.unsqueeze(1)
    var = ((d1.unsqueeze(1) * c1 + d2.unsqueeze(1) * c2).pow(2).sum(1) / (k - 1)) / k
    return ld, var.sqrt()


def graph_bytes(model: nn.Module, x: Tensor, output: Output) -> int:
    """Bytes of the tensors one forward of `x` saves for backward (each storage once): what a
    reverse pass over this input holds, measured instead of guessed."""
    xg = x.detach().requires_grad_(True)
    with twice_differentiable():
        return saved_bytes(lambda: apply_output(model(xg), output))


@dataclass(frozen=True)
class MatrixFreeOptions:
    """The route options mls and decomposition share (their Options derive from this)."""

    method: Literal["auto", "exact", "estimate"] = option(
        "auto", "auto, exact (all C rows of every Jacobian, C backward passes) or estimate (matrix-free: "
        "Lanczos and Hutchinson); auto takes exact for C ≤ 128 when one sample's rows fit --max-memory")
    projections: int = option(32, "Rademacher draws per sample of the Hutchinson estimates (estimate)")
    lanczos_iters: int = option(60, "most Lanczos iterations per sample and Jacobian for a spectral norm (estimate)")
    lanczos_tol: float = option(1e-3, "Lanczos stops at relative residual ‖JJᵀy − θy‖/θ ≤ TOL, a bound on the "
                                      "relative error of σ_max (estimate)")

    def __post_init__(self):
        if self.projections < 2:
            raise ConfigError(f"projections must be at least 2 (a standard error needs two draws), got {self.projections}")
        if self.lanczos_iters < 1 or not (math.isfinite(self.lanczos_tol) and self.lanczos_tol > 0):
            raise ConfigError(f"lanczos_iters must be ≥ 1 and lanczos_tol > 0, got {self.lanczos_iters} and "
                              f"{self.lanczos_tol}")


@dataclass
class Plan:
    route: str  # "exact" | "estimate"
    chunk: int  # samples per chunk
    num_classes: int
    limit: int | None  # bytes allowed
    per_sample: int  # bytes one sample of the chosen route takes (estimated)
    graph: int  # bytes one sample's forward graph saves
    reason: str = ""  # why this route: asked for, or what auto weighed

    def details(self) -> dict:
        return {"route": self.route, "route_reason": self.reason, "chunk_samples": self.chunk,
                "memory_limit_bytes": self.limit, "memory_per_sample_bytes": self.per_sample}


def plan(model: nn.Module, x1: Tensor, output: Output, taps: list[tuple[str, nn.Module]], method: str,
         max_memory: int | None, probe: str, tap_outputs: bool = False) -> Plan:
    """The route (exact when asked, or for auto when C ≤ AUTO_MAX_CLASSES and one sample's rows
    fit) and how many samples a chunk holds under --max-memory; refuses (exit 2) up front a route
    that cannot fit one sample. x1: one sample, (1, *x)."""
    with torch.no_grad(), record(list(taps)) as rec:
        num_classes = model(x1).shape[1]
    width = x1.numel() + sum(c.input.numel() + (c.output.numel() if tap_outputs else 0) for c in rec.calls)
    graph = graph_bytes(model, x1, output)
    # exact: the rows in the model's dtype and their float64 copy (twice, for the SVD's workspace)
    exact = graph + num_classes * width * (x1.element_size() + 16)
    # estimate: the forward graph, the create_graph reverse pass over it (about twice as much),
    # a few target-sized vectors; Krylov and probe vectors are C-sized
    estimate = 3 * graph + 4 * width * 8
    limit = memory_limit(x1.device, max_memory)
    reason = f"method={method}"
    if method == "auto":
        room = limit if limit is not None else ROW_BYTES
        # a cap can turn a small model's route to the estimate: its values then move within
        # their error bounds, and the log-volume is null; the reason says it was the memory
        where = "--max-memory" if max_memory is not None else "the default limit" if limit is not None \
            else "the row budget"
        if num_classes > AUTO_MAX_CLASSES:
            method, reason = "estimate", f"auto: {num_classes} classes > {AUTO_MAX_CLASSES}"
        elif exact > room:
            method, reason = "estimate", (f"auto: one sample's exact rows need {gib(exact)}, more than {where} "
                                          f"allows ({gib(room)})")
        else:
            method, reason = "exact", (f"auto: {num_classes} classes ≤ {AUTO_MAX_CLASSES} and one sample's rows "
                                       f"({gib(exact)}) fit {where} ({gib(room)})")
    per_sample = exact if method == "exact" else estimate
    chunk = chunk_size(per_sample, limit, f"probe {probe} ({method} route, {num_classes} classes)")
    return Plan(method, chunk, num_classes, limit, per_sample, graph, reason)


def iter_chunks(problem, chunk: int, budget: SampleBudget | None = None,
                progress: Callable[[int, int], None] | None = None):
    """(index of the chunk's first sample in the sample set, x, y) for chunks of at most
    `chunk` samples of every batch, in order; `budget` caps the chunk and may end the loop
    before a chunk. `progress(samples done, samples)` after each chunk, as iter_rows reports:
    a loop the budget ends is never reported complete."""
    first = done = 0
    for batch in problem.samples:
        start = 0
        while start < batch.x.shape[0]:
            step = chunk
            if budget is not None:
                if budget.ends(first + start, problem.samples.n):
                    return
                step = budget.chunk(chunk, first + start)
            yield first + start, batch.x[start:start + step], batch.y[start:start + step]
            taken = min(step, batch.x.shape[0] - start)
            start += taken
            done += taken
            if progress is not None:
                progress(done, problem.samples.n)
        first += batch.x.shape[0]
