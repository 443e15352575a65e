"""The pure-PyTorch path of devices without native kernels (mps, xpu, ROCm builds, ...):
the reference recurrence one time step at a time, with the kernels' float32 state for
16-bit data. Correct anywhere torch runs, and many times slower than a kernel. (Fused
gates have no fallback kernel: qrnn.qrnn_gates runs the unfused form on such devices.)"""

from __future__ import annotations

from ..reference import forget_mult_backward_reference, forget_mult_reference
from .kernel_args import state_dtype

__all__ = ["forget_mult_forward", "forget_mult_backward"]


def forget_mult_forward(f, x, h0, batch_first):
    math = state_dtype(f.dtype)
    h = forget_mult_reference(f.to(math), x.to(math), None if h0 is None else h0.to(math), batch_first=batch_first)
    return h.to(f.dtype).contiguous()


def forget_mult_backward(grad_h, f, x, h, h0, batch_first):
    """The backward of :func:`forget_mult_forward`: the reference reverse-time loop."""
    math = state_dtype(f.dtype)
    grad_f, grad_x, grad_h0 = forget_mult_backward_reference(
        grad_h.to(math), f.to(math), x.to(math), h.to(math), None if h0 is None else h0.to(math),
        batch_first=batch_first)
    return (grad_f.to(f.dtype).contiguous(), grad_x.to(f.dtype).contiguous(),
            grad_h0.to(h0.dtype) if h0 is not None else f.new_empty(0))
