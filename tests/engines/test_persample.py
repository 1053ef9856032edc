"""Per-sample squared gradient norms from layer inputs/output gradients against dense per-sample Jacobians."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from flatcheck.backends import ParamLayout
from flatcheck.engines.persample import layer_sqnorms
from tests.support.dense import dense, make_case

EPS = torch.finfo(torch.float64).eps


class SeqNet(nn.Module):
    """Linear layers over a sequence: the Gram route (T=3, 8→8) and the explicit one (4→5 per token)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3, bias=False)

    def forward(self, x):  # x (B, 3, 4)
        return self.head(self.mix(self.norm(self.inp(x)).tanh()).relu().mean(1))


class ConvNet(nn.Module):
    """Strided/dilated convolutions, BatchNorm on running stats, in-place ReLU and residual add, Conv1d."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.c2 = nn.Conv2d(3, 3, 3, padding=2, dilation=2, bias=False)
        self.c3 = nn.Conv2d(3, 4, 2, stride=2)
        self.c4 = nn.Conv1d(4, 5, 3, padding=1)
        self.fc = nn.Linear(5, 3)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):  # x (B, 2, 6, 6)
        h = self.act(self.bn(self.c1(x)))
        r = self.c2(h)
        r += h  # in place on a layer output that nothing recorded as an input
        h = self.c3(self.act(r))  # (B, 4, 3, 3)
        h = self.c4(h.flatten(2))  # (B, 5, 9)
        return self.fc(h.mean(-1))


def _model(cls):
    torch.manual_seed(3)
    m = cls().double().eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.copy_(torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64))
            mod.running_var.copy_(torch.tensor([0.5, 1.5, 2.0], dtype=torch.float64))
            mod.weight.data.uniform_(0.5, 1.5)
            mod.bias.data.uniform_(-0.5, 0.5)
    return m


def _truth(model, layout, x, U):
    """‖J_nᵀ U[n,:,k]‖² per parameter from dense per-sample Jacobians of the logits."""
    params = dict(zip(layout.names, (p.detach() for p in layout.params(model))))
    buffers = dict(model.named_buffers())
    rows = []
    for n in range(x.shape[0]):
        jac = jacrev(lambda p: functional_call(model, (p, buffers), (x[n : n + 1],)).squeeze(0))(params)
        cols = []
        for name in layout.names:
            J = jac[name].reshape(U.shape[1], -1)  # (C, size)
            cols.append((J.T @ U[n]).pow(2).sum(0))  # (K,)
        rows.append(torch.stack(cols, dim=1))
    return torch.stack(rows)  # (B, K, n_params)


@pytest.mark.parametrize("cls,shape", [(SeqNet, (5, 3, 4)), (ConvNet, (5, 2, 6, 6))])
def test_layer_sqnorms_match_dense_per_sample_jacobians(cls, shape):
    model = _model(cls)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    U = torch.randn(shape[0], 3, 4, generator=g, dtype=torch.float64)
    layout = ParamLayout.from_model(model)
    got = layer_sqnorms(model, layout, x, U)
    want = _truth(model, layout, x, U)
    assert got is not None and got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e3 * EPS, atol=1e3 * EPS * want.abs().max().item())
    # the model comes back as it was: no hooks left, outputs unchanged
    assert not any(m._forward_hooks for m in model.modules())


def test_layer_sqnorms_decline_what_they_do_not_cover():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 4, generator=g, dtype=torch.float64)
    U = torch.randn(4, 3, 2, generator=g, dtype=torch.float64)

    class Shared(SeqNet):  # one layer run twice: per-call inputs would be overwritten
        def forward(self, x):
            return self.head(self.mix(self.mix(self.inp(x))).mean(1))

    class Scaled(SeqNet):  # a parameter outside any covered layer
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def forward(self, x):
            return super().forward(x) * self.scale

    class Overwrites(SeqNet):  # the recorded input of `mix` is changed in place afterwards
        def forward(self, x):
            h = self.inp(x)
            out = self.mix(h)
            h.mul_(2)
            return self.head((out + h).mean(1))

    for cls in (Shared, Scaled, Overwrites):
        model = _model(cls)
        assert layer_sqnorms(model, ParamLayout.from_model(model), x, U) is None, cls.__name__
        assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("per_sample", ["layers", "vmap"])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_both_per_sample_routes_give_the_exact_ggn_trace(kind, per_sample):
    case = make_case(kind)
    _, G = dense(case)
    backend = case.backend()
    backend.per_sample = per_sample
    assert abs(backend.ggn_trace().per_param.sum().item() - G.trace().item()) <= 1e3 * EPS * G.trace().item()


@pytest.mark.parametrize("cap_columns", [1, 3])
@pytest.mark.parametrize("per_sample, bn_mode", [("vmap", "eval"), ("layers", "train")])
def test_exact_ggn_trace_chunks_its_columns_with_the_same_value(monkeypatch, cap_columns, per_sample, bn_mode):
    """All C columns' parameter gradients were held at once (vmap, or the coupled pull-back of
    BatchNorm on batch statistics): 4.5 GB on a 1,000-class test_vit under --max-memory 2G.
    Chunked to a working set, the value is the same and still the dense GGN's trace."""
    import flatcheck.engines.ggn_trace as engine

    case = make_case("cnn", bn_mode=bn_mode)
    _, G = dense(case)
    backend = case.backend()
    backend.per_sample = per_sample
    whole = backend.ggn_trace().per_param
    assert abs(whole.sum().item() - G.trace().item()) <= 1e3 * EPS * G.trace().item()
    # the working set of cap_columns columns: 4 classes go in chunks of 1 or of 3 and 1
    bytes_per_column = case.problem.layout.dim * 8 * 3
    monkeypatch.setattr(engine, "PER_SAMPLE_BYTES", cap_columns * bytes_per_column)
    assert engine._column_chunk(case.problem.layout.dim, 8, 4) == cap_columns
    seen = []
    real = engine.pullback if bn_mode == "train" else engine.vmap

    def spy_pullback(output, inputs, cot):
        seen.append(cot.shape[0])
        return real(output, inputs, cot)

    def spy_vmap(fn, *a, **k):
        mapped = real(fn, *a, **k)

        def call(arg, *rest):
            if arg.ndim == 2:  # the columns (cols, C) of one sample's pull-back
                seen.append(arg.shape[0])
            return mapped(arg, *rest)
        return call

    monkeypatch.setattr(engine, "pullback" if bn_mode == "train" else "vmap",
                        spy_pullback if bn_mode == "train" else spy_vmap)
    chunked = backend.ggn_trace().per_param
    assert seen and max(seen) == cap_columns
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=0)
