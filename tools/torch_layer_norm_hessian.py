"""Reproduces the torch.func.hessian error through layer norm that docs/internals.md reports.

    .venv/bin/python tools/torch_layer_norm_hessian.py

f(x, w, b) = Σ c ⊙ tanh(layer_norm(x; w, b)), 68 numbers in float64. Prints how far
torch.func.hessian is from symmetric, and how far each of its off-diagonal blocks and a
vmapped jvp∘grad (the func backend's product) are from central differences of autograd's
gradient.
"""

import torch
import torch.nn.functional as F
from torch.func import grad, hessian, jvp, vmap

D = 4
torch.manual_seed(0)
c = torch.randn(3, 5, D, dtype=torch.float64)
theta = torch.randn(68, dtype=torch.float64)  # x (3·5·4), then w (4), then b (4)
X, W = slice(0, 60), slice(60, 64)


def f(t):
    return (torch.tanh(F.layer_norm(t[X].view(3, 5, D), (D,), t[W], t[64:])) * c).sum()


def g(t):
    t = t.detach().requires_grad_()
    return torch.autograd.grad(f(t), t)[0]


h = 1e-6
# row j: ∂/∂w_j of the gradient, by central differences
fd = torch.stack([(g(theta + h * e) - g(theta - h * e)) / (2 * h) for e in torch.eye(68, dtype=torch.float64)[W]])
H = hessian(f)(theta)
HV = vmap(lambda u: jvp(grad(f), (theta,), (u,))[1])(torch.eye(68, dtype=torch.float64))
print(f"torch {torch.__version__}")
print(f"torch.func.hessian: max |H - Hᵀ|               {(H - H.T).abs().max():.3g}")
print(f"  block ∂²f/∂x∂w against differences         {(H[X, W].T - fd[:, X]).abs().max():.3g}")
print(f"  block ∂²f/∂w∂x against differences         {(H[W, X] - fd[:, X]).abs().max():.3g}")
print(f"vmap(jvp(grad(f))) against differences       {(HV[W, X] - fd[:, X]).abs().max():.3g}")
