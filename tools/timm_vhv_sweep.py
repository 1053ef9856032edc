"""vᵀHv by forward tangents against the double-backward HVP route on every timm `test_*` model.

    .venv/bin/python tools/timm_vhv_sweep.py

float64, random weights, a batch of 3 at each model's input size, two Rademacher probes. Prints
per model whether the tangent route was taken (else why it fell back) and the largest relative
difference of the two routes. Takes about a minute on a 2-core CPU.
"""

import warnings

import timm
import torch
from timm.layers import set_fused_attn
from torch.utils.data import TensorDataset

from flatcheck.backends import ParamLayout, create_backend
from flatcheck.problem import Problem
from flatcheck.data.batches import SampleSet
from flatcheck.linalg.random import rademacher_signs
from flatcheck.models.spec import LossSpec

warnings.filterwarnings("ignore")
set_fused_attn(False)  # the HVP route needs a double backward, which the fused CPU kernel lacks
for name in timm.list_models("test_*"):
    torch.manual_seed(0)
    try:
        model = timm.create_model(name, pretrained=False, num_classes=5).double().eval()
        g = torch.Generator().manual_seed(0)
        X = torch.randn(3, *model.pretrained_cfg["input_size"], generator=g, dtype=torch.float64)
        Y = torch.randint(0, 5, (3,), generator=g)
        samples = SampleSet(TensorDataset(X, Y), samples=3, batch_size=3, dtype=torch.float64)
        problem = Problem(model, LossSpec("cross_entropy"), samples, ParamLayout.from_model(model))
        backend = create_backend("autograd", problem)
        S = rademacher_signs(2, problem.layout.dim, g, device="cpu")
        got = backend.vhv(S)
        want = (backend.hvp(S.double()) * S.double()).sum(1)
        route = "tangents" if backend.vhv_error is None else f"HVPs ({backend.vhv_error})"
        rel = ((got - want).abs().max() / want.abs().max()).item()
        print(f"{name:26s} P={problem.layout.dim:7d}  {route}  relative difference {rel:.2e}")
    except Exception as exc:  # noqa: BLE001 — one model's failure is a line, not the end
        print(f"{name:26s} FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
