"""Plain PyTorch reference implementations, beside the kernels they check.

Slow on purpose (one expression per time step) and differentiable by autograd; tests run
them in float64 as ground truth, benchmarks use them as the original per-timestep path.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def forget_mult_reference(f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *,
                          batch_first: bool = False) -> Tensor:
    """``h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1]``, computed in the inputs' dtype."""
    if batch_first:
        f, x = f.transpose(0, 1), x.transpose(0, 1)
    h = torch.zeros_like(f[0]) if h0 is None else h0.to(f.dtype)
    steps = []
    for t in range(f.shape[0]):
        h = f[t] * x[t] + (1 - f[t]) * h
        steps.append(h)
    out = torch.stack(steps) if steps else torch.empty_like(f)
    return out.transpose(0, 1) if batch_first else out
