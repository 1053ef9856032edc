"""--max-memory: the Jacobian probes chunk their samples to fit it with values that do
not depend on the chunking (float64, 1e-12), refuse up front (exit 2, the size they would need)
when one sample cannot fit, and the flag is parsed at the edge."""

from __future__ import annotations

import math

import pytest
from torch import nn

from tests.support.dense import make_case
from flatcheck.backends import ParamLayout
from flatcheck.problem import Problem
from flatcheck.config import RunConfig, probe_requests
from flatcheck.errors import ConfigError
from flatcheck.linalg.memory import parse_bytes
from flatcheck.settings import flag_of
from flatcheck.models.spec import LossSpec
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options
from tests.support.cli import CKPT, SPEC, bad
from tests.support.cli import invoke

pytestmark = pytest.mark.workflow  # whole workflows, seconds each: make test-all only


def run(case, probe, max_memory=None, **opts):
    ctx = ProbeContext(case.backend(), seed=0, memory_allowance=max_memory)
    return create_probe(probe).run(ctx, parse_options(probe, opts))


def numbers(d, prefix=""):
    """Every number in a details dict, by path (the chunking's own entries left out)."""
    out = {}
    for k, v in d.items():
        if k in ("chunk_samples", "memory_limit_bytes", "backward_passes"):
            continue
        if isinstance(v, dict):
            out.update(numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
            out[prefix + k] = float(v)
    return out


@pytest.mark.parametrize("probe,method", [("mls", "exact"), ("mls", "estimate"),
                                          ("decomposition", "exact"), ("decomposition", "estimate")])
def test_values_do_not_depend_on_the_chunking(probe, method):
    case = make_case("cnn")  # float64, batches of 10 over 23 samples
    whole = run(case, probe, max_memory=2**40, method=method)
    per_sample = whole.details["memory_per_sample_bytes"]
    assert whole.details["chunk_samples"] >= 10
    # room for exactly one sample, then for three: chunks of 1 and of 3, 3, 3, 1 per batch
    for room, chunk in ((per_sample, 1), (3 * per_sample + 1, 3)):
        small = run(case, probe, max_memory=room, method=method)
        assert small.details["chunk_samples"] == chunk
        a, b = numbers(whole.details), numbers(small.details)
        assert a.keys() == b.keys()
        for key in a:
            if key == "memory_per_sample_bytes":
                continue
            assert math.isclose(a[key], b[key], rel_tol=1e-12, abs_tol=1e-300), (key, a[key], b[key])
        if whole.stderr is not None:
            assert math.isclose(whole.stderr, small.stderr, rel_tol=1e-12)


@pytest.mark.parametrize("probe", ["mls", "decomposition"])
@pytest.mark.parametrize("method", ["exact", "estimate"])
def test_refused_up_front_when_one_sample_cannot_fit(probe, method):
    case = make_case("mlp")
    need = run(case, probe, max_memory=2**40, method=method).details["memory_per_sample_bytes"]
    with pytest.raises(ConfigError, match=f"probe {probe} \\({method} route.*needs about .* GiB even one at a time"):
        run(case, probe, max_memory=need - 1, method=method)


def test_auto_takes_the_estimate_route_when_the_rows_do_not_fit():
    case = make_case("mlp")
    wide = nn.Sequential(nn.Flatten(), nn.Linear(12, 100)).double()  # 100 classes: exact unless it cannot fit
    case.problem = Problem(wide, LossSpec(), case.problem.samples, ParamLayout.from_model(wide))
    exact = run(case, "mls", max_memory=2**40)
    assert exact.details["route"] == "exact" and exact.details["route_reason"].startswith("auto: 100 classes ≤ 128")
    need = exact.details["memory_per_sample_bytes"]
    # the estimate route holds no C × D rows: it fits where the exact route's one sample does not,
    # and says that the cap chose it (a stranger saw the log-volume go null with no word why)
    capped = run(case, "mls", max_memory=need - 1, lanczos_tol=1e-10).details
    assert capped["route"] == "estimate" and capped["log_volume"] is None
    assert "exact rows need" in capped["route_reason"] and "--max-memory" in capped["route_reason"]
    assert abs(capped["mls"] - exact.details["mls"]) <= capped["mls_error_bound"] + 1e-12 * capped["mls"]


@pytest.mark.parametrize("text,value", [("8G", 8 * 2**30), ("512M", 512 * 2**20), ("1.5GiB", int(1.5 * 2**30)),
                                        ("2GB", 2 * 10**9), ("4096", 4096), (" 64k ", 64 * 2**10)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "8X", "-1G", "0"])
def test_parse_bytes_refuses(text):
    with pytest.raises(ConfigError, match="^max_memory ") as refused:  # the setting; the CLI says its flag
        parse_bytes(text)
    assert refused.value.worded(flag_of).startswith("--max-memory ")


def test_run_config_parses_it():
    config = RunConfig(checkpoint=None, spec=SPEC, probes=probe_requests("gini"), max_memory="1G")
    assert config.max_memory == 2**30


@pytest.fixture
def nothing_held(monkeypatch):
    """The process's own memory read as 0, so a tiny --max-memory reaches the probe's planning
    whole (that the process's memory counts is tested on its own)."""
    monkeypatch.setattr("flatcheck.api.resident_bytes", lambda device: 0)


def test_cli_exit_2_with_the_size_needed(nothing_held):
    result = invoke("mls", CKPT, "--spec", SPEC, "--samples", "4", "--batch-size", "4", "--max-memory", "1K")
    err = bad(result, "--max-memory", "needs about")
    assert "probe mls" in err


def test_cli_bad_value_is_one_line_exit_2():
    bad(invoke("gini", CKPT, "--spec", SPEC, "--samples", "4", "--max-memory", "lots"), "--max-memory")


# ---------------------------------------------------------------- curvature probes (trace, lmax, spectrum, rank)

import torch  # noqa: E402

from tests.support.dense import DenseOperator, dense  # noqa: E402
from flatcheck.engines.microbatch import GRAPH_FACTOR, forward_bytes_per_sample  # noqa: E402
from flatcheck.linalg.lanczos import Lanczos, lanczos_bytes, plan_steps  # noqa: E402
from flatcheck.linalg.trace import hutchinson, plan_block  # noqa: E402
from flatcheck.linalg.thick_restart import restart_bytes  # noqa: E402


def per_sample_graph(case) -> int:
    return GRAPH_FACTOR * forward_bytes_per_sample(case.problem)


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-12) -> bool:
    return bool((a - b).abs().max() <= rel * b.abs().max())


@pytest.mark.parametrize("backend", ["autograd", "func"])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_micro_batched_products_equal_whole_batches_and_dense_truth(kind, backend):
    case = make_case(kind)  # float64, batches of 10, 10, 3; cnn: BatchNorm on running statistics
    H, G = dense(case)
    V = torch.randn(3, case.problem.layout.dim, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    whole, cut = case.backend(backend), case.backend(backend)
    assert whole.limit_memory(2**40).size is None
    # room for three samples' graphs: every batch of 10 is cut into 3 + 3 + 3 + 1
    plan = cut.limit_memory(3 * per_sample_graph(case) * getattr(cut, "chunk", 1) + 1)
    assert plan.size == 3 and plan.chunks == 4
    for product, truth in ((lambda b: b.hvp(V), V @ H), (lambda b: b.ggn_vp(V), V @ G)):
        a, b = product(whole), product(cut)
        assert close(b, a) and close(b, truth, 1e-10)
    if backend == "autograd":
        signs = torch.randint(0, 2, (4, V.shape[1]), generator=torch.Generator().manual_seed(6)).to(torch.int8) * 2 - 1
        assert close(cut.hvp_sums(signs), whole.hvp_sums(signs))
        assert close(cut.vhv(signs), whole.vhv(signs))
        assert close(cut.vhv(signs), ((signs.double() @ H) * signs.double()).sum(1), 1e-10)


def test_one_sample_that_cannot_fit_is_refused_with_its_size():
    case = make_case("mlp")
    need = per_sample_graph(case)
    with pytest.raises(ConfigError, match=f"one sample's graph needs about {need:,} bytes"):
        case.backend().limit_memory(need - 1, "probe x")


def test_batch_statistics_are_not_cut():
    case = make_case("cnn", bn_mode="train")
    per = per_sample_graph(case)
    with pytest.raises(ConfigError, match="bn_mode train.*cannot cut a batch; use batch_size 3 or less"):
        case.backend().limit_memory(3 * per + 1, "probe x")


def limits(result) -> tuple[int, int]:
    """(bytes the stored vectors took, bytes a sample's graph takes) from a run's details."""
    memory = result.details["memory"]
    return memory["stored_vector_bytes"], memory["graph_bytes_per_sample"]


CURVATURE = [("trace", {"rtol": "none", "probes_max": 12, "block_size": 4}),
             ("trace", {"probes_max": 12, "parts": False, "route": "hvp"}),
             ("trace", {"estimator": "hutchpp", "probes_max": 12}),
             ("trace", {"matrix": "ggn", "rtol": "none", "probes_max": 8}),
             ("lmax", {"k": 2, "max_iter": 60}), ("lmax", {"k": 1, "matrix": "ggn", "max_iter": 60}),
             ("spectrum", {"lanczos_steps": 12}), ("rank", {"lanczos_steps": 12})]


@pytest.mark.parametrize("probe,opts", CURVATURE)
def test_curvature_probes_chunk_batches_with_the_same_values(probe, opts):
    case = make_case("mlp")
    whole = run(case, probe, max_memory=2**40, **opts)
    assert whole.details["memory"]["microbatch_samples"] is None
    stored, per_sample = limits(whole)
    cut = run(case, probe, max_memory=stored + 2 * per_sample + 1, **opts)
    assert cut.details["memory"]["microbatch_samples"] == 2
    assert "micro-batches of 2 samples (5 per batch)" in cut.notes
    assert math.isclose(cut.value, whole.value, rel_tol=1e-12, abs_tol=1e-300)
    if whole.stderr is not None:
        assert math.isclose(cut.stderr, whole.stderr, rel_tol=1e-10)


@pytest.mark.parametrize("probe,opts,flag", [("spectrum", {"lanczos_steps": 20, "reorth": "full"}, "--lanczos-steps"),
                                             ("rank", {"lanczos_steps": 20, "reorth": "full"}, "--lanczos-steps"),
                                             ("trace", {"block_size": 8}, "--block-size"),
                                             ("trace", {"estimator": "hutchpp", "probes_max": 30}, "--probes-max")])
def test_stored_vectors_that_cannot_fit_are_refused_up_front(probe, opts, flag):
    case = make_case("mlp")
    stored, _ = limits(run(case, probe, max_memory=2**40, **opts))
    with pytest.raises(ConfigError, match=f"probe {probe}.* {stored:,} bytes .*more than the {stored - 1:,} bytes .*"
                                          f"allowed \\(max_memory.*; (no )?{flag} "):
        run(case, probe, max_memory=stored - 1, **opts)


def test_lmax_default_basis_that_does_not_fit_is_thick_restarted():
    case = make_case("mlp")
    P = case.problem.layout.dim
    per, fixed = restart_bytes(0, P, torch.float64)
    # the basis gets half the limit (the graphs the other half): 12 rows; the steps stay the
    # default's, and the values are the full basis's
    result = run(case, "lmax", max_memory=2 * (fixed + 12 * per) + 1, k=2, tol=1e-9)
    full = run(case, "lmax", max_memory=2**40, k=2, tol=1e-9)
    d = result.details
    assert d["basis"] == "thick-restart" and d["basis_rows"] == 12 and d["restarts"] > 0
    assert d["max_iter"] == 300  # the full basis: min(300, P)
    assert d["memory"]["stored_vector_bytes"] == fixed + 12 * per
    assert full.details["basis"] == "full" and full.details["restarts"] is None
    assert "thick-restarted in a basis of 12 vectors" in result.notes and all(d["converged"])
    H, _ = dense(case)
    ev = torch.linalg.eigvalsh(H).flip(0)
    gap = (ev[1] - ev[2]).item()
    for value, r, truth in zip(d["eigenvalues"], d["residuals"], ev[:2].tolist()):
        assert abs(value - truth) <= r * r / gap + 1e-12 * abs(truth)
    assert d["eigenvalues"] == pytest.approx(full.details["eigenvalues"], rel=1e-9)


def test_lmax_restarted_under_the_default_limit_says_which_limit(monkeypatch):
    """Without --max-memory the limit is half the free memory; the note must not name the flag."""
    from flatcheck.linalg import memory

    case = make_case("mlp")
    per, fixed = restart_bytes(0, case.problem.layout.dim, torch.float64)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2 * (2 * (fixed + 12 * per) + 1))
    result = run(case, "lmax", k=2, tol=1e-9)
    assert result.details["basis_rows"] == 12
    assert "basis of 12 vectors, the most that fit the default limit, half the free memory" in result.notes


def test_lmax_restarted_basis_takes_what_one_samples_graph_leaves_when_half_is_too_little():
    case = make_case("mlp")
    per, fixed = restart_bytes(0, case.problem.layout.dim, torch.float64)
    graph = GRAPH_FACTOR * forward_bytes_per_sample(case.problem)
    # half the limit holds fewer rows than min_rows(k) + k: the basis takes all but one graph
    limit = fixed + 7 * per + graph
    assert (limit // 2 - fixed) // per < 5
    result = run(case, "lmax", max_memory=limit, k=1, tol=1e-9)
    assert result.details["basis_rows"] == 7 and result.details["memory"]["microbatch_samples"] == 1
    H, _ = dense(case)
    assert abs(result.value - torch.linalg.eigvalsh(H)[-1].item()) <= result.details["residuals"][0]
    with pytest.raises(ConfigError, match=r"thick-restarted Lanczos basis of 3 vectors.*need [0-9,]+ bytes.*"
                                          r"\(max_memory less what the process holds; without it, half the free memory\); "
                                          r"raise max_memory or lower --k"):
        run(case, "lmax", max_memory=fixed + 2 * per + graph, k=1)


def test_lmax_given_max_iter_is_thick_restarted_when_its_basis_does_not_fit():
    case = make_case("mlp")
    per, fixed = lanczos_bytes(0, case.problem.layout.dim, torch.float64, k=1)
    result = run(case, "lmax", max_memory=fixed + 40 * per, k=1, max_iter=60, tol=1e-9)
    d = result.details
    assert d["basis"] == "thick-restart" and d["max_iter"] == 60 and d["basis_rows"] < 40
    H, _ = dense(case)
    assert abs(result.value - torch.linalg.eigvalsh(H)[-1].item()) <= d["residuals"][0]


def test_plan_steps_names_the_largest_that_fits():
    per, fixed = lanczos_bytes(0, 1000, torch.float32)
    assert plan_steps(50, 1000, torch.float32, fixed + 50 * per, what="x", flag="--lanczos-steps") == (50, fixed + 50 * per)
    with pytest.raises(ConfigError, match=f"{fixed + 50 * per:,} bytes.*; --lanczos-steps 49 fits"):
        plan_steps(50, 1000, torch.float32, fixed + 50 * per - 1, what="x", flag="--lanczos-steps")


def test_lanczos_basis_holds_its_steps_and_no_more():
    A = torch.randn(300, 300, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    op = DenseOperator(A + A.T)
    lz = Lanczos(op, torch.ones(300, dtype=torch.float64), capacity=37)
    while lz.can_step:
        lz.step()
    assert lz.size == 37 and lz.rows == 37  # blocks of 16, 16, 5: no doubled copy
    Q = torch.cat(lz._basis())
    assert torch.allclose(Q @ Q.T, torch.eye(37, dtype=torch.float64), atol=1e-12)


def test_hutchinson_rows_per_product_change_no_value():
    A = torch.randn(50, 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    op = DenseOperator(A + A.T)
    whole = hutchinson(op, generator=torch.Generator().manual_seed(3), max_probes=24, rtol=0.01, block_size=8)
    op2 = DenseOperator(A + A.T)
    rows = hutchinson(op2, generator=torch.Generator().manual_seed(3), max_probes=24, rtol=0.01, block_size=8, rows=3)
    assert rows.samples == whole.samples and rows.stop_reason == whole.stop_reason
    # the block's int8 signs, the products' running sum for their variance (50 float64), 3 rows
    held = 8 * 50 + 50 * 8 + 3 * 4 * 50 * 8
    assert plan_block(8, op, False, held, "x") == (3, held)


@pytest.mark.parametrize("probe", ["spectrum", "rank"])
def test_auto_drops_the_basis_that_cannot_fit_and_says_so(probe):
    case = make_case("mlp")
    full = run(case, probe, max_memory=2**40, lanczos_steps=20)
    assert full.details["memory"]["reorthogonalization"] == "full"
    stored = full.details["memory"]["stored_vector_bytes"]
    _per, fixed = lanczos_bytes(0, case.problem.layout.dim, torch.float64)
    # room for the recurrence's own vectors and the graphs, not for the 20-vector basis
    cut = run(case, probe, max_memory=stored - 1, lanczos_steps=20)
    memory = cut.details["memory"]
    assert memory["reorthogonalization"] == "none" and memory["stored_vector_bytes"] == fixed
    assert "more than the" in memory["reorthogonalization_reason"]
    assert "Lanczos without re-orthogonalisation" in cut.notes
    # the same steps; spectrum's full basis also takes a product a start for the part outside it
    # (linalg/slq.py deflated_rest), which a run without the basis cannot
    extra = full.details["starts"] if probe == "spectrum" else 0
    assert cut.matvecs == full.matvecs - extra


def test_cli_spectrum_refused_up_front_with_the_steps_that_fit(nothing_held):
    result = invoke("spectrum", CKPT, "--spec", SPEC, "--samples", "4", "--max-memory", "64K", "--reorth", "full")
    err = bad(result, "--max-memory", "--lanczos-steps")
    assert "probe spectrum (SLQ): a Lanczos basis of 100 steps" in err and "bytes" in err


@pytest.mark.parametrize("method", ["exact", "estimate"])
def test_jacobian_routes_are_planned_as_mls_is(method):
    """The estimate route ran whole batches whatever --max-memory said, its projections drawn
    in sequence from one generator (other chunks, other draws): now planned, and per sample."""
    case = make_case("cnn")
    whole = run(case, "jacobian", max_memory=2**40, method=method)
    need = whole.details["memory"]["memory_per_sample_bytes"]
    for room, chunk in ((need, 1), (3 * need + 1, 3)):
        small = run(case, "jacobian", max_memory=room, method=method)
        assert small.details["memory"]["chunk_samples"] == chunk
        a, b = numbers(whole.details), numbers(small.details)
        assert a.keys() == b.keys()
        for key in a:
            if not key.startswith("memory."):
                assert math.isclose(a[key], b[key], rel_tol=1e-12, abs_tol=1e-300), key
        if method == "estimate":
            assert math.isclose(whole.stderr, small.stderr, rel_tol=1e-12)
    with pytest.raises(ConfigError, match=f"probe jacobian \\({method} route.*needs about .* GiB even one at a time"):
        run(case, "jacobian", max_memory=need - 1, method=method)


def test_measuring_a_graph_keeps_none_of_it():
    # sigmoid saves its own output for backward: a pack hook that kept that tensor would tie
    # it to its grad_fn through autograd's C++ nodes, which Python's collector cannot free,
    # so every probe that plans its micro-batches would leave one sample's graph behind
    import gc
    import weakref

    from flatcheck.engines.microbatch import saved_bytes

    lin = nn.Linear(5, 4)
    x = torch.randn(3, 5)
    kept = []

    def run():
        h = torch.sigmoid(lin(x))
        kept.append(weakref.ref(h))
        return h.sum()

    # linear saves x, sigmoid its output (float32); lin's weight and bias are the model's own
    assert saved_bytes(run, lin) == x.numel() * 4 + x.shape[0] * 4 * 4
    gc.collect()
    assert kept[0]() is None


def test_the_cap_counts_what_the_process_holds(monkeypatch):
    """--max-memory caps the process: what it holds with the model and samples loaded is taken
    off once, and every probe is left the same rest, whatever ran before it (a probe's plan,
    and so a restarted basis's values, must not depend on the probes before it)."""
    from flatcheck.live import measure

    reads = []
    monkeypatch.setattr("flatcheck.api.resident_bytes", lambda device: reads.append(1) or 3 * 2**30)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    data = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
    report = measure(model, data, probes={"lmax": None, "spectrum": {"lanczos_steps": 5}}, max_memory="4G")
    assert len(reads) == 1
    for probe in ("lmax", "spectrum"):
        memory = report.results[probe].details["memory"]
        assert memory["limit_bytes"] == 2**30
        assert memory["max_memory_bytes"] == 4 * 2**30 and memory["process_held_bytes"] == 3 * 2**30
    assert "max_memory_bytes" not in measure(model, data, probes="lmax").results["lmax"].details["memory"]


def test_a_cap_the_process_is_already_over_is_one_line_exit_2():
    result = invoke("gini", CKPT, "--spec", SPEC, "--samples", "4", "--max-memory", "1K")
    err = bad(result, "--max-memory 1,024 bytes", "leaves no room", "already holds")
    assert "give that much more than the probes need" in err


def test_an_address_space_limit_bounds_the_default_and_the_cap(monkeypatch):
    """Under `ulimit -v` an allocation past the limit fails however much memory is free, so
    what the limit leaves bounds both the default (half of it) and a --max-memory above it."""
    import resource

    from flatcheck.live import measure
    from flatcheck.linalg import memory

    monkeypatch.setattr(memory, "_host_available", lambda: 20 * 2**30)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (10 * 2**30, resource.RLIM_INFINITY))
    mapped = int(open("/proc/self/statm").read().split()[0]) * __import__("os").sysconf("SC_PAGE_SIZE")
    left = memory.address_space_left()
    assert 0 <= 10 * 2**30 - mapped - left <= 64 * 2**20  # what the process maps moves a little
    assert memory.memory_limit(torch.device("cpu"), None) <= (10 * 2**30 - mapped + 64 * 2**20) // 2
    monkeypatch.setattr(memory, "address_space_left", lambda: 2**30)
    monkeypatch.setattr("flatcheck.api.resident_bytes", lambda device: 2**30)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    data = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
    assert memory.available_bytes(torch.device("cpu")) == 2**30
    got = measure(model, data, probes="lmax", max_memory="16G").results["lmax"].details["memory"]
    assert got["limit_bytes"] == 2**30 and got["max_memory_bytes"] == 16 * 2**30


def test_cuda_free_memory_counts_what_torchs_allocator_holds_unused(monkeypatch):
    """An earlier probe's freed blocks stay reserved by torch's caching allocator, which the
    driver counts as taken; they are this process's to reuse, so the next probe's default
    limit (half the free memory) must count them."""
    from flatcheck.linalg import memory

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * 2**30, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 30 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 2 * 2**30)
    assert memory.available_bytes(torch.device("cuda")) == 38 * 2**30
    assert memory.memory_limit(torch.device("cuda"), None) == 19 * 2**30


@pytest.mark.parametrize("probe", ["trace", "mls", "gap"])
def test_a_finished_measurement_leaves_no_tensor_to_the_garbage_collector(probe):
    """Whatever a measurement held (the model's copy, kept graphs, stored vectors) is freed when
    it returns, not when Python's collector next runs: a backend and the ModelState that drops
    its caches referred to each other, so every measure() left its session in a cycle, and
    the next probe in a process (a scan's child, a notebook) planned against memory it held."""
    import gc

    from flatcheck.live import measure

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3))
    data = (torch.randn(8, 4), torch.randint(0, 3, (8,)))
    gc.collect()
    gc.disable()
    try:
        measure(model, data, probes=probe, test_data=data)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []


def test_a_refusal_under_ulimit_v_says_what_the_limit_leaves(monkeypatch):
    """Under `ulimit -v` a larger --max-memory cannot help past what the limit leaves the
    process (ViT-B/16's lmax under a 10 GB limit), so the refusal says how much that is."""
    from flatcheck.linalg import memory

    monkeypatch.setattr(memory, "address_space_left", lambda: None)
    with pytest.raises(ConfigError) as plain:
        memory.refuse_count(4, 100, 0, 300, "probe x", "--steps")
    assert "ulimit" not in str(plain.value)
    monkeypatch.setattr(memory, "address_space_left", lambda: 2**30)
    with pytest.raises(ConfigError, match=r"allowed \(max_memory less what the process holds; without it, half "
                                          r"the free memory; ulimit -v leaves this process 1,073,741,824 bytes "
                                          r"\(1 GiB\)\); --steps 3 fits"):
        memory.refuse_count(4, 100, 0, 300, "probe x", "--steps")


@pytest.mark.parametrize("probe", ["spectrum", "lmax", "trace"])
def test_a_capped_run_states_its_peak_and_what_the_cap_does_not_cover(probe):
    """--max-memory 600M peaked at 726 MiB in /usr/bin/time with nothing said: a capped result
    gives the process's peak when the probe ended beside the cap and what the process held
    before the probes, and says what the cap covers and what it does not."""
    from flatcheck.linalg.memory import _statm

    case = make_case("mlp")
    held = _statm(1)
    ctx = ProbeContext(case.backend(), seed=0, memory_allowance=2**30, memory_cap=held + 2**30, memory_held=held)
    opts = {"lanczos_steps": 10} if probe == "spectrum" else {}
    r = create_probe(probe).run(ctx, parse_options(probe, opts))
    memory = r.details["memory"]
    assert memory["max_memory_bytes"] == held + 2**30 and memory["process_held_bytes"] == held
    assert memory["peak_bytes"] >= _statm(1) * 0.99  # the peak so far is at least what is resident now
    assert "cannot be cut" in memory["max_memory_covers"] and "interpreter exit" in memory["max_memory_covers"]
    assert f"{held / 2**20:,.0f} MiB of it held before the probes" in r.notes
    assert "over it" not in r.notes  # a GiB of room above what was held


def test_a_cap_below_what_the_process_holds_names_the_floor():
    result = invoke("gini", CKPT, "--spec", SPEC, "--samples", "4", "--max-memory", "64M")
    err = bad(result, "--max-memory", "leaves no room")
    assert "a floor the cap cannot cut" in err and "torch alone" in err
