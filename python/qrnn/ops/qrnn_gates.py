"""The fused QRNN gate op family: ``qrnn::qrnn_gates`` and ``qrnn::qrnn_gates_backward``
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
from typing import Callable, Optional

import torch
from torch import Tensor

from ._dispatch import (
    FORWARD_MODE_MESSAGE,
    direct_call_allowed,
    first_derivative_only,
    fold_batch,
    forward_mode_active,
    refuse_double_backward,
    refuse_legacy_onnx,
    register_kernel,
    register_vmap,
    unfold_batch,
    use_autograd_function,
)
from .checks import check_qrnn_gates_args, check_qrnn_gates_backward_args, gate_count
from .cpu import qrnn_gates_backward as cpu_backward
from .cpu import qrnn_gates_forward as cpu_forward
from .cuda import AVAILABLE as CUDA_AVAILABLE
from .cuda import qrnn_gates_backward as cuda_backward
from .cuda import qrnn_gates_forward as cuda_forward
from .forget_mult import forget_mult
from .kernel_args import state_dtype
from .sharding import check_sharded_args

__all__ = ["qrnn_gates", "qrnn_gates_unfused", "qrnn_gates_op", "qrnn_gates_backward_op", "has_fused_qrnn_gates",
           "QRNN_GATES_FORWARD_KERNELS", "QRNN_GATES_BACKWARD_KERNELS"]

# Fused kernels per device type, for the eager direct path and has_fused_qrnn_gates (the
# ops' per-device registrations are made from the same functions by _set_native_kernels).
# A device listed here runs qrnn_gates fused; any other falls back to qrnn_gates_unfused.
QRNN_GATES_FORWARD_KERNELS: dict = {}
QRNN_GATES_BACKWARD_KERNELS: dict = {}


def has_fused_qrnn_gates(device) -> bool:
    """Whether ``device`` (a torch.device or its type name) has the fused gate kernels."""
    kind = getattr(device, "type", device)
    return kind in QRNN_GATES_FORWARD_KERNELS and kind in QRNN_GATES_BACKWARD_KERNELS


# The ops' argument checks in the ops' argument order (the op can be called directly, and
# the kernels take shapes on trust: a smaller c0 or mask would be read out of bounds).
def _check_forward_op(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse) -> None:
    check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)


def _check_backward_op(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                       batch_first, reverse) -> None:
    check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                   output_gate, batch_first)


def _no_fused_kernel(gates: Tensor) -> RuntimeError:
    return RuntimeError(f"qrnn has no fused gate kernel for {gates.device.type} tensors: call qrnn.qrnn_gates, "
                        "which runs the unfused form on such devices")


@torch.library.custom_op("qrnn::qrnn_gates", mutates_args=())
def qrnn_gates_op(gates: Tensor, c0: Optional[Tensor], forget_mask: Optional[Tensor], lengths: Optional[Tensor],
                  forget_scale: float, output_gate: bool, batch_first: bool, reverse: bool
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (output, c_n, states); states (every c[t], for the backward) is an empty
    tensor without an output gate, where the output is c itself. This body serves devices
    without a fused kernel (qrnn.qrnn_gates never calls it there)."""
    _check_forward_op(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse)
    raise _no_fused_kernel(gates)


@qrnn_gates_op.register_fake
def _(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse):
    hidden = gates.shape[-1] // gate_count(output_gate)
    out_shape = tuple(gates.shape[:-1]) + (hidden,)
    batch = gates.shape[0] if batch_first else gates.shape[1]
    output = gates.new_empty(out_shape)
    states = gates.new_empty(out_shape) if output_gate else gates.new_empty(0)
    return output, gates.new_empty((batch, hidden), dtype=state_dtype(gates.dtype)), states


@torch.library.custom_op("qrnn::qrnn_gates_backward", mutates_args=())
def qrnn_gates_backward_op(grad_output: Optional[Tensor], grad_c_n: Optional[Tensor], gates: Tensor,
                           states: Tensor, c0: Optional[Tensor], forget_mask: Optional[Tensor],
                           lengths: Optional[Tensor], forget_scale: float, output_gate: bool, batch_first: bool,
                           reverse: bool) -> tuple[Tensor, Tensor]:
    """Returns (grad_gates, grad_c0); grad_c0 is an empty tensor when c0 is None. This body
    serves devices without a fused kernel."""
    _check_backward_op(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                       batch_first, reverse)
    raise _no_fused_kernel(gates)


@qrnn_gates_backward_op.register_fake
def _(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate, batch_first,
      reverse):
    grad_c0 = torch.empty_like(c0, memory_format=torch.contiguous_format) if c0 is not None else gates.new_empty(0)
    return torch.empty_like(gates, memory_format=torch.contiguous_format), grad_c0


def _gates_setup_context(ctx, inputs, output):
    gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse = inputs
    out, _, states = output
    ctx.save_for_backward(gates, states if output_gate else out, c0, forget_mask, lengths)
    ctx.options = (forget_scale, output_gate, batch_first, reverse)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros pass


def _gates_backward(ctx, grad_output, grad_c_n, _grad_states):
    gates, states, c0, forget_mask, lengths = ctx.saved_tensors
    if grad_output is None and grad_c_n is None:
        return (None,) * 8
    grad_gates, grad_c0 = qrnn_gates_backward_op(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                                 *ctx.options)
    return grad_gates, (grad_c0 if c0 is not None else None), None, None, None, None, None, None


qrnn_gates_op.register_autograd(_gates_backward, setup_context=_gates_setup_context)
qrnn_gates_backward_op.register_autograd(refuse_double_backward("qrnn_gates"))


# ---- torch.func ---------------------------------------------------------------------------------
# custom_op's own autograd function has no setup_context, which torch.func requires; under
# its transforms qrnn.qrnn_gates calls the op through these. Forward mode takes the
# unfused form (PyTorch ops around qrnn.forget_mult, whose tangent rule runs the kernels).


_QrnnGatesBackward = first_derivative_only("qrnn_gates", qrnn_gates_backward_op)


class _QrnnGates(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse):
        return qrnn_gates_op(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _gates_setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad_output, grad_c_n, _grad_states):
        gates, states, c0, forget_mask, lengths = ctx.saved_tensors
        if grad_output is None and grad_c_n is None:
            return (None,) * 8
        grad_gates, grad_c0 = _QrnnGatesBackward.apply(grad_output, grad_c_n, gates, states, c0, forget_mask,
                                                       lengths, *ctx.options)
        return grad_gates, (grad_c0 if c0 is not None else None), None, None, None, None, None, None

    @staticmethod
    def jvp(ctx, *tangents):  # qrnn_gates sends forward mode to the unfused form, never here
        raise NotImplementedError(FORWARD_MODE_MESSAGE.format(op="qrnn_gates"))


def _gates_vmap(info, in_dims, gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse):
    # The kernels take any batch: the vmapped dimension becomes part of it.
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
                         forget_scale, output_gate, batch_first, reverse):
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


def _set_native_kernels(device: str, forward: Optional[Callable], backward: Optional[Callable]) -> tuple:
    """Make ``forward``/``backward`` the fused kernels of ``device`` tensors, for the eager
    path and the ops' registrations alike; None for both: no fused kernel (the ops raise,
    qrnn_gates runs unfused). Returns the previous pair (None, None where there was none)."""
    previous = (QRNN_GATES_FORWARD_KERNELS.pop(device, None), QRNN_GATES_BACKWARD_KERNELS.pop(device, None))
    if forward is not None and backward is not None:
        QRNN_GATES_FORWARD_KERNELS[device], QRNN_GATES_BACKWARD_KERNELS[device] = forward, backward
    register_kernel(qrnn_gates_op, device, _check_forward_op, forward or _no_fused_forward)
    register_kernel(qrnn_gates_backward_op, device, _check_backward_op, backward or _no_fused_backward)
    return previous


_set_native_kernels("cpu", cpu_forward, cpu_backward)
if CUDA_AVAILABLE:
    _set_native_kernels("cuda", cuda_forward, cuda_backward)


def qrnn_gates_unfused(gates: Tensor, c0: Optional[Tensor] = None, *, output_gate: bool = True,
                       forget_mask: Optional[Tensor] = None, forget_scale: float = 1.0,
                       lengths: Optional[Tensor] = None, batch_first: bool = False,
                       reverse: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`qrnn_gates` composed of PyTorch activations and ``qrnn.forget_mult``: the
    path for devices without a fused kernel, and the fused kernel's reference in tests.
    Same arguments and results (its 16-bit ``c_n`` passes through the 16-bit sequence)."""
    hidden = check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    time_dim = 1 if batch_first else 0
    T, B, H = gates.shape[time_dim], gates.shape[1 - time_dim], hidden
    z = torch.tanh(gates[..., :hidden])
    f = torch.sigmoid(gates[..., hidden:2 * hidden])
    if forget_mask is not None:
        f = f * forget_mask
    if forget_scale != 1.0:
        f = f * forget_scale
    c_dtype = state_dtype(gates.dtype)
    c0_state = c0 if c0 is not None else gates.new_zeros((B, H), dtype=c_dtype)
    if lengths is None:
        if reverse:
            f, z = f.flip(time_dim), z.flip(time_dim)
        c = forget_mult(f, z, c0, batch_first=batch_first)
        c_n = c.select(time_dim, T - 1).to(c_dtype) if T > 0 else c0_state.to(c_dtype)
        if reverse:
            c = c.flip(time_dim)
    else:
        steps = torch.arange(T, device=gates.device).unsqueeze(1)  # (T, 1)
        valid = steps < lengths.unsqueeze(0)                       # (T, B)
        # Time index each step reads: the sequence mirrored within its own length when
        # reversed (an involution, so the same gather maps the result back), padding kept.
        order = torch.where(valid, lengths.unsqueeze(0) - 1 - steps, steps) if reverse else None

        def to_tbh(index):  # (T, B) -> gather index in the tensors' layout
            index = index.t() if batch_first else index
            return index.unsqueeze(-1).expand(*index.shape, H)

        if reverse:
            f, z = f.gather(time_dim, to_tbh(order)), z.gather(time_dim, to_tbh(order))
        c = forget_mult(f, z, c0, batch_first=batch_first)
        if T > 0:
            last = (lengths - 1).clamp(min=0).unsqueeze(0)  # (1, B): each sequence's last step
            c_last = c.gather(time_dim, to_tbh(last)).squeeze(time_dim).to(c_dtype)
            c_n = torch.where((lengths > 0).unsqueeze(1), c_last, c0_state.to(c_dtype))
        else:
            c_n = c0_state.to(c_dtype)
        if reverse:
            c = c.gather(time_dim, to_tbh(order))
        keep = valid.t() if batch_first else valid
        c = torch.where(keep.unsqueeze(-1), c, c.new_zeros(()))
    output = torch.sigmoid(gates[..., 2 * hidden:]) * c if output_gate else c
    return output, c_n


def qrnn_gates(gates: Tensor, c0: Optional[Tensor] = None, *, output_gate: bool = True,
               forget_mask: Optional[Tensor] = None, forget_scale: float = 1.0,
               lengths: Optional[Tensor] = None, batch_first: bool = False,
               reverse: bool = False) -> tuple[Tensor, Tensor]:
    """The QRNN pointwise step, fused: from gate pre-activations to the layer output.

    ``z = tanh(G_z)``, ``f = sigmoid(G_f) * forget_mask * forget_scale``,
    ``c[t] = f * z + (1 - f) * c[t-1]`` (``c[-1] = c0``), ``output = sigmoid(G_o) * c``
    (or ``c`` without an output gate).

    Args:
        gates: pre-activations ``(seq_len, batch, 3 * hidden)`` (``(batch, seq_len, ...)``
            with ``batch_first``), blocks Z, F, O in that order (Z, F without an output
            gate); float32, float64, bfloat16 or float16; any strides, read in place.
        c0: initial state ``(batch, hidden)``, gates' dtype or float32 (16-bit gates).
        output_gate: whether gates has the O block.
        forget_mask: zoneout keep mask in the output's shape and gates' dtype (0/1,
            unscaled), or None.
        forget_scale: multiplies f; ``1 - p`` for zoneout at evaluation.
        lengths: int64 ``(batch,)`` valid steps per sequence on gates' device; outputs
            past each end are zero and ``c_n`` is each sequence's state after its last
            valid step.
        batch_first: layout of gates and the output.
        reverse: run each sequence from its own last valid step back to step 0.

    Returns:
        ``(output, c_n)``: output in gates' dtype with ``hidden`` features; ``c_n``
        ``(batch, hidden)`` in float32 for 16-bit gates, gates' dtype otherwise.
        Differentiable in gates and c0; fused on devices that have the kernel (the CPU,
        and CUDA in builds with it), :func:`qrnn_gates_unfused` elsewhere.
    """
    check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    if reverse is not True and reverse is not False:
        raise TypeError(f"qrnn_gates: reverse must be a bool, got {type(reverse).__name__}")
    if not has_fused_qrnn_gates(gates.device):
        return qrnn_gates_unfused(gates, c0, output_gate=output_gate, forget_mask=forget_mask,
                                  forget_scale=forget_scale, lengths=lengths, batch_first=batch_first,
                                  reverse=reverse)
    if direct_call_allowed(gates, c0, forget_mask, lengths):
        # Nothing to differentiate or trace: call the kernel directly (and skip saving c[t]).
        output, c_n, _ = QRNN_GATES_FORWARD_KERNELS[gates.device.type](
            gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, need_states=False)
        return output, c_n
    if type(gates) is not Tensor:  # a subclass, perhaps a DTensor
        check_sharded_args("qrnn_gates", batch_first, gates=gates, forget_mask=forget_mask)
    if use_autograd_function():
        if forward_mode_active():
            return qrnn_gates_unfused(gates, c0, output_gate=output_gate, forget_mask=forget_mask,
                                      forget_scale=forget_scale, lengths=lengths, batch_first=batch_first,
                                      reverse=reverse)
        output, c_n, _ = _QrnnGates.apply(gates, c0, forget_mask, lengths, float(forget_scale), output_gate,
                                          batch_first, reverse)
        return output, c_n
    refuse_legacy_onnx()
    output, c_n, _ = qrnn_gates_op(gates, c0, forget_mask, lengths, float(forget_scale), output_gate, batch_first,
                                   reverse)
    return output, c_n
