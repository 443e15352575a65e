"""Fresh outputs for the native kernels, shared by every family's backends."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def empty_contiguous(t: Tensor) -> Tensor:
    # empty_like without arguments is the cheapest allocation; it keeps t's strides,
    # so only use it when those are the contiguous ones.
    return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


def or_empty(t: Optional[Tensor], like: Tensor) -> Tensor:
    """`t`, or an empty tensor on `like`'s device for an absent output (ops return tensors, never None)."""
    return t if t is not None else like.new_empty(0)
