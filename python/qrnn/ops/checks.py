"""Argument checks of both op families, shared by the ops, their eager paths and the CUDA
backend's launches into given outputs. Each raises TypeError/ValueError naming the bad
argument: the kernels read memory through addresses and strides and take shapes on trust."""

from __future__ import annotations

import torch
from torch import Tensor

from ._dispatch import refuse_fx_proxy
from .kernel_args import DTYPE_CODES as _DTYPE_CODES
from .kernel_args import HALF_DTYPES as _HALF_DTYPES

__all__ = ["check_dense", "check_scan_args", "check_like", "check_forget_mult_args", "check_forget_mult_backward_args",
           "gate_count",
           "check_qrnn_gates_args", "check_qrnn_gates_backward_args"]

_STRIDED = torch.strided


def check_dense(name: str, t: Tensor, op: str = "forget_mult") -> None:
    # Kernels read memory through data_ptr and strides: sparse and nested tensors have neither.
    if t.layout is not _STRIDED or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout)
        raise TypeError(f"{op}: {name} must be a dense (strided) tensor, got a {kind} tensor")


def check_scan_args(op: str, names: tuple, first, second, h0, batch_first) -> None:
    """The checks of a scan family's forward arguments (ForgetMult's f and x, linear_scan's a
    and b): two same-shaped 3-D sequences and an optional (batch, hidden) initial state. Raise
    TypeError/ValueError naming the bad argument. Written for the common all-good case to
    touch each tensor attribute once."""
    one, two = names
    if not isinstance(first, Tensor):
        refuse_fx_proxy(f"qrnn.{op}", first)
        raise TypeError(f"{op}: {one} must be a torch.Tensor, got {type(first).__name__}")
    if not isinstance(second, Tensor):
        raise TypeError(f"{op}: {two} must be a torch.Tensor, got {type(second).__name__}")
    if first.layout is not _STRIDED or second.layout is not _STRIDED or first.is_nested or second.is_nested:
        check_dense(one, first, op)  # raises, naming the argument
        check_dense(two, second, op)
    if batch_first is not True and batch_first is not False:
        raise TypeError(f"{op}: batch_first must be a bool, got {type(batch_first).__name__}")
    dtype, shape = first.dtype, first.shape
    if dtype not in _DTYPE_CODES:
        raise TypeError(f"{op}: {one} must be float32, float64, bfloat16 or float16, got {dtype}")
    if second.dtype is not dtype:
        raise TypeError(f"{op}: {two} must have {one}'s dtype {dtype}, got {second.dtype}")
    if len(shape) != 3:
        layout = "(batch, seq_len, hidden)" if batch_first else "(seq_len, batch, hidden)"
        raise ValueError(f"{op}: {one} must be 3-D {layout}, got shape {tuple(shape)}")
    if second.shape != shape:
        raise ValueError(f"{op}: {two} must have {one}'s shape {tuple(shape)}, got {tuple(second.shape)}")
    both_cpu = first.is_cpu and second.is_cpu  # cheap attribute: skips building device objects
    if not both_cpu and second.device != first.device:
        raise ValueError(f"{op}: {two} must be on {one}'s device {first.device}, got {second.device}")
    if h0 is None:
        return
    if not isinstance(h0, Tensor):
        raise TypeError(f"{op}: h0 must be a torch.Tensor or None, got {type(h0).__name__}")
    check_dense("h0", h0, op)
    expected = (shape[0], shape[2]) if batch_first else (shape[1], shape[2])
    if h0.shape != expected:
        raise ValueError(f"{op}: h0 must have shape (batch, hidden) = {expected}, got {tuple(h0.shape)}")
    if h0.dtype is not dtype and not (dtype in _HALF_DTYPES and h0.dtype is torch.float32):
        allowed = f"{dtype} or torch.float32" if dtype in _HALF_DTYPES else f"{dtype}"
        raise TypeError(f"{op}: h0 must have dtype {allowed}, got {h0.dtype}")
    if not (both_cpu and h0.is_cpu) and h0.device != first.device:
        raise ValueError(f"{op}: h0 must be on {one}'s device {first.device}, got {h0.device}")


def check_like(op: str, like_name: str, like: Tensor, **tensors: Tensor) -> None:
    """Each of ``tensors`` (a backward's gradients and saved outputs) has ``like``'s shape,
    dtype and device."""
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(name, t, op)
        if t.dtype != like.dtype:
            raise TypeError(f"{op}: {name} must have {like_name}'s dtype {like.dtype}, got {t.dtype}")
        if t.shape != like.shape:
            raise ValueError(f"{op}: {name} must have {like_name}'s shape {tuple(like.shape)}, got {tuple(t.shape)}")
        if t.device != like.device:
            raise ValueError(f"{op}: {name} must be on {like_name}'s device {like.device}, got {t.device}")


_FORGET_MULT_NAMES = ("f", "x")


def check_forget_mult_args(f, x, h0, batch_first) -> None:
    """Raise TypeError/ValueError naming the bad argument; shared by every entry point."""
    check_scan_args("forget_mult", _FORGET_MULT_NAMES, f, x, h0, batch_first)


def check_forget_mult_backward_args(grad_h, f, x, h, h0, batch_first) -> None:
    """The forward checks plus grad_h and h: same shape, dtype and device as f."""
    check_scan_args("forget_mult", _FORGET_MULT_NAMES, f, x, h0, batch_first)
    check_like("forget_mult_backward", "f", f, grad_h=grad_h, h=h)


def gate_count(output_gate: bool) -> int:
    return 3 if output_gate else 2


def check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first) -> int:
    """Raise TypeError/ValueError naming the bad argument; returns the hidden size."""
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
    if c0 is not None:
        if not isinstance(c0, Tensor):
            raise TypeError(f"qrnn_gates: c0 must be a torch.Tensor or None, got {type(c0).__name__}")
        check_dense("c0", c0, "qrnn_gates")
        if tuple(c0.shape) != (batch, hidden):
            raise ValueError(f"qrnn_gates: c0 must have shape (batch, hidden) = {(batch, hidden)}, "
                             f"got {tuple(c0.shape)}")
        if c0.dtype != gates.dtype and not (gates.dtype in _HALF_DTYPES and c0.dtype == torch.float32):
            allowed = f"{gates.dtype} or torch.float32" if gates.dtype in _HALF_DTYPES else f"{gates.dtype}"
            raise TypeError(f"qrnn_gates: c0 must have dtype {allowed}, got {c0.dtype}")
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
    if lengths is not None:
        if not isinstance(lengths, Tensor) or lengths.dtype != torch.int64 or lengths.shape != (batch,):
            raise ValueError(f"qrnn_gates: lengths must be an int64 tensor of shape (batch,) = ({batch},), got "
                             + (f"{lengths.dtype} {tuple(lengths.shape)}" if isinstance(lengths, Tensor)
                                else type(lengths).__name__))
        check_dense("lengths", lengths, "qrnn_gates")
        if lengths.device != gates.device:
            raise ValueError(f"qrnn_gates: lengths must be on gates' device {gates.device}, got {lengths.device}")
    return hidden


def check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                   output_gate, batch_first) -> None:
    """The forward checks plus the gradients and saved states the backward reads."""
    hidden = check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    out_shape = tuple(gates.shape[:-1]) + (hidden,)
    batch = gates.shape[0] if batch_first else gates.shape[1]
    state_dtypes = (gates.dtype, torch.float32) if gates.dtype in _HALF_DTYPES else (gates.dtype,)
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
