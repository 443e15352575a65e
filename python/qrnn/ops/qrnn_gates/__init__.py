"""The fused QRNN gates (activations + ForgetMult + output gate in one kernel): the second op family.

- :mod:`.op`: the ``qrnn::qrnn_gates`` / ``qrnn::qrnn_gates_backward`` custom ops (schemas from
  the C++ manifest), their fake, autograd and vmap rules, the fused kernels registered per
  device type, and :func:`qrnn_gates_unfused` (the path of devices without them);
- :mod:`.kernels`: the CPU and CUDA backends and their argument tuples;
- :mod:`.checks`: its argument checks; :mod:`.sharding`: its DTensor rules; :mod:`.onnx`: its
  ONNX translation (loaded by :mod:`qrnn.onnx`);
- :mod:`.reference`: the plain PyTorch loop the tests use.
"""

# No `from __future__ import annotations`: the op modules' annotations are read as objects.
from typing import Optional

from torch import Tensor

from ..core.dispatch import direct_call_allowed, forward_mode_active, refuse_legacy_onnx, use_autograd_function
from ..core.sequences import as_offsets
from ..core.sharding import check_sharded_args
from . import sharding  # noqa: F401  (adds the family's DTensor rules)
from .checks import check_qrnn_gates_args, check_qrnn_gates_backward_args
from .op import KERNELS, QrnnGatesFunction, qrnn_gates_backward_op, qrnn_gates_op, qrnn_gates_unfused

__all__ = ["qrnn_gates", "qrnn_gates_unfused", "qrnn_gates_op", "qrnn_gates_backward_op", "has_fused_qrnn_gates",
           "KERNELS", "check_qrnn_gates_args", "check_qrnn_gates_backward_args"]


def has_fused_qrnn_gates(device) -> bool:
    """Whether ``device`` has the fused gate kernels of :func:`qrnn_gates`.

    Args:
        device (torch.device | str): a device or its type name; the index does not matter.

    Returns:
        True for the CPU, and for CUDA in builds with the CUDA kernels; elsewhere
        :func:`qrnn_gates` runs :func:`qrnn_gates_unfused`.
    """
    return KERNELS.has(device)


def qrnn_gates(gates: Tensor, c0: Optional[Tensor] = None, *, output_gate: bool = True,
               forget_mask: Optional[Tensor] = None, forget_scale: float = 1.0,
               lengths: Optional[Tensor] = None, batch_first: bool = False,
               reverse: bool = False, cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
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
        lengths: int32/int64 ``(batch,)`` valid steps per sequence on gates' device, each in
            ``0..seq_len`` (the CPU kernel raises ValueError for others; the CUDA kernel
            clamps them rather than read them back); outputs past each end are zero and
            ``c_n`` is each sequence's state after its last valid step.
        batch_first: layout of gates and the output.
        reverse: run each sequence from its own last valid step back to step 0.
        cu_seqlens: int32/int64 ``(N + 1,)`` offsets on gates' device, from 0 to the packed
            length: ``N`` sequences packed end to end in one row (batch 1), as
            flash-linear-attention lays them out; ``c0`` and ``c_n`` are then ``(N, hidden)``.

    Returns:
        ``(output, c_n)``: output in gates' dtype with ``hidden`` features; ``c_n``
        ``(batch, hidden)`` (``(N, hidden)`` packed) in float32 for 16-bit gates, gates' dtype
        otherwise.
        Differentiable in gates and c0; fused on devices that have the kernel (the CPU,
        and CUDA in builds with it), :func:`qrnn_gates_unfused` elsewhere.

    Raises:
        TypeError: an argument of the wrong type or dtype (the message names it).
        ValueError: a wrong shape, device or layout (the message names the argument), or a
            DTensor sharded along time.
        RuntimeError: under the TorchScript ONNX exporter (``dynamo=False``) or
            ``torch.fx.symbolic_trace``, which cannot capture the op.
    """
    if lengths is not None or cu_seqlens is not None:
        lengths = as_offsets("lengths", "qrnn_gates", lengths)
        cu_seqlens = as_offsets("cu_seqlens", "qrnn_gates", cu_seqlens)
    check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first, cu_seqlens)
    if reverse is not True and reverse is not False:
        raise TypeError(f"qrnn_gates: reverse must be a bool, got {type(reverse).__name__}")
    if not KERNELS.has(gates.device):
        return qrnn_gates_unfused(gates, c0, output_gate=output_gate, forget_mask=forget_mask,
                                  forget_scale=forget_scale, lengths=lengths, batch_first=batch_first,
                                  reverse=reverse, cu_seqlens=cu_seqlens)
    if direct_call_allowed(gates, c0, forget_mask, lengths if lengths is not None else cu_seqlens):
        # Nothing to differentiate or trace: call the kernel directly (and skip saving c[t]).
        output, c_n, _ = KERNELS.forward[gates.device.type](
            gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, cu_seqlens,
            need_states=False)
        return output, c_n
    if type(gates) is not Tensor:  # a subclass, perhaps a DTensor
        check_sharded_args("qrnn_gates", batch_first, gates=gates, forget_mask=forget_mask)
    if use_autograd_function():
        if forward_mode_active():
            return qrnn_gates_unfused(gates, c0, output_gate=output_gate, forget_mask=forget_mask,
                                      forget_scale=forget_scale, lengths=lengths, batch_first=batch_first,
                                      reverse=reverse, cu_seqlens=cu_seqlens)
        output, c_n, _ = QrnnGatesFunction.apply(gates, c0, forget_mask, lengths, float(forget_scale), output_gate,
                                                 batch_first, reverse, cu_seqlens)
        return output, c_n
    refuse_legacy_onnx()
    output, c_n, _ = qrnn_gates_op(gates, c0, forget_mask, lengths, float(forget_scale), output_gate, batch_first,
                                   reverse, cu_seqlens)
    return output, c_n
