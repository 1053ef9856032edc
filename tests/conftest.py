"""Fixtures every test folder shares; helpers that are plain functions live in tests/support."""

from __future__ import annotations

from pathlib import Path

import pytest

# torch and what imports it are imported inside the fixtures: under xdist the controlling
# process loads this file too, and it runs no test, so it need not pay for torch

TIERS = ("unit", "e2e", "statistical", "realsize")  # the markers of pyproject.toml
# a test that names none of them takes its folder's: the commands are driven end to end,
# everything else is a module's own behaviour unless its file or the test says otherwise;
# a test that starts a flatcheck process (marker `process`) is end to end wherever it is
FOLDER_TIER = {"commands": "e2e"}
# modules whose tests run whole workflows (gate runs, scans, every pair of probes, the bad-input
# catalogue, reports with plots, the tracker's example), seconds each: marker `workflow`, left
# to `make test-all` so that `make test` keeps to the dense-truth checks and the fast commands
WORKFLOW_MODULES = frozenset({
    "workflows/test_gate_workflow.py", "workflows/test_scan.py", "probes/test_probe_pairs.py",
    "commands/test_bad_input.py", "linalg/test_max_memory.py", "engines/test_batchfill.py",
    "test_bench_throughput.py", "models/test_model_ref.py",
})
# single tests of that kind in modules that are otherwise quick
WORKFLOW_TESTS = frozenset({
    "workflows/test_tracker.py::test_the_training_example_runs_small",
    "report/test_report.py::test_report_axes_use_the_field_labels_and_points_their_names",
    "report/test_report.py::test_report_overlays_spectral_densities",
    "report/test_report.py::test_report_plot_is_a_png",
    "test_measure.py::test_cli_run_is_measure_on_the_loaded_model",
    "engines/test_quadform.py::test_vhv_equals_the_reference_hvps_on_timm_models",
    "engines/test_quadform.py::test_fused_attention_is_decomposed_and_equals_the_unfused_hvp_route",
    "test_docs.py::test_no_comment_docstring_or_page_points_at_a_document_the_repository_does_not_hold",
    "report/test_output_text.py::test_top_level_help_lists_each_command_with_its_whole_first_paragraph",
    "backends/test_backend.py::test_rebuild_keeps_the_wrapper_the_inner_backend_and_its_options",
    "commands/test_spectral_cli.py::test_spectrum_json_and_plot",
})
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        where = item.path.relative_to(_HERE).as_posix()
        if where in WORKFLOW_MODULES or f"{where}::{item.originalname}" in WORKFLOW_TESTS:
            item.add_marker("workflow")
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            default = "e2e" if item.get_closest_marker("process") else "unit"
            item.add_marker(FOLDER_TIER.get(item.path.parent.name, default))


@pytest.fixture
def case_factory():
    from tests.support.dense import make_case

    return make_case


@pytest.fixture(scope="module")
def resnet_checkpoint(tmp_path_factory) -> Path:
    """The shipped CIFAR ResNet-18 spec at a random init, saved as a checkpoint."""
    import torch
    from safetensors.torch import save_file

    from flatcheck.models.sources import build_model
    from flatcheck.models.spec import load_spec
    from tests.support.cli import ROOT

    torch.manual_seed(0)
    model = build_model(load_spec(ROOT / "model_specs" / "resnet18_cifar.yaml"))
    path = tmp_path_factory.mktemp("ckpt") / "resnet18.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(autouse=True)
def _default_dtype_is_restored():
    """A test that leaves torch's global default dtype changed breaks unrelated tests later."""
    import torch

    before = torch.get_default_dtype()
    yield
    assert torch.get_default_dtype() == before, "test changed torch's default dtype"
