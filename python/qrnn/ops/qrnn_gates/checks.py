"""The fused gates' argument checks, shared by their ops, their eager path and their CUDA
launches into given outputs."""

from __future__ import annotations

from torch import Tensor

from ..core.checks import check_dense
from ..core.dispatch import refuse_fx_proxy
from ..core.kernel_args import DTYPE_CODES as _DTYPE_CODES
from ..core.kernel_args import accepts_state_dtype, allowed_state_dtypes, state_dtype
from ..core.sequences import check_sequences, sequence_count

__all__ = ["gate_count", "check_qrnn_gates_args", "check_qrnn_gates_backward_args"]


def gate_count(output_gate: bool) -> int:
    return 3 if output_gate else 2


def check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first,
                          cu_seqlens=None) -> int:
    """Check the arguments of :func:`qrnn.qrnn_gates` (shared by the function, the ops and
    the CUDA launches).

    Args:
        gates (torch.Tensor): a strided 3-D tensor (float32, float64, bfloat16 or float16)
            whose last size is a multiple of 3 (2 without ``output_gate``).
        c0 (torch.Tensor | None): None, or ``(batch, hidden)`` on gates' device, in gates'
            dtype (or float32 for 16-bit gates).
        forget_mask (torch.Tensor | None): None, or a tensor of the output's shape, gates'
            dtype and device.
        forget_scale (float): a number in [0, 1].
        lengths (torch.Tensor | None): None, or an int64 ``(batch,)`` tensor on gates'
            device (its values are not read here).
        cu_seqlens (torch.Tensor | None): None, or int64 ``(sequences + 1,)`` offsets of packed
            sequences in one row (batch 1) on gates' device; ``c0`` then has a row per sequence.
        output_gate (bool): whether gates holds the O block.
        batch_first (bool): which of gates' first two dimensions is batch.

    Returns:
        The hidden size (gates' last size divided by the number of gate blocks).

    Raises:
        TypeError: a wrong type or dtype; ValueError: a wrong shape, device, layout or
            ``forget_scale``. The message names the argument.
    """
    if not isinstance(gates, Tensor):
        refuse_fx_proxy("qrnn.qrnn_gates", gates)
        raise TypeError(f"qrnn_gates: gates must be a torch.Tensor, got {type(gates).__name__}")
    check_dense("gates", gates, "qrnn_gates")
    for name, flag in (("output_gate", output_gate), ("batch_first", batch_first)):
        if flag is not True and flag is not False:
            raise TypeError(f"qrnn_gates: {name} must be a bool, got {type(flag).__name__}")
    if gates.dtype not in _DTYPE_CODES:
        raise TypeError(f"qrnn_gates: gates must be float32, float64, bfloat16 or float16, got {gates.dtype}")
    layout = "(batch, seq_len, gates * hidden)" if batch_first else "(seq_len, batch, gates * hidden)"
    n_gates = gate_count(output_gate)
    if gates.dim() != 3 or gates.shape[-1] % n_gates != 0:
        raise ValueError(
            f"qrnn_gates: gates must be 3-D {layout} with the last size a multiple of {n_gates} "
            f"({'Z, F, O' if output_gate else 'Z, F'} blocks), got shape {tuple(gates.shape)}"
        )
    hidden = gates.shape[-1] // n_gates
    batch = gates.shape[0] if batch_first else gates.shape[1]
    out_shape = tuple(gates.shape[:-1]) + (hidden,)
    if lengths is not None or cu_seqlens is not None:
        batch = check_sequences("qrnn_gates", batch, gates.device, lengths, cu_seqlens)
    if c0 is not None:
        if not isinstance(c0, Tensor):
            raise TypeError(f"qrnn_gates: c0 must be a torch.Tensor or None, got {type(c0).__name__}")
        check_dense("c0", c0, "qrnn_gates")
        if tuple(c0.shape) != (batch, hidden):
            what = "(sequences, hidden)" if cu_seqlens is not None else "(batch, hidden)"
            raise ValueError(f"qrnn_gates: c0 must have shape {what} = {(batch, hidden)}, got {tuple(c0.shape)}")
        if not accepts_state_dtype(gates.dtype, c0.dtype):
            raise TypeError(f"qrnn_gates: c0 must have dtype {allowed_state_dtypes(gates.dtype)}, got {c0.dtype}")
        if c0.device != gates.device:
            raise ValueError(f"qrnn_gates: c0 must be on gates' device {gates.device}, got {c0.device}")
    if forget_mask is not None:
        if not isinstance(forget_mask, Tensor):
            raise TypeError(f"qrnn_gates: forget_mask must be a torch.Tensor or None, got {type(forget_mask).__name__}")
        check_dense("forget_mask", forget_mask, "qrnn_gates")
        if tuple(forget_mask.shape) != out_shape:
            raise ValueError(f"qrnn_gates: forget_mask must have the output's shape {out_shape}, "
                             f"got {tuple(forget_mask.shape)}")
        if forget_mask.dtype != gates.dtype:
            raise TypeError(f"qrnn_gates: forget_mask must have gates' dtype {gates.dtype}, got {forget_mask.dtype}")
        if forget_mask.device != gates.device:
            raise ValueError(f"qrnn_gates: forget_mask must be on gates' device {gates.device}, "
                             f"got {forget_mask.device}")
    if not isinstance(forget_scale, (int, float)) or not 0.0 <= forget_scale <= 1.0:
        raise ValueError(f"qrnn_gates: forget_scale must be a number in [0, 1], got {forget_scale!r}")
    return hidden


def check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                   output_gate, batch_first, cu_seqlens=None) -> None:
    """Check the arguments of :func:`qrnn.ops.qrnn_gates_backward_op`: ``gates``, ``c0``,
    ``forget_mask``, ``lengths``, ``forget_scale``, ``output_gate``, ``batch_first`` and
    ``cu_seqlens`` as
    :func:`check_qrnn_gates_args` does, and ``grad_output`` and ``states`` (the output's
    shape, gates' dtype and device; ``grad_output`` may be None) and ``grad_c_n`` (None or
    ``(batch, hidden)``, a row per sequence, in the state's dtype).

    Returns:
        None when every argument is acceptable.

    Raises:
        TypeError, ValueError: as :func:`check_qrnn_gates_args`, naming the argument.
    """
    hidden = check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first,
                                   cu_seqlens)
    out_shape = tuple(gates.shape[:-1]) + (hidden,)
    batch = sequence_count(gates.shape[0] if batch_first else gates.shape[1], cu_seqlens)
    state_dtypes = tuple(dict.fromkeys((gates.dtype, state_dtype(gates.dtype))))
    for name, t, shape, dtypes in (("grad_output", grad_output, out_shape, (gates.dtype,)),
                                   ("states", states, out_shape, (gates.dtype,)),
                                   ("grad_c_n", grad_c_n, (batch, hidden), state_dtypes)):
        if t is None and name != "states":
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"qrnn_gates_backward: {name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(name, t, "qrnn_gates_backward")
        if tuple(t.shape) != shape:
            raise ValueError(f"qrnn_gates_backward: {name} must have shape {shape}, got {tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise TypeError(f"qrnn_gates_backward: {name} must have dtype {' or '.join(map(str, dtypes))}, "
                            f"got {t.dtype}")
        if t.device != gates.device:
            raise ValueError(f"qrnn_gates_backward: {name} must be on gates' device {gates.device}, got {t.device}")
