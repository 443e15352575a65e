"""The fused QRNN gates' ops: ``qrnn::qrnn_gates`` and ``qrnn::qrnn_gates_backward``
(activations + ForgetMult + output gate in one kernel), and :func:`qrnn_gates_unfused`.

``qrnn::qrnn_gates`` reads the gate pre-activations G = (Z | F | O) that a QRNN layer's
single GEMM produced, in place through strides, and writes the layer output and final
state in one pass; its backward recomputes the activations and writes grad G in G's own
(time, batch, gates) form, the layout the GEMM backward reads. The fused kernels are
registered per device type (CPU, and CUDA in builds with it); devices without one use
:func:`qrnn_gates_unfused` (PyTorch activations + ``qrnn.forget_mult``), which is also the
reference the fused kernel is tested against.
"""

# No `from __future__ import annotations` here: torch 2.4's custom_op reads the annotations
# of the op functions as objects and rejects strings ("unsupported type Tensor").
from typing import Optional

import torch
from torch import Tensor

from ..core.dispatch import (
    FORWARD_MODE_MESSAGE,
    first_derivative_only,
    fold_batch,
    refuse_double_backward,
    refuse_vmap_of_sequences,
    register_vmap,
    unfold_batch,
)
from ..core.kernel_args import state_dtype
from ..core.registry import define_op, native_kernels
from ..core.sequences import sequence_count
from ..forget_mult import forget_mult
from . import kernels
from .checks import check_qrnn_gates_args, check_qrnn_gates_backward_args, gate_count

__all__ = ["qrnn_gates_op", "qrnn_gates_backward_op", "QrnnGatesFunction", "qrnn_gates_unfused", "KERNELS"]

# The ops' argument checks in the ops' argument order (the op can be called directly, and
# the kernels take shapes on trust: a smaller c0 or mask would be read out of bounds).
def _check_forward_op(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                      cu_seqlens=None) -> None:
    check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first, cu_seqlens)


def _check_backward_op(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                       batch_first, reverse, cu_seqlens=None) -> None:
    check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                   output_gate, batch_first, cu_seqlens)


def _no_fused_kernel(gates: Tensor) -> RuntimeError:
    return RuntimeError(f"qrnn has no fused gate kernel for {gates.device.type} tensors: call qrnn.qrnn_gates, "
                        "which runs the unfused form on such devices")


@define_op("qrnn_gates")
def qrnn_gates_op(gates: Tensor, c0: Optional[Tensor], forget_mask: Optional[Tensor], lengths: Optional[Tensor],
                  forget_scale: float, output_gate: bool, batch_first: bool, reverse: bool,
                  cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """The ``qrnn::qrnn_gates`` operator (``torch.ops.qrnn.qrnn_gates``): the fused gates'
    forward, what :func:`qrnn.qrnn_gates` calls when it goes through the dispatcher
    (autograd, ``torch.compile``, ``torch.export``).

    Args:
        gates: the pre-activations, blocks Z, F, O (Z, F without ``output_gate``).
        c0: the initial state ``(batch, hidden)``, or None for zeros.
        forget_mask: zoneout's keep mask in the output's shape, or None.
        lengths: int64 ``(batch,)`` valid steps per sequence, or None.
        forget_scale: multiplies f.
        output_gate: whether gates holds the O block.
        batch_first: the layout of gates and the outputs.
        reverse: run each sequence from its own last valid step back.
        cu_seqlens: int64 ``(sequences + 1,)`` offsets of packed sequences in one row, or None.

    Each as for :func:`qrnn.qrnn_gates`.

    Returns:
        ``(output, c_n, states)``: ``states`` holds every ``c[t]`` for the backward (in
        ``gates``' dtype), and is an empty tensor without an output gate, where the output
        is ``c`` itself.

    Raises:
        TypeError, ValueError: a bad argument, named (:func:`check_qrnn_gates_args`); the op
            checks its arguments itself because it can be called directly.
        RuntimeError: on a device without a fused kernel (only the CPU and CUDA have one:
            :func:`qrnn.qrnn_gates` runs :func:`qrnn_gates_unfused` there instead).

    Differentiable in ``gates`` and ``c0`` (its backward is :func:`qrnn_gates_backward_op`).
    """
    _check_forward_op(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, cu_seqlens)
    raise _no_fused_kernel(gates)


@qrnn_gates_op.register_fake
def _(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, cu_seqlens=None):
    hidden = gates.shape[-1] // gate_count(output_gate)
    out_shape = tuple(gates.shape[:-1]) + (hidden,)
    batch = sequence_count(gates.shape[0] if batch_first else gates.shape[1], cu_seqlens)
    output = gates.new_empty(out_shape)
    states = gates.new_empty(out_shape) if output_gate else gates.new_empty(0)
    return output, gates.new_empty((batch, hidden), dtype=state_dtype(gates.dtype)), states


@define_op("qrnn_gates_backward")
def qrnn_gates_backward_op(grad_output: Optional[Tensor], grad_c_n: Optional[Tensor], gates: Tensor,
                           states: Tensor, c0: Optional[Tensor], forget_mask: Optional[Tensor],
                           lengths: Optional[Tensor], forget_scale: float, output_gate: bool, batch_first: bool,
                           reverse: bool, cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """The ``qrnn::qrnn_gates_backward`` operator: the gradients of :func:`qrnn_gates_op`.

    Args:
        grad_output: the gradient of the loss with respect to the output, or None (no
            gradient flows from it).
        grad_c_n: the gradient with respect to ``c_n``, or None.
        gates: the forward's ``gates``.
        states: the forward's ``states`` (with an output gate) or its output (without).
        c0: the forward's ``c0`` (or None).
        forget_mask: the forward's ``forget_mask`` (or None).
        lengths: the forward's ``lengths`` (or None).
        forget_scale: the forward's ``forget_scale``.
        output_gate: the forward's ``output_gate``.
        batch_first: the forward's layout.
        reverse: the forward's direction.
        cu_seqlens: the forward's ``cu_seqlens`` (or None).

    Returns:
        ``(grad_gates, grad_c0)``; ``grad_c0`` is an empty tensor when ``c0`` is None.

    Raises:
        TypeError, ValueError: a bad argument, named (:func:`check_qrnn_gates_backward_args`).
        RuntimeError: on a device without a fused kernel.
        NotImplementedError: when differentiated itself (no double backward).
    """
    _check_backward_op(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                       batch_first, reverse, cu_seqlens)
    raise _no_fused_kernel(gates)


@qrnn_gates_backward_op.register_fake
def _(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate, batch_first,
      reverse, cu_seqlens=None):
    grad_c0 = torch.empty_like(c0, memory_format=torch.contiguous_format) if c0 is not None else gates.new_empty(0)
    return torch.empty_like(gates, memory_format=torch.contiguous_format), grad_c0


def _gates_setup_context(ctx, inputs, output):
    gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, cu_seqlens = (
        tuple(inputs) + (None,) * (9 - len(inputs)))
    out, _, states = output
    ctx.save_for_backward(gates, states if output_gate else out, c0, forget_mask, lengths, cu_seqlens)
    ctx.options = (forget_scale, output_gate, batch_first, reverse)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros pass


def _gates_backward(ctx, grad_output, grad_c_n, _grad_states, backward=None):
    gates, states, c0, forget_mask, lengths, cu_seqlens = ctx.saved_tensors
    if grad_output is None and grad_c_n is None:
        return (None,) * 9
    grad_gates, grad_c0 = (backward or qrnn_gates_backward_op)(grad_output, grad_c_n, gates, states, c0, forget_mask,
                                                               lengths, *ctx.options, cu_seqlens)
    return grad_gates, (grad_c0 if c0 is not None else None), None, None, None, None, None, None, None


qrnn_gates_op.register_autograd(_gates_backward, setup_context=_gates_setup_context)
qrnn_gates_backward_op.register_autograd(refuse_double_backward("qrnn_gates"))


# ---- torch.func ---------------------------------------------------------------------------------
# custom_op's own autograd function has no setup_context, which torch.func requires; under
# its transforms qrnn.qrnn_gates calls the op through these. Forward mode takes the
# unfused form (PyTorch ops around qrnn.forget_mult, whose tangent rule runs the kernels).


_QrnnGatesBackward = first_derivative_only("qrnn_gates", qrnn_gates_backward_op)


class QrnnGatesFunction(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, cu_seqlens=None):
        return qrnn_gates_op(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                             cu_seqlens)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _gates_setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad_output, grad_c_n, _grad_states):
        return _gates_backward(ctx, grad_output, grad_c_n, _grad_states, _QrnnGatesBackward.apply)

    @staticmethod
    def jvp(ctx, *tangents):  # qrnn_gates sends forward mode to the unfused form, never here
        raise NotImplementedError(FORWARD_MODE_MESSAGE.format(op="qrnn_gates"))


def _gates_vmap(info, in_dims, gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                cu_seqlens=None):
    # The kernels take any batch: the vmapped dimension becomes part of it.
    refuse_vmap_of_sequences("qrnn_gates", None, cu_seqlens)
    size, batch = info.batch_size, (0 if batch_first else 1)
    g_dim, c0_dim, mask_dim, lengths_dim = in_dims[:4]
    output, c_n, states = qrnn_gates_op(
        fold_batch(gates, g_dim, size, batch), fold_batch(c0, c0_dim, size, 0),
        fold_batch(forget_mask, mask_dim, size, batch), fold_batch(lengths, lengths_dim, size, 0),
        forget_scale, output_gate, batch_first, reverse)
    if not output_gate:  # states is an empty placeholder
        return (unfold_batch(output, size, batch), unfold_batch(c_n, size, 0), states), (batch, 0, None)
    return ((unfold_batch(output, size, batch), unfold_batch(c_n, size, 0), unfold_batch(states, size, batch)),
            (batch, 0, batch))


def _gates_backward_vmap(info, in_dims, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                         forget_scale, output_gate, batch_first, reverse, cu_seqlens=None):
    refuse_vmap_of_sequences("qrnn_gates", None, cu_seqlens)
    size, batch = info.batch_size, (0 if batch_first else 1)
    dims = (batch, 0, batch, batch, 0, batch, 0)  # each tensor argument's batch dimension
    folded = [fold_batch(t, d, size, b) for t, d, b in zip(
        (grad_output, grad_c_n, gates, states, c0, forget_mask, lengths), in_dims, dims)]
    grad_gates, grad_c0 = qrnn_gates_backward_op(*folded, forget_scale, output_gate, batch_first, reverse)
    if c0 is None:
        return (unfold_batch(grad_gates, size, batch), grad_c0), (batch, None)
    return (unfold_batch(grad_gates, size, batch), unfold_batch(grad_c0, size, 0)), (batch, 0)


register_vmap(qrnn_gates_op, _gates_vmap)
register_vmap(qrnn_gates_backward_op, _gates_backward_vmap)


def _no_fused_forward(gates, *_):
    raise _no_fused_kernel(gates)


def _no_fused_backward(grad_output, grad_c_n, gates, *_):
    raise _no_fused_kernel(gates)


# A device listed here runs qrnn_gates fused; any other falls back to qrnn_gates_unfused (the
# ops raise there: qrnn.qrnn_gates never calls them without a fused kernel).
KERNELS = native_kernels(qrnn_gates_op, qrnn_gates_backward_op, _check_forward_op, _check_backward_op, kernels,
                         _no_fused_forward, _no_fused_backward)


def qrnn_gates_unfused(gates: Tensor, c0: Optional[Tensor] = None, *, output_gate: bool = True,
                       forget_mask: Optional[Tensor] = None, forget_scale: float = 1.0,
                       lengths: Optional[Tensor] = None, batch_first: bool = False,
                       reverse: bool = False, cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """:func:`qrnn_gates` composed of PyTorch activations and ``qrnn.forget_mult``: the
    path for devices without a fused kernel, and the fused kernel's reference in tests.

    Takes the same arguments (``gates``, ``c0``, ``output_gate``, ``forget_mask``,
    ``forget_scale``, ``lengths``, ``batch_first``, ``reverse``, ``cu_seqlens``) and returns
    the same ``(output, c_n)`` as :func:`qrnn_gates` (its 16-bit ``c_n`` passes through the
    16-bit sequence, so it may differ from the fused kernel's float32 state by a 16-bit
    rounding). Raises TypeError or ValueError naming a bad argument, as :func:`qrnn_gates`
    does.
    """
    hidden = check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first,
                                   cu_seqlens)
    z = torch.tanh(gates[..., :hidden])
    f = torch.sigmoid(gates[..., hidden:2 * hidden])
    if forget_mask is not None:
        f = f * forget_mask
    if forget_scale != 1.0:
        f = f * forget_scale
    c, c_n = forget_mult(f, z, c0, batch_first=batch_first, reverse=reverse, lengths=lengths, cu_seqlens=cu_seqlens,
                         output_final_state=True)
    output = torch.sigmoid(gates[..., 2 * hidden:]) * c if output_gate else c
    return output, c_n.to(state_dtype(gates.dtype))
