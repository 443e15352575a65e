"""linear_scan's kernels per backend: qrnn._C's CPU entry points, its CUDA launchers (in
builds with them) and the pure-PyTorch fallback, each writing fresh outputs.

``reverse`` never copies: whole rows are given to the kernels as views walked from the last
time step (a negative time stride, :func:`qrnn.ops.core.kernel_args.time_view3`), sequences
(``lengths``, ``cu_seqlens``) with the kernels' own ``reverse`` flag. The CUDA kernels walk
whole rows only: calls with sequences run there as dense rows whose sequence starts reset the
state (:mod:`qrnn.ops.core.sequences`)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ... import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub
from ..core import cuda as _cuda
from ..core.kernel_args import SEQUENCE_FIELDS, SEQUENCE_PROLOGUE, generate, probe, state_dtype
from ..core.outputs import empty_contiguous, or_empty
from ..core.sequences import check_offset_values, dense_scan_backward, dense_scan_forward, walk_of
from .reference import linear_scan_backward_reference, linear_scan_reference

__all__ = ["cpu_forward", "cpu_backward", "CUDA_AVAILABLE", "cuda_forward", "cuda_backward", "fallback_forward",
           "fallback_backward", "forward_args", "backward_args"]

# ---- Argument tuples, from the fields qrnn._C exports (cpp/include/qrnn/linear_scan.hpp) ----

_COMMON = {**SEQUENCE_FIELDS, "dtype": "DTYPE_CODES[a.dtype]", "seq_len": "shape[1] if batch_first else shape[0]",
           "hidden": "shape[2]", "a": "time_view3(a, batch_first, whole)", "h": "time_view3(h, batch_first, whole)",
           "h0": "view2(h0)", "h0_dtype": "DTYPE_CODES[a.dtype if h0 is None else h0.dtype]"}
_PROLOGUE = "shape = a.shape\n" + SEQUENCE_PROLOGUE
_t = probe(2, 3, 4)
forward_args: Callable[..., tuple] = generate(
    "linear_scan_forward", "h, a, b, h0, reverse, batch_first, lengths=None, cu_seqlens=None", _PROLOGUE,
    {**_COMMON, "b": "time_view3(b, batch_first, whole)"},
    [(_t, _t, _t, None, False, False, None, None), (_t, _t, _t, probe(2, 4), True, True, None, None)])
backward_args: Callable[..., tuple] = generate(
    "linear_scan_backward",
    "grad_a, grad_b, grad_h0, grad_h, a, h, h0, reverse, batch_first, lengths=None, cu_seqlens=None",
    _PROLOGUE,
    {**_COMMON, "grad_h": "time_view3(grad_h, batch_first, whole)",
     "grad_a": "time_view3(grad_a, batch_first, whole)", "grad_b": "time_view3(grad_b, batch_first, whole)",
     "grad_h0": "view2(grad_h0)"},
    [(_t, _t, None, _t, _t, _t, None, True, False, None, None)])
del _t


def _grads(a, h0):
    return empty_contiguous(a), empty_contiguous(a), (empty_contiguous(h0) if h0 is not None else None)


# ---- CPU ------------------------------------------------------------------------------------


def cpu_forward(a, b, h0, reverse, batch_first, lengths=None, cu_seqlens=None):
    h = empty_contiguous(a)
    _C.linear_scan_forward(*forward_args(h, a, b, h0, reverse, batch_first, lengths, cu_seqlens),
                           torch.get_num_threads())
    return h


def cpu_backward(grad_h, a, h, h0, reverse, batch_first, lengths=None, cu_seqlens=None):
    grad_a, grad_b, grad_h0 = _grads(a, h0)
    _C.linear_scan_backward(*backward_args(grad_a, grad_b, grad_h0, grad_h, a, h, h0, reverse, batch_first, lengths,
                                           cu_seqlens), torch.get_num_threads())
    return grad_a, grad_b, or_empty(grad_h0, a)


# ---- CUDA (builds with the CUDA kernels): whole rows; sequences run as dense rows --------------

CUDA_AVAILABLE: bool = hasattr(_C, "cuda_linear_scan_forward")


def _cuda_dense_forward(a, b, h0, reverse, batch_first):
    h = empty_contiguous(a)
    _cuda.launch_by_name("cuda_linear_scan_forward", a.device,
                         forward_args(h, a, b, h0, reverse, batch_first, None, None))
    return h


def _cuda_dense_backward(grad_h, a, h, h0, reverse, batch_first):
    grad_a, grad_b, grad_h0 = _grads(a, h0)
    _cuda.launch_by_name("cuda_linear_scan_backward", a.device,
                         backward_args(grad_a, grad_b, grad_h0, grad_h, a, h, h0, reverse, batch_first, None, None))
    return grad_a, grad_b, or_empty(grad_h0, a)


def _rows_or_sequences(dense_forward, dense_backward) -> tuple:
    """(forward, backward) of a device whose kernels walk whole rows: calls with sequences run
    through them as dense rows (:func:`with_sequences_forward`)."""
    def forward(a, b, h0, reverse, batch_first, lengths=None, cu_seqlens=None):
        if lengths is None and cu_seqlens is None:
            return dense_forward(a, b, h0, reverse, batch_first)
        return with_sequences_forward(dense_forward, a, b, h0, reverse, batch_first, lengths, cu_seqlens)

    def backward(grad_h, a, h, h0, reverse, batch_first, lengths=None, cu_seqlens=None):
        if lengths is None and cu_seqlens is None:
            return dense_backward(grad_h, a, h, h0, reverse, batch_first)
        return with_sequences_backward(dense_backward, grad_h, a, h, h0, reverse, batch_first, lengths, cu_seqlens)

    return forward, backward


cuda_forward: Callable[..., Tensor]
cuda_backward: Callable[..., tuple]
cuda_forward, cuda_backward = _rows_or_sequences(_cuda_dense_forward, _cuda_dense_backward)


# ---- Devices without native kernels: the reference loop with the kernels' state dtype -------------


def _fallback_dense_forward(a, b, h0, reverse, batch_first):
    math = state_dtype(a.dtype)
    h = linear_scan_reference(a.to(math), b.to(math), None if h0 is None else h0.to(math), reverse=reverse,
                              batch_first=batch_first)
    return h.to(a.dtype).contiguous()


def _fallback_dense_backward(grad_h, a, h, h0, reverse, batch_first):
    math = state_dtype(a.dtype)
    grad_a, grad_b, grad_h0 = linear_scan_backward_reference(
        grad_h.to(math), a.to(math), h.to(math), None if h0 is None else h0.to(math), reverse=reverse,
        batch_first=batch_first)
    return (grad_a.to(a.dtype).contiguous(), grad_b.to(a.dtype).contiguous(),
            grad_h0.to(h0.dtype) if h0 is not None else a.new_empty(0))


fallback_forward: Callable[..., Tensor]
fallback_backward: Callable[..., tuple]
fallback_forward, fallback_backward = _rows_or_sequences(_fallback_dense_forward, _fallback_dense_backward)


# ---- Sequences on kernels that walk whole rows (qrnn.ops.core.sequences) --------------------------


def with_sequences_forward(dense, a, b, h0, reverse, batch_first, lengths, cu_seqlens):
    """linear_scan with lengths or cu_seqlens through ``dense(a, b, h0, reverse, batch_first)``,
    a kernel of whole rows: the sequences' starts reset the state."""
    am, bm = (a.transpose(0, 1), b.transpose(0, 1)) if batch_first else (a, b)
    check_offset_values("linear_scan", am.shape[0], lengths, cu_seqlens)
    walk = walk_of(am.shape[0], am.shape[1], lengths, cu_seqlens, reverse, a.device)
    h = dense_scan_forward(lambda x, y, r: dense(x, y, None, r, False), am, bm, h0, walk, reverse)
    return (h.transpose(0, 1) if batch_first else h).contiguous()


def with_sequences_backward(dense_backward, grad_h, a, h, h0, reverse, batch_first, lengths, cu_seqlens):
    """The gradients of :func:`with_sequences_forward` through the dense backward kernel."""
    tm = (lambda t: t.transpose(0, 1)) if batch_first else (lambda t: t)
    am = tm(a)
    walk = walk_of(am.shape[0], am.shape[1], lengths, cu_seqlens, reverse, a.device)
    states = am.shape[1] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    grad_a, grad_b, grad_h0 = dense_scan_backward(
        lambda g, x, y, r: dense_backward(g, x, y, None, r, False)[:2], tm(grad_h), am, tm(h), h0, walk, reverse,
        states)
    return (tm(grad_a).contiguous(), tm(grad_b).contiguous(),
            grad_h0 if grad_h0 is not None else a.new_empty(0))
