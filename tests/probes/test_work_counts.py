"""What a result's counters hold: `matvecs` counts curvature products only; the probes that
take input-Jacobian rows count their batched backward passes in details["backward_passes"]."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.support.dense import make_case
from flatcheck.probes.registry import ProbeContext, create_probe, parse_options


class GradCalls:
    """Counts torch.autograd.grad calls: each is one batched reverse-mode pass."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.count, real = 0, torch.autograd.grad

        def counted(*args, **kwargs):
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(torch.autograd, "grad", counted)


def _relu_mlp():
    case = make_case("mlp")
    case.model[2] = nn.ReLU()  # decomposition wants a ReLU chain
    return case


@pytest.mark.parametrize("probe,kind,opts", [
    ("jacobian", "cnn", {"method": "exact"}),
    ("jacobian", "mlp", {"method": "estimate", "projections": 3, "lanczos_iters": 5}),
    ("mls", "cnn", {}),
    ("decomposition", "relu_mlp", {}),
])
def test_backward_passes_are_the_grad_calls_and_matvecs_stay_zero(monkeypatch, probe, kind, opts):
    case = _relu_mlp() if kind == "relu_mlp" else make_case(kind)
    backend = case.backend()
    calls = GradCalls(monkeypatch)
    if probe == "decomposition":
        # its exact Tr(G) makes passes of its own, not the rows': measure them alone
        backend.ggn_trace()
    other, calls.count = calls.count, 0
    r = create_probe(probe).run(ProbeContext(backend, seed=0), parse_options(probe, opts))
    assert r.matvecs == 0
    assert r.details["backward_passes"] == calls.count - other > 0
