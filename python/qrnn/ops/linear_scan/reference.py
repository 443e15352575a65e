"""Plain PyTorch linear_scan, one expression per time step: the fallback's body and the
tests' ground truth (in float64). Differentiable by autograd."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def _time_major(batch_first: bool, *tensors: Tensor) -> list:
    return [t.transpose(0, 1) if batch_first else t for t in tensors]


def linear_scan_reference(a: Tensor, b: Tensor, h0: Optional[Tensor] = None, *, reverse: bool = False,
                          batch_first: bool = False) -> Tensor:
    """``h[t] = a[t] * h[t-1] + b[t]`` (``h[t+1]`` when ``reverse``), computed in the inputs' dtype."""
    a, b = _time_major(batch_first, a, b)
    h = a.new_zeros(a.shape[1:]) if h0 is None else h0.to(a.dtype)
    steps: list = [None] * a.shape[0]
    for t in (reversed(range(a.shape[0])) if reverse else range(a.shape[0])):
        h = a[t] * h + b[t]
        steps[t] = h
    out = torch.stack(steps) if steps else torch.empty_like(a)
    return out.transpose(0, 1) if batch_first else out


def linear_scan_backward_reference(grad_h: Tensor, a: Tensor, h: Tensor, h0: Optional[Tensor] = None, *,
                                   reverse: bool = False, batch_first: bool = False):
    """(grad_a, grad_b, grad_h0) of :func:`linear_scan_reference` by the explicit loop against
    the scan's direction: g += dh[t]; grad_b[t] = g; grad_a[t] = h_prev g; g *= a[t]."""
    grad_h, a, h = _time_major(batch_first, grad_h, a, h)
    T = a.shape[0]
    order = list(reversed(range(T))) if reverse else list(range(T))  # the scan's order
    start = h0.to(a.dtype) if h0 is not None else a.new_zeros(a.shape[1:])
    g = a.new_zeros(a.shape[1:])
    grad_a, grad_b = torch.empty_like(a), torch.empty_like(a)
    for k in range(T - 1, -1, -1):
        t = order[k]
        g = g + grad_h[t]
        grad_b[t] = g
        grad_a[t] = (h[order[k - 1]] if k > 0 else start) * g
        g = a[t] * g
    if batch_first:
        grad_a, grad_b = grad_a.transpose(0, 1), grad_b.transpose(0, 1)
    return grad_a, grad_b, (g.to(h0.dtype) if h0 is not None else None)
