"""The ForgetMult op family: ``qrnn::forget_mult`` and ``qrnn::forget_mult_backward``.

Both are ``torch.library.custom_op``s with fake (meta) and autograd registrations, so
autograd, ``torch.compile`` and ``torch.library.opcheck`` understand them. Their bodies are
the pure-PyTorch fallback; the native kernels (the CPU backend, and the CUDA backend in
builds with it) are registered per device type. When nothing is traced and no gradient is
needed, :func:`forget_mult` skips the dispatcher and calls the kernel directly.
"""

# No `from __future__ import annotations` here: torch 2.4's custom_op reads the annotations
# of the op functions as objects and rejects strings ("unsupported type Tensor").
from typing import Callable, Optional

import torch
from torch import Tensor

from ._dispatch import (
    direct_call_allowed,
    first_derivative_only,
    fold_batch,
    refuse_double_backward,
    refuse_legacy_onnx,
    register_kernel,
    register_vmap,
    unfold_batch,
    use_autograd_function,
)
from .checks import check_forget_mult_args, check_forget_mult_backward_args
from .cpu import forget_mult_backward as cpu_backward
from .cpu import forget_mult_forward as cpu_forward
from .cuda import AVAILABLE as CUDA_AVAILABLE
from .cuda import forget_mult_backward as cuda_backward
from .cuda import forget_mult_forward as cuda_forward
from .fallback import forget_mult_backward as fallback_backward
from .fallback import forget_mult_forward as fallback_forward
from .sharding import check_sharded_args

__all__ = ["forget_mult", "forget_mult_op", "forget_mult_backward_op", "has_native_kernels",
           "FORGET_MULT_FORWARD_KERNELS", "FORGET_MULT_BACKWARD_KERNELS"]

# The native kernels per device type, for the eager direct path (the ops' per-device
# registrations are made from the same functions by _set_native_kernels).
FORGET_MULT_FORWARD_KERNELS: dict = {}
FORGET_MULT_BACKWARD_KERNELS: dict = {}
_cpu_forward: Optional[Callable] = None  # FORGET_MULT_FORWARD_KERNELS.get("cpu"), one lookup cheaper


def has_native_kernels(device) -> bool:
    """Whether ``device`` (a torch.device or its type name) runs qrnn's native ForgetMult
    kernels; any other device runs the slower pure-PyTorch fallback."""
    return getattr(device, "type", device) in FORGET_MULT_FORWARD_KERNELS


@torch.library.custom_op("qrnn::forget_mult", mutates_args=())
def forget_mult_op(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    """``h``. This body serves devices without a native kernel."""
    # Checked again here: torch.ops.qrnn.forget_mult can be called directly.
    check_forget_mult_args(f, x, h0, batch_first)
    return fallback_forward(f, x, h0, batch_first)


@forget_mult_op.register_fake
def _(f, x, h0, batch_first):
    torch._check(x.shape == f.shape, lambda: "forget_mult: x must have f's shape")
    return torch.empty_like(f, memory_format=torch.contiguous_format)


@torch.library.custom_op("qrnn::forget_mult_backward", mutates_args=())
def forget_mult_backward_op(
    grad_h: Tensor, f: Tensor, x: Tensor, h: Tensor, h0: Optional[Tensor], batch_first: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (grad_f, grad_x, grad_h0); grad_h0 is an empty tensor when h0 is None.
    This body serves devices without a native kernel."""
    check_forget_mult_backward_args(grad_h, f, x, h, h0, batch_first)
    return fallback_backward(grad_h, f, x, h, h0, batch_first)


@forget_mult_backward_op.register_fake
def _(grad_h, f, x, h, h0, batch_first):
    grad_f = torch.empty_like(f, memory_format=torch.contiguous_format)
    grad_x = torch.empty_like(f, memory_format=torch.contiguous_format)
    grad_h0 = torch.empty_like(h0, memory_format=torch.contiguous_format) if h0 is not None else f.new_empty(0)
    return grad_f, grad_x, grad_h0


def _setup_context(ctx, inputs, output):
    f, x, h0, batch_first = inputs
    ctx.save_for_backward(f, x, output, h0)
    ctx.batch_first = batch_first


def _backward(ctx, grad_h):
    f, x, h, h0 = ctx.saved_tensors
    grad_f, grad_x, grad_h0 = forget_mult_backward_op(grad_h, f, x, h, h0, ctx.batch_first)
    return grad_f, grad_x, (grad_h0 if h0 is not None else None), None


forget_mult_op.register_autograd(_backward, setup_context=_setup_context)
forget_mult_backward_op.register_autograd(refuse_double_backward("forget_mult"))


# ---- torch.func and forward-mode AD ---------------------------------------------------------
# custom_op's own autograd function has no setup_context (torch.func refuses it) and no
# tangent rule; under those transforms qrnn.forget_mult calls the op through these instead.


_ForgetMultBackward = first_derivative_only("forget_mult", forget_mult_backward_op)


def _linear_scan(a: Tensor, f: Tensor, batch_first: bool) -> Tensor:
    """``e[t] = a[t] + (1 - f[t]) * e[t-1]``, ``e[-1] = 0``, on the backward kernel: it runs
    ``c[s] = g[s] + (1 - F[s+1]) * c[s+1]`` backwards in time and returns ``c * (X - H[s-1])``
    as grad_f, so with time flipped, ``F[s] = f[T-s]``, ``X = 1`` and ``H = 0`` it is e."""
    time = 1 if batch_first else 0
    T = f.shape[time]
    g = a.flip(time)
    shifted = torch.cat([f.narrow(time, 0, 1), f.narrow(time, 1, T - 1).flip(time)], time)
    c, _, _ = _ForgetMultBackward.apply(g, shifted, torch.ones_like(a), torch.zeros_like(a), None, batch_first)
    return c.flip(time)


def _tangent(f, x, h, h0, df, dx, dh0, batch_first: bool) -> Tensor:
    """The tangent of h: ``dh[t] = f[t] dx[t] + df[t] (x[t] - h[t-1]) + (1 - f[t]) dh[t-1]``,
    the same first-order recurrence (decay 1 - f) with an additive input."""
    time = 1 if batch_first else 0
    T = f.shape[time]
    if T == 0 or (df is None and dx is None and dh0 is None):
        return torch.zeros_like(f)
    a = f * dx if dx is not None else torch.zeros_like(f)
    if df is not None:
        start = (h0.to(f.dtype) if h0 is not None else f.new_zeros(f.shape[1 - time], f.shape[2])).unsqueeze(time)
        h_prev = torch.cat([start, h.narrow(time, 0, T - 1)], time)
        a = a + df * (x - h_prev)
    if dh0 is not None:  # the initial tangent enters through the first step's decay
        first = a.narrow(time, 0, 1) + ((1 - f.narrow(time, 0, 1)) * dh0.unsqueeze(time)).to(f.dtype)
        a = torch.cat([first, a.narrow(time, 1, T - 1)], time)
    return _linear_scan(a, f, batch_first)


class _ForgetMult(torch.autograd.Function):
    """qrnn::forget_mult with a setup_context (torch.func), a tangent rule (forward-mode AD)
    and vmap through the ops' vmap rules."""

    generate_vmap_rule = True

    @staticmethod
    def forward(f, x, h0, batch_first):
        return forget_mult_op(f, x, h0, batch_first)

    @staticmethod
    def setup_context(ctx, inputs, output):
        f, x, h0, batch_first = inputs
        ctx.save_for_backward(f, x, output, h0)
        ctx.save_for_forward(f, x, output, h0)
        ctx.batch_first = batch_first

    @staticmethod
    def backward(ctx, grad_h):
        f, x, h, h0 = ctx.saved_tensors
        grad_f, grad_x, grad_h0 = _ForgetMultBackward.apply(grad_h, f, x, h, h0, ctx.batch_first)
        return grad_f, grad_x, (grad_h0 if h0 is not None else None), None

    @staticmethod
    def jvp(ctx, df, dx, dh0, _):
        f, x, h, h0 = ctx.saved_tensors
        return _tangent(f, x, h, h0, df, dx, dh0, ctx.batch_first)


def _forget_mult_vmap(info, in_dims, f, x, h0, batch_first):
    # The kernels take any batch: the vmapped dimension becomes part of it.
    f_dim, x_dim, h0_dim, _ = in_dims
    size, batch = info.batch_size, (0 if batch_first else 1)
    h = forget_mult_op(fold_batch(f, f_dim, size, batch), fold_batch(x, x_dim, size, batch),
                       fold_batch(h0, h0_dim, size, 0), batch_first)
    return unfold_batch(h, size, batch), batch


def _forget_mult_backward_vmap(info, in_dims, grad_h, f, x, h, h0, batch_first):
    size, batch = info.batch_size, (0 if batch_first else 1)
    folded = [fold_batch(t, d, size, batch) for t, d in zip((grad_h, f, x, h), in_dims)]
    grad_f, grad_x, grad_h0 = forget_mult_backward_op(*folded, fold_batch(h0, in_dims[4], size, 0), batch_first)
    if h0 is None:
        return (unfold_batch(grad_f, size, batch), unfold_batch(grad_x, size, batch), grad_h0), (batch, batch, None)
    return ((unfold_batch(grad_f, size, batch), unfold_batch(grad_x, size, batch), unfold_batch(grad_h0, size, 0)),
            (batch, batch, 0))


register_vmap(forget_mult_op, _forget_mult_vmap)
register_vmap(forget_mult_backward_op, _forget_mult_backward_vmap)


def _set_native_kernels(device: str, forward: Optional[Callable], backward: Optional[Callable]) -> tuple:
    """Make ``forward``/``backward`` the native kernels of ``device`` tensors, for the eager
    path and the ops' registrations alike; None for both: the fallback. Returns the
    previous pair (None, None where there was none)."""
    global _cpu_forward
    previous = (FORGET_MULT_FORWARD_KERNELS.pop(device, None), FORGET_MULT_BACKWARD_KERNELS.pop(device, None))
    if forward is not None and backward is not None:
        FORGET_MULT_FORWARD_KERNELS[device], FORGET_MULT_BACKWARD_KERNELS[device] = forward, backward
    _cpu_forward = FORGET_MULT_FORWARD_KERNELS.get("cpu")
    register_kernel(forget_mult_op, device, check_forget_mult_args, forward or fallback_forward)
    register_kernel(forget_mult_backward_op, device, check_forget_mult_backward_args,
                    backward or fallback_backward)
    return previous


_set_native_kernels("cpu", cpu_forward, cpu_backward)
if CUDA_AVAILABLE:
    _set_native_kernels("cuda", cuda_forward, cuda_backward)


def forget_mult(f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False) -> Tensor:
    """ForgetMult: ``h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1]`` with ``h[-1] = h0``.

    The convention of the original pytorch-qrnn: ``f`` (the forget gate, usually a
    sigmoid output) weights the new candidate ``x``; ``1 - f`` keeps the old state.

    Args:
        f: forget gate, ``(seq_len, batch, hidden)`` (or ``(batch, seq_len, hidden)``
            with ``batch_first=True``); float32, float64, bfloat16 or float16, CPU or CUDA.
        x: candidate values, same shape, dtype and device as ``f``.
        h0: initial state ``(batch, hidden)``, or None for zeros. Its dtype is ``f``'s, or
            float32 for 16-bit ``f`` (a float32 carried state).
        batch_first: whether dimension 0 is batch instead of time.

    Returns:
        ``h``, every step's state, in ``f``'s shape, layout convention and dtype. Math
        and the carried state are float32 for 16-bit inputs (float64 for float64).
        Any strides are accepted without a copy. Differentiable in ``f``, ``x`` and
        ``h0``; works under ``torch.compile(fullgraph=True)``.
    """
    check_forget_mult_args(f, x, h0, batch_first)
    if direct_call_allowed(f, x, h0, None):
        # Direct call: the dispatcher and autograd machinery would cost more than the kernel.
        kernel = _cpu_forward if f.is_cpu else FORGET_MULT_FORWARD_KERNELS.get(f.device.type)
        if kernel is not None:  # none for meta tensors (the op's fake impl serves them) or the fallback's devices
            return kernel(f, x, h0, batch_first)
    if type(f) is not Tensor or type(x) is not Tensor:  # a subclass, perhaps a DTensor
        check_sharded_args("forget_mult", batch_first, f=f, x=x)
    if use_autograd_function():
        return _ForgetMult.apply(f, x, h0, batch_first)
    refuse_legacy_onnx()
    return forget_mult_op(f, x, h0, batch_first)
