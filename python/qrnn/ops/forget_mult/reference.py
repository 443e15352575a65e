"""Plain PyTorch ForgetMult, one expression per time step: the fallback's body and the tests'
ground truth (in float64). Differentiable by autograd; benchmarks use it as the original
per-timestep path."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def forget_mult_reference(f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *,
                          batch_first: bool = False) -> Tensor:
    """``h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1]``, computed in the inputs' dtype."""
    if batch_first:
        f, x = f.transpose(0, 1), x.transpose(0, 1)
    h = f.new_zeros(f.shape[1:]) if h0 is None else h0.to(f.dtype)
    steps = []
    for t in range(f.shape[0]):
        h = f[t] * x[t] + (1 - f[t]) * h
        steps.append(h)
    out = torch.stack(steps) if steps else torch.empty_like(f)
    return out.transpose(0, 1) if batch_first else out


def forget_mult_backward_reference(grad_h: Tensor, f: Tensor, x: Tensor, h: Tensor,
                                   h0: Optional[Tensor] = None, *, batch_first: bool = False):
    """Gradients (grad_f, grad_x, grad_h0) of :func:`forget_mult_reference`, by the
    explicit reverse-time loop rather than autograd (fast enough for long sequences)."""
    if batch_first:
        grad_h, f, x, h = (t.transpose(0, 1) for t in (grad_h, f, x, h))
    g = f.new_zeros(f.shape[1:])
    grad_f, grad_x = torch.empty_like(f), torch.empty_like(x)
    for t in range(f.shape[0] - 1, -1, -1):
        g = g + grad_h[t]
        h_prev = h[t - 1] if t > 0 else (h0.to(f.dtype) if h0 is not None else torch.zeros_like(g))
        grad_x[t] = f[t] * g
        grad_f[t] = (x[t] - h_prev) * g
        g = g - f[t] * g
    if batch_first:
        grad_f, grad_x = grad_f.transpose(0, 1), grad_x.transpose(0, 1)
    return grad_f, grad_x, (g if h0 is not None else None)
