"""ForgetMult's ops: ``qrnn::forget_mult`` and ``qrnn::forget_mult_backward``.

Both are ``torch.library.custom_op``s defined with the schemas of the family's C++ manifest
(cpp/include/qrnn/forget_mult.hpp), with fake (meta), autograd and vmap registrations, so
autograd, ``torch.compile`` and ``torch.library.opcheck`` understand them. Their bodies are
the pure-PyTorch fallback; the native kernels (CPU, and CUDA in builds with it) are
registered per device type (:data:`KERNELS`). Under torch.func transforms and forward-mode
AD, :func:`qrnn.forget_mult` goes through :class:`ForgetMultFunction` instead.
"""

# No `from __future__ import annotations` here: torch 2.4's custom_op reads the annotations
# of the op functions as objects and rejects strings ("unsupported type Tensor").
from typing import Optional

import torch
from torch import Tensor

from ..core.dispatch import first_derivative_only, refuse_double_backward, register_scan_vmap
from ..core.registry import define_op, native_kernels
from ..linear_scan.op import LinearScanFunction, previous_states
from . import kernels
from .checks import check_forget_mult_args, check_forget_mult_backward_args

__all__ = ["forget_mult_op", "forget_mult_backward_op", "ForgetMultFunction", "KERNELS"]

@define_op("forget_mult")
def forget_mult_op(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool, lengths: Optional[Tensor] = None,
                   cu_seqlens: Optional[Tensor] = None, reverse: bool = False) -> Tensor:
    """The ``qrnn::forget_mult`` operator (``torch.ops.qrnn.forget_mult``): ForgetMult's
    forward, what :func:`qrnn.forget_mult` calls when it goes through the dispatcher
    (autograd, ``torch.compile``, ``torch.export``).

    Args:
        f: the forget gate, ``(seq_len, batch, hidden)`` (``(batch, seq_len, hidden)``
            with ``batch_first``), as for :func:`qrnn.forget_mult`.
        x: the candidate values, ``f``'s shape, dtype and device.
        h0: the initial state ``(batch, hidden)`` (``(sequences, hidden)`` with ``cu_seqlens``),
            or None for zeros.
        batch_first: the layout of ``f``, ``x`` and the result.
        lengths: None, or int64 ``(batch,)``: row ``b``'s real steps (:mod:`qrnn.ops.core.sequences`).
        cu_seqlens: None, or int64 ``(sequences + 1,)``: packed sequences in one row.
        reverse: run each sequence backwards, from its last step.

    Returns:
        ``h``, every step's state, in ``f``'s shape and dtype (contiguous); padding steps 0.

    Raises:
        TypeError, ValueError: a bad argument, named (:func:`check_forget_mult_args`); the op
            checks its arguments itself because it can be called directly.

    Differentiable (its backward is :func:`forget_mult_backward_op`). The CPU and CUDA
    kernels are registered per device type; this body, the pure-PyTorch fallback, serves
    every other device.
    """
    # Checked again here: torch.ops.qrnn.forget_mult can be called directly.
    check_forget_mult_args(f, x, h0, batch_first, lengths, cu_seqlens, reverse)
    return kernels.fallback_forward(f, x, h0, batch_first, lengths, cu_seqlens, reverse)


@forget_mult_op.register_fake
def _(f, x, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False):
    torch._check(x.shape == f.shape, lambda: "forget_mult: x must have f's shape")
    return torch.empty_like(f, memory_format=torch.contiguous_format)


@define_op("forget_mult_backward")
def forget_mult_backward_op(
    grad_h: Tensor, f: Tensor, x: Tensor, h: Tensor, h0: Optional[Tensor], batch_first: bool,
    lengths: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None, reverse: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``qrnn::forget_mult_backward`` operator: the gradients of
    :func:`forget_mult_op`.

    Args:
        grad_h: the gradient of the loss with respect to ``h``, ``f``'s shape and dtype.
        f: the forward's ``f``.
        x: the forward's ``x``.
        h: the forward's result.
        h0: the forward's ``h0`` (or None).
        batch_first: the forward's layout.
        lengths: the forward's ``lengths`` (or None).
        cu_seqlens: the forward's ``cu_seqlens`` (or None).
        reverse: the forward's direction.

    Returns:
        ``(grad_f, grad_x, grad_h0)``; ``grad_h0`` is an empty tensor when ``h0`` is None.

    Raises:
        TypeError, ValueError: a bad argument, named (:func:`check_forget_mult_backward_args`).
        NotImplementedError: when differentiated itself (no double backward).

    This body, the pure-PyTorch fallback, serves devices without a native kernel.
    """
    check_forget_mult_backward_args(grad_h, f, x, h, h0, batch_first, lengths, cu_seqlens, reverse)
    return kernels.fallback_backward(grad_h, f, x, h, h0, batch_first, lengths, cu_seqlens, reverse)


@forget_mult_backward_op.register_fake
def _(grad_h, f, x, h, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False):
    grad_f = torch.empty_like(f, memory_format=torch.contiguous_format)
    grad_x = torch.empty_like(f, memory_format=torch.contiguous_format)
    grad_h0 = torch.empty_like(h0, memory_format=torch.contiguous_format) if h0 is not None else f.new_empty(0)
    return grad_f, grad_x, grad_h0


def _padded(inputs) -> tuple:
    """The forward's 7 arguments, the trailing optional ones filled in."""
    return tuple(inputs) + (None, None, False)[len(inputs) - 4:]


def _setup_context(ctx, inputs, output):
    f, x, h0, batch_first, lengths, cu_seqlens, reverse = _padded(inputs)
    ctx.save_for_backward(f, x, output, h0, lengths, cu_seqlens)
    ctx.batch_first, ctx.reverse = batch_first, reverse


def _backward(ctx, grad_h):
    f, x, h, h0, lengths, cu_seqlens = ctx.saved_tensors
    grad_f, grad_x, grad_h0 = forget_mult_backward_op(grad_h, f, x, h, h0, ctx.batch_first, lengths, cu_seqlens,
                                                      ctx.reverse)
    return grad_f, grad_x, (grad_h0 if h0 is not None else None), None, None, None, None


forget_mult_op.register_autograd(_backward, setup_context=_setup_context)
forget_mult_backward_op.register_autograd(refuse_double_backward("forget_mult"))


# ---- torch.func and forward-mode AD ---------------------------------------------------------
# custom_op's own autograd function has no setup_context (torch.func refuses it) and no
# tangent rule; under those transforms qrnn.forget_mult calls the op through these instead.


_ForgetMultBackward = first_derivative_only("forget_mult", forget_mult_backward_op)


def _tangent(f, x, h, h0, df, dx, dh0, batch_first: bool, reverse: bool) -> Tensor:
    """The tangent of h: ``dh[t] = (1 - f[t]) dh[t-1] + (f[t] dx[t] + df[t] (x[t] - h[t-1]))``
    from ``dh[-1] = dh0``: a linear scan with decay 1 - f."""
    if f.numel() == 0 or (df is None and dx is None and dh0 is None):
        return torch.zeros_like(f)
    inputs = f * dx if dx is not None else torch.zeros_like(f)
    if df is not None:
        inputs = inputs + df * (x - previous_states(h, h0, reverse, batch_first))
    # Through the autograd.Function, not the bare op: inside a torch.func transform torch 2.4
    # refuses a custom op's own autograd (it has no setup_context).
    return LinearScanFunction.apply(1 - f, inputs, dh0, reverse, batch_first)


class ForgetMultFunction(torch.autograd.Function):
    """qrnn::forget_mult with a setup_context (torch.func), a tangent rule (forward-mode AD)
    and vmap through the ops' vmap rules."""

    generate_vmap_rule = True

    @staticmethod
    def forward(f, x, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False):
        return forget_mult_op(f, x, h0, batch_first, lengths, cu_seqlens, reverse)

    @staticmethod
    def setup_context(ctx, inputs, output):
        f, x, h0, batch_first, lengths, cu_seqlens, reverse = _padded(inputs)
        ctx.save_for_backward(f, x, output, h0, lengths, cu_seqlens)
        ctx.save_for_forward(f, x, output, h0, lengths, cu_seqlens)
        ctx.batch_first, ctx.reverse = batch_first, reverse

    @staticmethod
    def backward(ctx, grad_h):
        f, x, h, h0, lengths, cu_seqlens = ctx.saved_tensors
        grad_f, grad_x, grad_h0 = _ForgetMultBackward.apply(grad_h, f, x, h, h0, ctx.batch_first, lengths,
                                                            cu_seqlens, ctx.reverse)
        return grad_f, grad_x, (grad_h0 if h0 is not None else None), None, None, None, None

    @staticmethod
    def jvp(ctx, df, dx, dh0, *_flags):
        f, x, h, h0, lengths, cu_seqlens = ctx.saved_tensors
        if lengths is not None or cu_seqlens is not None:
            raise NotImplementedError("forget_mult: forward-mode AD of a call with lengths or cu_seqlens is not "
                                      "supported; use reverse mode (backward) there")
        return _tangent(f, x, h, h0, df, dx, dh0, ctx.batch_first, ctx.reverse)


# The kernels take any batch: the vmapped dimension becomes part of it.
register_scan_vmap("forget_mult", forget_mult_op, forget_mult_backward_op)


KERNELS = native_kernels(forget_mult_op, forget_mult_backward_op, check_forget_mult_args,
                         check_forget_mult_backward_args, kernels)
