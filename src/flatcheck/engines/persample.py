"""Per-sample squared gradient norms from layer inputs and output gradients (no per-sample vmap).

For a layer y = W a + b the gradient of sample n is Σ_t g_nt a_ntᵀ, so ‖J_nᵀu‖² per parameter
tensor needs only the layer input a (one forward, shared by every column u) and the gradient g
at the layer output (one backward per column that stops at the activations: no weight
gradients). The squared norm is taken either by forming the per-sample gradient or, when the
sequence/spatial length T is small against the layer width, from Gram matrices
Σ_{t,t'} (a_t·a_t')(g_t·g_t') — whichever costs fewer multiply-adds.

Covers Linear, Conv1d/Conv2d (groups=1, zero padding), BatchNorm on running statistics and
LayerNorm. `layer_sqnorms` returns None when any probed parameter lives elsewhere, a layer runs
twice in one forward (shared weights), or an activation was overwritten in place before it could
be read; the caller then uses the generic per-sample path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..problem import ParamLayout

_CONV = (nn.Conv1d, nn.Conv2d)


def _supported(m: nn.Module) -> bool:
    if isinstance(m, nn.Linear):
        return True
    if isinstance(m, _CONV):
        return m.groups == 1 and m.padding_mode == "zeros" and not isinstance(m.padding, str)
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return not m.training and m.running_mean is not None and m.affine
    if isinstance(m, nn.LayerNorm):
        return m.elementwise_affine
    return False


class _Recorder:
    """Forward hooks that keep each layer's input and a handle on its output.

    The output passes on as a clone so that an in-place op downstream (ReLU(inplace=True))
    cannot turn the recorded tensor into something else; the input's version counter is
    remembered so an in-place overwrite of it is detected instead of read.
    """

    def __init__(self, modules: list[nn.Module]):
        self.inputs: dict[nn.Module, tuple[Tensor, int]] = {}
        self.outputs: dict[nn.Module, Tensor] = {}
        self.repeated = False
        self._handles = [m.register_forward_hook(self._hook) for m in modules]

    def _hook(self, module, args, output):
        if module in self.outputs or not isinstance(output, Tensor):
            self.repeated = True
            return None
        a = args[0].detach()
        self.inputs[module] = (a, a._version)
        self.outputs[module] = output
        return output.clone()

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    def intact(self) -> bool:
        return not self.repeated and all(a._version == v for a, v in self.inputs.values())


def layer_sqnorms(model: nn.Module, layout: ParamLayout, x: Tensor, U: Tensor) -> Tensor | None:
    """‖J_nᵀ U[n, :, k]‖² per sample n, column k and parameter of `layout`: (B, K, n_params).

    J_n is the Jacobian of the logits of sample n; the model must not couple samples
    (BatchNorm on running statistics). None when the layers are not all covered.
    """
    owner: dict[str, tuple[nn.Module, str]] = {}
    for mname, m in model.named_modules():
        for pname, _ in m.named_parameters(recurse=False):
            owner[f"{mname}.{pname}" if mname else pname] = (m, pname)
    targets = [owner.get(n) for n in layout.names]
    if any(t is None or not _supported(t[0]) for t in targets):
        return None
    modules = list(dict.fromkeys(m for m, _ in targets))

    rec = _Recorder(modules)
    try:
        with torch.enable_grad():
            logits = model(x)
    finally:
        rec.close()
    if not rec.intact() or any(m not in rec.outputs or not rec.outputs[m].requires_grad for m in modules):
        return None

    outs = [rec.outputs[m] for m in modules]
    k_cols = U.shape[-1]
    per_module: dict[nn.Module, list[dict[str, Tensor]]] = {m: [] for m in modules}
    prepared = {m: _prepare(m, rec.inputs[m][0]) for m in modules}
    for k in range(k_cols):
        grads = torch.autograd.grad(logits, outs, U[:, :, k], retain_graph=k < k_cols - 1)
        for m, g in zip(modules, grads):
            per_module[m].append(_sqnorms(m, prepared[m], g))
    cols = [torch.stack([d[pname] for d in per_module[m]], dim=1) for m, pname in targets]
    return torch.stack(cols, dim=2)  # (B, K, n_params)


# ---------------------------------------------------------------- per layer type


def _prepare(m: nn.Module, a: Tensor):
    """What the layer's squared norms need from its input, computed once for all columns."""
    b = a.shape[0]
    if isinstance(m, nn.Linear):
        a = a.reshape(b, -1, a.shape[-1])  # (B, T, in)
        return a, _gram(a) if _use_gram(a.shape[1], a.shape[2], m.out_features) else None
    if isinstance(m, _CONV):
        if isinstance(m, nn.Conv1d):
            a = a.unsqueeze(-2)
            kernel, dil, pad, stride = (1, *m.kernel_size), (1, *m.dilation), (0, *m.padding), (1, *m.stride)
        else:
            kernel, dil, pad, stride = m.kernel_size, m.dilation, m.padding, m.stride
        cols = F.unfold(a, kernel, dilation=dil, padding=pad, stride=stride).transpose(1, 2)  # (B, T, in·k)
        return cols, _gram(cols) if _use_gram(cols.shape[1], cols.shape[2], m.out_channels) else None
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        shape = (1, -1) + (1,) * (a.dim() - 2)
        return (a - m.running_mean.view(shape)) * torch.rsqrt(m.running_var.view(shape) + m.eps)
    if isinstance(m, nn.LayerNorm):
        return F.layer_norm(a, m.normalized_shape, None, None, m.eps)
    raise TypeError(type(m).__name__)


def _sqnorms(m: nn.Module, prep, g: Tensor) -> dict[str, Tensor]:
    b = g.shape[0]
    out: dict[str, Tensor] = {}
    if isinstance(m, (nn.Linear, *_CONV)):
        a, gram = prep
        if isinstance(m, nn.Linear):
            g = g.reshape(b, -1, g.shape[-1])  # (B, T, out)
        else:
            g = g.reshape(b, g.shape[1], -1).transpose(1, 2)  # (B, T, out)
        out["weight"] = _weight_sqnorm(a, gram, g)
        if m.bias is not None:
            out["bias"] = g.sum(1).pow(2).sum(1)
        return out
    xhat = prep
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        gw = (g * xhat).reshape(b, g.shape[1], -1).sum(-1)
        gb = g.reshape(b, g.shape[1], -1).sum(-1)
    else:
        lead = tuple(range(1, g.dim() - len(m.normalized_shape)))
        gw = (g * xhat).sum(lead) if lead else g * xhat
        gb = g.sum(lead) if lead else g
        gw, gb = gw.reshape(b, -1), gb.reshape(b, -1)
    out["weight"] = gw.pow(2).sum(1)
    if m.bias is not None:
        out["bias"] = gb.pow(2).sum(1)
    return out


def _use_gram(t: int, fan_in: int, fan_out: int) -> bool:
    # multiply-adds per sample: Gram route T²·(in + out), explicit route T·in·out
    return t > 1 and t * (fan_in + fan_out) < fan_in * fan_out


def _gram(a: Tensor) -> Tensor:
    return a @ a.transpose(1, 2)  # (B, T, T)


def _weight_sqnorm(a: Tensor, gram_a: Tensor | None, g: Tensor) -> Tensor:
    """‖Σ_t g_t a_tᵀ‖²_F per sample, for a (B, T, in) and g (B, T, out)."""
    if a.shape[1] == 1:
        return a.pow(2).sum((1, 2)) * g.pow(2).sum((1, 2))
    if gram_a is not None:
        return (gram_a * (g @ g.transpose(1, 2))).sum((1, 2))
    # the explicit route holds (chunk, out, in) per-sample gradients: cap that at ~64 MiB
    chunk = max(1, (64 * 2**20) // (a.element_size() * a.shape[2] * g.shape[2]))
    parts = []
    for i in range(0, a.shape[0], chunk):
        w = torch.bmm(g[i : i + chunk].transpose(1, 2), a[i : i + chunk]).flatten(1)
        parts.append(torch.linalg.vecdot(w, w))
    return torch.cat(parts)

