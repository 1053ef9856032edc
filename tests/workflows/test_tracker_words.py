"""A Tracker's keyword errors name the Tracker, as measure()'s name measure()."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import flatcheck
from flatcheck.errors import ConfigError, SpecError


def _model_and_data():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2)), (torch.randn(8, 3), torch.randint(0, 2, (8,)))


def test_a_trackers_keyword_errors_name_the_tracker(tmp_path):
    model, data = _model_and_data()
    with pytest.raises(ConfigError, match=r"^Tracker\(\): keyword 'loss' \(its 'name'\) must be one of"):
        flatcheck.Tracker(model, data, probes=["lmax"], out=None, loss="hinge")
    with pytest.raises(SpecError, match=r"^Tracker\(\): keyword 'output_key' is 'x' but the model's forward "
                                        r"returns a tensor"):
        flatcheck.Tracker(model, data, probes=["lmax"], out=None, output_key="x")
    # measure() keeps its own name
    with pytest.raises(ConfigError, match=r"^measure\(\): keyword 'loss' \(its 'name'\)"):
        flatcheck.measure(model, data, loss="hinge")


def test_a_num_classes_that_the_model_does_not_return_is_named_as_a_keyword():
    model, data = _model_and_data()
    with pytest.raises(flatcheck.errors.InputError,
                       match=r"^Tracker\(\): keyword 'num_classes' is 3 but the model returns 2 logits"):
        flatcheck.Tracker(model, data, probes=["lmax"], out=None, num_classes=3)
    with pytest.raises(flatcheck.errors.InputError,
                       match=r"^measure\(\): keyword 'num_classes' is 3 but the model returns 2 logits"):
        flatcheck.measure(model, data, num_classes=3)
