"""Fresh outputs for the native kernels, shared by the CPU and CUDA backends."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .checks import gate_count
from .kernel_args import state_dtype


def empty_contiguous(t: Tensor) -> Tensor:
    # empty_like without arguments is the cheapest allocation; it keeps t's strides,
    # so only use it when those are the contiguous ones.
    return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


def qrnn_gates_outputs(gates: Tensor, output_gate: bool, batch_first: bool, need_states: bool = True) -> tuple:
    """Fresh (output, states or None, c_n) for a gates forward kernel."""
    shape = gates.shape
    hidden = shape[2] // gate_count(output_gate)
    output = gates.new_empty((shape[0], shape[1], hidden))  # new_empty: gates' device even if the default moved
    # The backward needs every c[t]; without an output gate that is the output itself.
    states = gates.new_empty((shape[0], shape[1], hidden)) if (output_gate and need_states) else None
    c_n = gates.new_empty((shape[0] if batch_first else shape[1], hidden), dtype=state_dtype(gates.dtype))
    return output, states, c_n


def qrnn_gates_grads(gates: Tensor, c0: Optional[Tensor]) -> tuple:
    """Fresh (grad_gates, grad_c0 or None) for a gates backward kernel."""
    return empty_contiguous(gates), (empty_contiguous(c0) if c0 is not None else None)


def forget_mult_grads(f: Tensor, h0: Optional[Tensor]) -> tuple:
    """Fresh (grad_f, grad_x, grad_h0 or None) for a ForgetMult backward kernel."""
    return empty_contiguous(f), empty_contiguous(f), (empty_contiguous(h0) if h0 is not None else None)


def or_empty(t: Optional[Tensor], like: Tensor) -> Tensor:
    """`t`, or an empty tensor on `like`'s device for an absent output (ops return tensors, never None)."""
    return t if t is not None else like.new_empty(0)
