"""Argument checks every op family builds on. Each raises TypeError/ValueError naming the bad
argument: the kernels read memory through addresses and strides and take shapes on trust."""

from __future__ import annotations

import torch
from torch import Tensor

from .dispatch import refuse_fx_proxy
from .kernel_args import DTYPE_CODES as _DTYPE_CODES
from .kernel_args import accepts_state_dtype, allowed_state_dtypes
from .sequences import check_sequences

__all__ = ["check_dense", "check_scan_args", "check_like"]

_STRIDED = torch.strided


def check_dense(name: str, t: Tensor, op: str = "forget_mult") -> None:
    # Kernels read memory through data_ptr and strides: sparse and nested tensors have neither.
    if t.layout is not _STRIDED or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout)
        raise TypeError(f"{op}: {name} must be a dense (strided) tensor, got a {kind} tensor")


def check_scan_args(op: str, names: tuple, first, second, h0, batch_first, lengths=None, cu_seqlens=None) -> None:
    """The checks of a scan family's forward arguments (ForgetMult's f and x, linear_scan's a
    and b): two same-shaped 3-D sequences, optional lengths or cu_seqlens
    (:mod:`.sequences`) and an optional (batch, hidden) initial state, one row per sequence.
    Raise TypeError/ValueError naming the bad argument. Written for the common all-good case
    to touch each tensor attribute once."""
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
    rows = shape[0] if batch_first else shape[1]
    if lengths is not None or cu_seqlens is not None:
        rows = check_sequences(op, rows, first.device, lengths, cu_seqlens)
    if h0 is None:
        return
    if not isinstance(h0, Tensor):
        raise TypeError(f"{op}: h0 must be a torch.Tensor or None, got {type(h0).__name__}")
    check_dense("h0", h0, op)
    expected = (rows, shape[2])
    if h0.shape != expected:
        what = "(sequences, hidden)" if cu_seqlens is not None else "(batch, hidden)"
        raise ValueError(f"{op}: h0 must have shape {what} = {expected}, got {tuple(h0.shape)}")
    if not accepts_state_dtype(dtype, h0.dtype):
        raise TypeError(f"{op}: h0 must have dtype {allowed_state_dtypes(dtype)}, got {h0.dtype}")
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
