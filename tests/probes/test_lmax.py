"""lmax's notes: the advice they give fits the run that gave them."""

from __future__ import annotations

import pytest
import torch

from flatcheck.config import probe_requests
from flatcheck.probes.registry import ProbeContext, create_probe
from tests.probes.test_rank import structured_mlp_case


@pytest.mark.parametrize("dtype, advised", [(torch.float32, True), (torch.float64, False)])
def test_an_unconverged_note_advises_float64_only_where_the_run_is_not(dtype, advised):
    """`lmax … --dtype float64 --max-iter 1` ended its note "raise --max-iter (now 1) or --tol,
    or use --dtype float64" (stranger test): a float64 run has nothing finer to go to."""
    (req,) = probe_requests(["lmax"], {"lmax": {"k": 1, "max_iter": 1, "method": "lanczos"}})
    r = create_probe("lmax").run(ProbeContext(structured_mlp_case(dtype).backend(), seed=0), req.options)
    assert "NOT converged" in r.notes  # the case still exercises the advice
    assert "raise --max-iter (now 1) or --tol" in r.notes
    assert ("--dtype float64" in r.notes) == advised, r.notes


def test_k_past_the_parameters_is_refused_in_the_call_s_keywords():
    """measure() said "use --k ≤ 8 or widen --params" (stranger18); the CLI keeps its flags."""
    import flatcheck
    from flatcheck.errors import ConfigError
    from flatcheck.settings import flag_of

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))  # 8 parameters
    with pytest.raises(ConfigError) as caught:
        flatcheck.measure(model, (torch.randn(8, 3), torch.randint(0, 2, (8,))), probes={"lmax": {"k": 9}})
    assert str(caught.value).startswith("k 9 is more than the 8 probed parameters")
    assert str(caught.value).endswith("use k ≤ 8 or widen params")
    assert caught.value.worded(flag_of).endswith("use --k ≤ 8 or widen --params")


def _trained_gelu_mlp() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A small GELU MLP trained towards a minimum in float64 (a user's model, stranger19):
    its float32 products round to several eps·|λ|, more than a simple model's."""
    g = torch.Generator().manual_seed(1)
    proto = torch.rand(10, 64, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (256,), generator=g)
    x = (proto[y] + 0.3 * torch.randn(256, 64, generator=g, dtype=torch.float64)).clamp(0, 1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.GELU(), torch.nn.Linear(8, 10)).double()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(150):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.float().eval(), x.float(), y


def test_a_float32_bound_at_the_round_off_floor_holds_against_float64():
    """With k = 5 the top value converges far past tol while the others do, and its bound is
    the round-off floor alone: it must cover the float32 products' own error, measured against
    the dense float64 Hessian of the same rounded weights and data (at 4 units of eps it fell
    2.3× short on seed 0: a user's report)."""
    import copy

    import flatcheck
    from torch.func import functional_call

    model, x, y = _trained_gelu_mlp()
    exact = copy.deepcopy(model).double()  # the float32 weights and data, exactly, in float64
    names = [n for n, _ in exact.named_parameters()]
    shapes = [p.shape for _, p in exact.named_parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in exact.parameters()])

    def loss(w):
        parts = dict(zip(names, (c.reshape(s) for c, s in zip(w.split([s.numel() for s in shapes]), shapes))))
        return torch.nn.functional.cross_entropy(functional_call(exact, parts, (x.double(),)), y)

    H = torch.autograd.functional.hessian(loss, flat)
    truth = torch.linalg.eigvalsh((H + H.T) / 2).max().item()
    floored = 0
    for seed in range(8):
        # two starts, as the report had: a wider block stops before the top value reaches the floor
        r = flatcheck.measure(model, (x, y), probes={"lmax": {"k": 5, "starts": 2}}, seed=seed).results["lmax"]
        floored += r.error_bound < 32 * torch.finfo(torch.float32).eps * abs(r.value)
        assert abs(r.value - truth) <= r.error_bound, (seed, r.value, truth, r.error_bound)
    assert floored >= 4  # the case is the floor's: most bounds are at it


def test_the_default_block_is_one_wider_than_k():
    """Two starts for λmax; k + 1 for more eigenvalues, so the k-th value's gap has a direction
    of its own (probes/lmax.py DEFAULT_STARTS); a given --starts is kept, and the cap holds."""
    from flatcheck.probes.lmax import MAX_STARTS, LmaxOptions

    assert LmaxOptions().resolved_starts == 2
    assert LmaxOptions(k=2).resolved_starts == 3
    assert LmaxOptions(k=5).resolved_starts == 6
    assert LmaxOptions(k=40).resolved_starts == MAX_STARTS
    assert LmaxOptions(k=3, starts=2).resolved_starts == 2
    assert LmaxOptions(k=1, starts=1).resolved_starts == 1
