"""The linear_scan op family: ``qrnn::linear_scan`` and ``qrnn::linear_scan_backward``.

Both are ``torch.library.custom_op``s defined with the schemas of the family's C++ manifest
(cpp/include/qrnn/linear_scan.hpp, exported by qrnn._C), with fake, autograd and vmap
registrations; their bodies are the pure-PyTorch fallback and the native kernels are
registered per device type (:data:`KERNELS`). Under torch.func transforms and forward-mode
AD, :func:`qrnn.linear_scan` goes through :class:`LinearScanFunction` instead.
"""

# No `from __future__ import annotations`: torch 2.4's custom_op reads annotations as objects.
from typing import Optional

import torch
from torch import Tensor

from ..core.dispatch import first_derivative_only, refuse_double_backward, register_scan_vmap
from ..core.registry import define_op, native_kernels
from . import kernels
from .checks import check_args, check_backward_args

__all__ = ["linear_scan_op", "linear_scan_backward_op", "LinearScanFunction", "KERNELS", "previous_states"]

@define_op("linear_scan")
def linear_scan_op(a: Tensor, b: Tensor, h0: Optional[Tensor], reverse: bool, batch_first: bool,
                   lengths: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None) -> Tensor:
    """The ``qrnn::linear_scan`` operator (``torch.ops.qrnn.linear_scan``): the forward of
    ``h[t] = a[t] * h[t-1] + b[t]``, what :func:`qrnn.linear_scan` calls when it goes through
    the dispatcher (autograd, ``torch.compile``, ``torch.export``).

    Args:
        a: the decays, ``(seq_len, batch, hidden)`` (``(batch, seq_len, hidden)`` with
            ``batch_first``), as for :func:`qrnn.linear_scan`.
        b: the inputs, ``a``'s shape, dtype and device.
        h0: the initial state ``(batch, hidden)`` (``(sequences, hidden)`` with ``cu_seqlens``),
            or None for zeros.
        reverse: run each sequence backwards, from its last step.
        batch_first: the layout of ``a``, ``b`` and the result.
        lengths: None, or int64 ``(batch,)``: row ``b``'s real steps (:mod:`qrnn.ops.core.sequences`).
        cu_seqlens: None, or int64 ``(sequences + 1,)``: packed sequences in one row.

    Returns:
        ``h``, every step's state, in ``a``'s shape and dtype (contiguous); padding steps 0.

    Raises:
        TypeError, ValueError: a bad argument, named; the op checks its arguments itself
            because it can be called directly.

    Differentiable (its backward is :func:`linear_scan_backward_op`). The CPU and CUDA
    kernels are registered per device type; this body, the pure-PyTorch fallback, serves
    every other device.
    """
    check_args(a, b, h0, reverse, batch_first, lengths, cu_seqlens)  # the op can be called directly
    return kernels.fallback_forward(a, b, h0, reverse, batch_first, lengths, cu_seqlens)


@linear_scan_op.register_fake
def _(a, b, h0, reverse, batch_first, lengths=None, cu_seqlens=None):
    torch._check(b.shape == a.shape, lambda: "linear_scan: b must have a's shape")
    return torch.empty_like(a, memory_format=torch.contiguous_format)


@define_op("linear_scan_backward")
def linear_scan_backward_op(grad_h: Tensor, a: Tensor, h: Tensor, h0: Optional[Tensor], reverse: bool,
                            batch_first: bool, lengths: Optional[Tensor] = None,
                            cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """The ``qrnn::linear_scan_backward`` operator: the gradients of :func:`linear_scan_op`.

    Args:
        grad_h: the gradient of the loss with respect to ``h``, ``a``'s shape and dtype.
        a: the forward's decays (its ``b`` is not needed).
        h: the forward's result.
        h0: the forward's ``h0`` (or None).
        reverse: the forward's direction.
        batch_first: the forward's layout.
        lengths: the forward's ``lengths`` (or None).
        cu_seqlens: the forward's ``cu_seqlens`` (or None).

    Returns:
        ``(grad_a, grad_b, grad_h0)``; ``grad_h0`` is an empty tensor when ``h0`` is None.

    Raises:
        TypeError, ValueError: a bad argument, named.
        NotImplementedError: when differentiated itself (no double backward).

    This body, the pure-PyTorch fallback, serves devices without a native kernel.
    """
    check_backward_args(grad_h, a, h, h0, reverse, batch_first, lengths, cu_seqlens)
    return kernels.fallback_backward(grad_h, a, h, h0, reverse, batch_first, lengths, cu_seqlens)


@linear_scan_backward_op.register_fake
def _(grad_h, a, h, h0, reverse, batch_first, lengths=None, cu_seqlens=None):
    like = torch.empty_like(a, memory_format=torch.contiguous_format)
    grad_h0 = torch.empty_like(h0, memory_format=torch.contiguous_format) if h0 is not None else a.new_empty(0)
    return like, torch.empty_like(like), grad_h0


def _setup_context(ctx, inputs, output):
    a, _, h0, reverse, batch_first, lengths, cu_seqlens = _padded(inputs)
    ctx.save_for_backward(a, output, h0, lengths, cu_seqlens)  # the backward needs no b
    ctx.reverse, ctx.batch_first = reverse, batch_first


def _backward(ctx, grad_h):
    a, h, h0, lengths, cu_seqlens = ctx.saved_tensors
    grad_a, grad_b, grad_h0 = linear_scan_backward_op(grad_h, a, h, h0, ctx.reverse, ctx.batch_first, lengths,
                                                      cu_seqlens)
    return grad_a, grad_b, (grad_h0 if h0 is not None else None), None, None, None, None


def _padded(inputs) -> tuple:
    """The forward's 7 arguments, the trailing optional ones filled in."""
    return tuple(inputs) + (None,) * (7 - len(inputs))


linear_scan_op.register_autograd(_backward, setup_context=_setup_context)
linear_scan_backward_op.register_autograd(refuse_double_backward("linear_scan"))

KERNELS = native_kernels(linear_scan_op, linear_scan_backward_op, check_args, check_backward_args, kernels)


# vmap: the kernels take any batch, so the vmapped dimension joins it.
register_scan_vmap("linear_scan", linear_scan_op, linear_scan_backward_op)


# ---- torch.func and forward-mode AD ---------------------------------------------------------------

_LinearScanBackward = first_derivative_only("linear_scan", linear_scan_backward_op)


def previous_states(h: Tensor, h0: Optional[Tensor], reverse: bool, batch_first: bool) -> Tensor:
    """h[t-1] for every t in the scan's order (h0, or zeros, before the first step)."""
    time = 1 if batch_first else 0
    T = h.shape[time]
    start = (h0.to(h.dtype) if h0 is not None else h.new_zeros(h.shape[1 - time], h.shape[2])).unsqueeze(time)
    if reverse:
        return torch.cat([h.narrow(time, 1, T - 1), start], time)
    return torch.cat([start, h.narrow(time, 0, T - 1)], time)


class LinearScanFunction(torch.autograd.Function):
    """qrnn::linear_scan with a setup_context (torch.func), a tangent rule (forward-mode AD) and
    vmap through the ops' rules. The tangent is itself a linear scan with the same decays:
    dh[t] = a[t] dh[t-1] + (da[t] h[t-1] + db[t]), dh[-1] = dh0."""

    generate_vmap_rule = True

    @staticmethod
    def forward(a, b, h0, reverse, batch_first, lengths=None, cu_seqlens=None):
        return linear_scan_op(a, b, h0, reverse, batch_first, lengths, cu_seqlens)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, _, h0, reverse, batch_first, lengths, cu_seqlens = _padded(inputs)
        ctx.save_for_backward(a, output, h0, lengths, cu_seqlens)
        ctx.save_for_forward(a, output, h0, lengths, cu_seqlens)
        ctx.reverse, ctx.batch_first = reverse, batch_first

    @staticmethod
    def backward(ctx, grad_h):
        a, h, h0, lengths, cu_seqlens = ctx.saved_tensors
        grad_a, grad_b, grad_h0 = _LinearScanBackward.apply(grad_h, a, h, h0, ctx.reverse, ctx.batch_first,
                                                            lengths, cu_seqlens)
        return grad_a, grad_b, (grad_h0 if h0 is not None else None), None, None, None, None

    @staticmethod
    def jvp(ctx, da, db, dh0, *_flags):
        a, h, h0, lengths, cu_seqlens = ctx.saved_tensors
        if lengths is not None or cu_seqlens is not None:
            raise NotImplementedError("linear_scan: forward-mode AD of a call with lengths or cu_seqlens is not "
                                      "supported; use reverse mode (backward) there")
        if a.numel() == 0 or (da is None and db is None and dh0 is None):
            return torch.zeros_like(h)
        inputs = db if db is not None else torch.zeros_like(a)
        if da is not None:
            inputs = inputs + da * previous_states(h, h0, ctx.reverse, ctx.batch_first)
        # The tangent through this Function, not the bare op: inside a torch.func transform torch
        # 2.4 refuses a custom op's own autograd (it has no setup_context).
        return LinearScanFunction.apply(a, inputs, dh0, ctx.reverse, ctx.batch_first)
