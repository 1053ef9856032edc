"""Warm-start analysis for the tracker's λmax: which start needs the fewest
products to relative residual 1e-3 on the demo CNN's real training trajectory.

The trajectory is bench_tracker's (examples/track_training.py's loop: full-batch gradient
descent on the bundled digits, BatchNorm on the batch's statistics); the weights of every
tracked step are kept and each start is tried on the same operator the probe uses
(CurvatureOperator over the tracker's session). Every start runs the same solver: Rayleigh–Ritz
over a subspace that begins as the start vectors and grows by the top Ritz pair's residual, one
product per new vector (for one start vector this is Lanczos: the residuals span the Krylov
space). The residual test uses the products taken (HW is kept), so the count is every product:
a start subspace of m vectors costs m before its first test. Cold is lanczos_top from the
probe's random start (seed 0) with its check product, as the probe counts it.

    python benchmarks/analysis_warm_start.py [--steps 200] [--every 10] [--lr 0.1] [--samples 500]
        [--methods prev,lin,...] [--sources exact,chain,lanczos] [--diagnose]
        [--block default,safety1,nonoise,safety1-nonoise]

Results and what they mean: benchmarks/results/tracker.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import track_training  # noqa: E402

from flatcheck.live import open_live_session  # noqa: E402
from flatcheck.linalg.lanczos import lanczos_top  # noqa: E402
from flatcheck.operators import CurvatureOperator  # noqa: E402
from flatcheck.zoo.demo_cnn import DigitsCNN  # noqa: E402

TOL = 1e-3


def trajectory(lr: float, steps: int, every: int, samples: int, seed: int = 0):
    """The model, its data and the parameters at every tracked step (the example's loop)."""
    x, y = track_training.digits(samples)
    torch.manual_seed(seed)
    model = DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    snaps = {}
    for step in range(steps + 1):
        model.train()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        if step % every == 0:
            snaps[step] = [p.detach().clone() for p in model.parameters()]
        if step < steps:
            loss.backward()
            opt.step()
    return model, (x, y), snaps


def load(model: nn.Module, snap) -> None:
    with torch.no_grad():  # in place: the version counters tell the backend its caches are stale
        for p, s in zip(model.parameters(), snap):
            p.copy_(s)


def relative_residual(op, v: torch.Tensor) -> float:
    """‖Hv − θv‖/|θ| of the unit v (an analysis product, not counted against any start)."""
    v = v / v.norm()
    Hv = op.matmat(v.unsqueeze(0))[0]
    theta = torch.dot(v, Hv)
    return float((Hv - theta * v).norm() / theta.abs())


def subspace_solve(op, starts: list[torch.Tensor], tol: float = TOL, limit: int = 60):
    """Rayleigh–Ritz over span(starts) grown by the top Ritz pair's residual; stops when that
    residual (from the products taken) is ≤ tol·|θ|. Returns (products, θ, unit Ritz vector,
    residual after the start subspace alone)."""
    W = []
    for s in starts:  # orthonormal, twice Gram–Schmidt; a dependent start is dropped
        w = s.to(op.dtype).clone()
        for _ in range(2):
            for q in W:
                w -= torch.dot(q, w) * q
        if w.norm() > 1e-6 * s.norm():
            W.append(w / w.norm())
    Wt = torch.stack(W)
    HW = op.matmat(Wt)
    products, first = Wt.shape[0], None
    while True:
        M = (Wt.double() @ HW.double().T)
        M = (M + M.T) / 2
        evals, evecs = torch.linalg.eigh(M)
        theta, s = float(evals[-1]), evecs[:, -1].to(op.dtype)
        x = s @ Wt
        r = s @ HW - theta * x
        rel = float(r.norm() / abs(theta))
        first = rel if first is None else first
        if rel <= tol or products >= limit:
            return products, theta, x / x.norm(), first
        w = r.clone()
        for _ in range(2):
            w -= (Wt @ w) @ Wt
        Wt = torch.cat([Wt, (w / w.norm()).unsqueeze(0)])
        HW = torch.cat([HW, op.matmat(Wt[-1:])])
        products += 1


def aligned(history: list[torch.Tensor]) -> list[torch.Tensor]:
    """The history's vectors with signs flipped so each overlaps the next positively."""
    out = [history[-1]]
    for v in reversed(history[:-1]):
        out.insert(0, v if torch.dot(v, out[0]) >= 0 else -v)
    return out


def starts_for(method: str, hist: list[torch.Tensor], ritz_prev: torch.Tensor | None) -> list[torch.Tensor]:
    h = aligned(hist)
    h1 = h[-1]
    h2 = h[-2] if len(h) > 1 else None
    h3 = h[-3] if len(h) > 2 else None
    if method == "prev" or h2 is None:
        if method.startswith("ritz"):
            return list(ritz_prev[:int(method[-1])])
        return [h1]
    if method == "lin":  # v_t + (v_t − v_{t−1})
        return [2 * h1 - h2]
    if method == "lin_half":
        return [1.5 * h1 - 0.5 * h2]
    if method in ("lin125", "lin150"):
        c = int(method[3:]) / 100
        return [h1 + c * (h1 - h2)]
    if method == "lin_adapt":  # the factor that would have predicted the last step from the two before
        if h3 is None:
            return [2 * h1 - h2]
        d = h2 - h3
        c = float(torch.dot(h1 - h2, d) / torch.dot(d, d))
        return [h1 + c * (h1 - h2)]
    if method.startswith("lin_guard"):  # extrapolate only while the eigenvector moved little
        return [2 * h1 - h2] if float(torch.dot(h1, h2)) >= 0.9 else [h1]
    if method == "quad":
        return [3 * h1 - 3 * h2 + h3] if h3 is not None else [2 * h1 - h2]
    if method == "fit3":  # least-squares line through the last three, one step on
        return [(4 * h1 + h2 - 2 * h3) / 3] if h3 is not None else [2 * h1 - h2]
    if method == "rr2":
        return [h1, h2]
    if method == "rr3":
        return [h1, h2] + ([h3] if h3 is not None else [])
    if method == "ritz3":  # the previous weights' top three eigenvectors (best case: accurate)
        return list(ritz_prev[:3])
    if method == "ritz2":
        return list(ritz_prev[:2])
    raise ValueError(method)


METHODS = ("prev", "lin", "lin_half", "quad", "fit3", "rr2", "rr3", "ritz2", "ritz3")


def block_variant(op, model, snaps, steps, variant: str, truth: dict, cold: dict, cold_every: int = 10) -> None:
    """linalg/warm_block.block_top chained over the tracked steps as the Tracker does it (the top
    vector extrapolated, a cold lanczos_top every cold_every-th step), with the gap undivided
    (safety1) and/or no random part (nonoise); products per warm step and how many values lie
    within their bound of the reference λ1."""
    from flatcheck.linalg import warm_block
    from flatcheck.workflows.track import extrapolated_start

    saved = warm_block.BLOCK_GAP_SAFETY, warm_block.WARM_MIX
    if "safety1" in variant:
        warm_block.BLOCK_GAP_SAFETY = 1.0
    if "nonoise" in variant:
        warm_block.WARM_MIX = 0.0
    try:
        out, held, previous = [], None, None
        for i, step in enumerate(steps):
            load(model, snaps[step])
            if i % cold_every == 0:
                c = lanczos_top(op, 1, generator=torch.Generator().manual_seed(0), tol=TOL, carry_next=True)
                held, previous = torch.cat([c.vectors, c.next_vector[None]]), None
                continue
            start = held.clone()
            if previous is not None:
                start[:1] = extrapolated_start(previous[:1], held[:1])
            before = op.matvecs
            res = warm_block.block_top(op, 1, start, generator=torch.Generator().manual_seed(0), tol=TOL)
            previous, held = held, torch.cat([res.vectors, res.next_vector[None]])
            within = abs(res.values[0] - truth[step]) <= res.bounds[0].value + 1e-4 * TOL * abs(truth[step])
            out.append((op.matvecs - before, cold[step][0], within))
    finally:
        warm_block.BLOCK_GAP_SAFETY, warm_block.WARM_MIX = saved
    ratios = [n / c for n, c, _ in out]
    print(f"block {variant:16s} products {[n for n, *_ in out]} median {statistics.median(n for n, *_ in out):g} "
          f"vs cold {statistics.median(c for _, c, _ in out):g}; median ratio {statistics.median(ratios):.2f}; "
          f"≤1/3: {sum(r <= 1 / 3 for r in ratios)}/{len(ratios)}; within the bound of the reference λ1: "
          f"{sum(w for *_, w in out)}/{len(out)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--diagnose", action="store_true", help="where u_t lies against the earlier top-10")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--sources", default="exact,chain", help="exact, chain, lanczos (chain through lanczos_top)")
    ap.add_argument("--block", default="", help="the Tracker's block solver along the run, as the Tracker chains it "
                    "(cold every 10th tracked step): any of default, safety1, nonoise, safety1-nonoise")
    args = ap.parse_args()
    model, data, snaps = trajectory(args.lr, args.steps, args.every, args.samples)
    session = open_live_session(model, data, probes=["lmax"], options={"lmax": {"k": 1, "tol": TOL}},
                                batch_size=len(data[0]), bn_mode="train")
    op = CurvatureOperator(session.backend, "hessian")
    steps = sorted(snaps)
    exact, exact3, cold, exact_values = {}, {}, {}, {}
    for step in steps:
        load(model, snaps[step])
        ref = lanczos_top(op, 10, generator=torch.Generator().manual_seed(1), tol=1e-4)
        exact[step], exact3[step] = ref.vectors[0], ref.vectors
        exact_values[step] = ref.values[0]
        c = lanczos_top(op, 1, generator=torch.Generator().manual_seed(0), tol=TOL)
        cold[step] = (c.matvecs, c.values[0])
        print(f"step {step}: λ1..3 {', '.join(f'{v:.5g}' for v in ref.values)}; cold {c.matvecs} products",
              flush=True)
    # where the top eigenvector went: the part of u_t outside the previous step's top-m eigenvectors
    for i, step in enumerate(steps[1:] if args.diagnose else [], 1):
        V, u = exact3[steps[i - 1]], exact[step]
        outside = [float(1 - (V[:m] @ u).norm() ** 2) ** 0.5 for m in (1, 2, 3, 5, 10)]
        print(f"step {step}: |u_t outside span(top-m of t-1)| for m=1,2,3,5,10: "
              f"{' '.join(f'{o:.3f}' for o in outside)}", flush=True)
    for variant in filter(None, args.block.split(",")):
        block_variant(op, model, snaps, steps, variant, {s: exact_values[s] for s in steps}, cold)
    # per method: 'exact' uses the reference eigenvectors of the earlier steps, 'chain' the
    # vectors the method itself converged to (what a tracker holds)
    for method in filter(None, args.methods.split(",")):
        for source in args.sources.split(","):
            chain: list[torch.Tensor] = []
            out = []
            for i, step in enumerate(steps):
                load(model, snaps[step])
                if i == 0:
                    _, _, vec, _ = subspace_solve(op, [exact[step]])  # converged start for the chain
                    chain.append(vec)
                    continue
                hist = ([exact[s] for s in steps[:i]] if source == "exact" else chain)[-3:]
                st = starts_for(method, hist, exact3[steps[i - 1]])
                start_res = relative_residual(op, st[0]) if len(st) == 1 else None
                overlap = abs(float(torch.dot(st[0] / st[0].norm(), exact[step]))) if len(st) == 1 else None
                if source == "lanczos":  # the probe's own solver: WARM_MIX random part, residual from products
                    before = op.matvecs
                    res = lanczos_top(op, 1, generator=torch.Generator().manual_seed(0), tol=TOL, start=st[0].unsqueeze(0))
                    n, theta, vec, first = op.matvecs - before, res.values[0], res.vectors[0], float("nan")
                else:
                    n, theta, vec, first = subspace_solve(op, st)
                assert abs(theta - cold[step][1]) <= 2 * TOL * abs(theta), (method, step, theta, cold[step])
                chain.append(vec)
                out.append((step, n, cold[step][0], start_res, overlap, first))
            ratios = [n / c for _, n, c, *_ in out]
            print(f"{method:9s} {source:5s} products {[n for _, n, *_ in out]} median {statistics.median(n for _, n, *_ in out):g}"
                  f" vs cold {statistics.median(c for _, _, c, *_ in out):g}; median ratio {statistics.median(ratios):.2f};"
                  f" ≤1/3: {sum(r <= 1 / 3 for r in ratios)}/{len(ratios)}", flush=True)
            print(f"          start rel. residual {' '.join('-' if r is None else f'{r:.1e}' for *_, r, _, _ in out)}")
            print(f"          overlap with u_t    {' '.join('-' if o is None else f'{o:.4f}' for *_, o, _ in out)}")
            print(f"          residual after the start subspace {' '.join(f'{f:.1e}' for *_, f in out)}")


if __name__ == "__main__":
    main()
