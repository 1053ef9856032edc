"""Activation and death frequencies against a hand count on a model with constructed dead units."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from flatcheck.backends import ParamLayout, create_backend
from flatcheck.problem import Problem
from flatcheck.data.batches import SampleSet
from flatcheck.models.spec import LossSpec
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options


class Net(nn.Module):
    """Linear(5→8) with units 0 and 3 dead by construction (zero weights, negative bias), an
    in-place ReLU, a GELU, and one ReLU object applied twice."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.fc1 = nn.Linear(5, 8)
        self.act1 = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(8, 6)
        self.act2 = nn.GELU()
        self.shared = nn.ReLU()
        self.head = nn.Linear(6, 3)
        with torch.no_grad():
            self.fc1.weight[[0, 3]] = 0.0
            self.fc1.bias[[0, 3]] = -1.0

    def forward(self, x):
        h = self.act1(self.fc1(x))
        g = self.act2(self.fc2(h))
        return self.head(self.shared(g) + self.shared(g - 0.2))


def hand(z):
    """(death frequency, activation frequency) of outputs z (N, positions), active = z > 0."""
    active = z > 0
    alive = active.any(0)
    return (~alive).double().mean().item(), (active.sum(1).double() / alive.sum()).mean().item()


def test_hand_count_over_several_batches():
    model = Net().double()
    X = torch.randn(37, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    Y = torch.zeros(37, dtype=torch.long)
    samples = SampleSet(TensorDataset(X, Y), samples=37, batch_size=8, dtype=torch.float64)
    backend = create_backend("autograd", Problem(model, LossSpec(), samples, ParamLayout.from_model(model)))
    r = create_probe("activations").run(ProbeContext(backend, seed=0), parse_options("activations", {}))
    with torch.no_grad():
        a1 = torch.relu(model.fc1(X))
        g = nn.functional.gelu(model.fc2(a1))
        expected = {"act1": hand(a1), "act2": hand(g), "shared": hand(torch.relu(g)),
                    "shared#2": hand(torch.relu(g - 0.2))}
    layers = r.details["per_layer"]
    assert set(layers) == set(expected)
    for key, (xi, eta) in expected.items():
        assert layers[key]["death_frequency"] == pytest.approx(xi, abs=1e-15)
        assert layers[key]["activation_frequency"] == pytest.approx(eta, rel=1e-14)
    assert layers["act1"]["dead"] >= 2 and layers["act1"]["positions"] == 8
    assert r.value == pytest.approx(sum(v[0] for v in expected.values()) / 4)
    assert r.stderr is None and r.seed is None
