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
# a module or test that runs whole workflows (gate runs, scans, every pair of probes, the
# bad-input catalogue, reports with plots, the tracker's example), seconds each, carries the
# marker `workflow` itself (`pytestmark` or a decorator): `make test` leaves it to `make test-all`


def pytest_collection_modifyitems(config, items):
    for item in items:
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
