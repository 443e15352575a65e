"""linear_scan's kernels per backend: qrnn._C's CPU entry points, its CUDA launchers (in
builds with them) and the pure-PyTorch fallback, each writing fresh outputs.

``reverse`` never copies: the kernels are given views walked from the last time step (a
negative time stride, :func:`qrnn.ops.core.kernel_args.time_view3`)."""

from __future__ import annotations

from typing import Callable

import torch

from ... import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub
from ..core import cuda as _cuda
from ..core.kernel_args import generate, probe, state_dtype
from ..core.outputs import empty_contiguous, or_empty
from .reference import linear_scan_backward_reference, linear_scan_reference

__all__ = ["cpu_forward", "cpu_backward", "CUDA_AVAILABLE", "cuda_forward", "cuda_backward", "fallback_forward",
           "fallback_backward", "forward_args", "backward_args"]

# ---- Argument tuples, from the fields qrnn._C exports (cpp/include/qrnn/linear_scan.hpp) ----

_COMMON = {"dtype": "DTYPE_CODES[a.dtype]", "batch": "shape[0] if batch_first else shape[1]",
           "seq_len": "shape[1] if batch_first else shape[0]", "hidden": "shape[2]",
           "a": "time_view3(a, batch_first, reverse)", "h": "time_view3(h, batch_first, reverse)",
           "h0": "view2(h0)", "h0_dtype": "DTYPE_CODES[a.dtype if h0 is None else h0.dtype]"}
_PROLOGUE = "shape = a.shape"
_t = probe(2, 3, 4)
forward_args: Callable[..., tuple] = generate(
    "linear_scan_forward", "h, a, b, h0, reverse, batch_first", _PROLOGUE,
    {**_COMMON, "b": "time_view3(b, batch_first, reverse)"},
    [(_t, _t, _t, None, False, False), (_t, _t, _t, probe(2, 4), True, True)])
backward_args: Callable[..., tuple] = generate(
    "linear_scan_backward", "grad_a, grad_b, grad_h0, grad_h, a, h, h0, reverse, batch_first", _PROLOGUE,
    {**_COMMON, "grad_h": "time_view3(grad_h, batch_first, reverse)",
     "grad_a": "time_view3(grad_a, batch_first, reverse)", "grad_b": "time_view3(grad_b, batch_first, reverse)",
     "grad_h0": "view2(grad_h0)"},
    [(_t, _t, None, _t, _t, _t, None, True, False)])
del _t


def _grads(a, h0):
    return empty_contiguous(a), empty_contiguous(a), (empty_contiguous(h0) if h0 is not None else None)


# ---- CPU ------------------------------------------------------------------------------------


def cpu_forward(a, b, h0, reverse, batch_first):
    h = empty_contiguous(a)
    _C.linear_scan_forward(*forward_args(h, a, b, h0, reverse, batch_first), torch.get_num_threads())
    return h


def cpu_backward(grad_h, a, h, h0, reverse, batch_first):
    grad_a, grad_b, grad_h0 = _grads(a, h0)
    _C.linear_scan_backward(*backward_args(grad_a, grad_b, grad_h0, grad_h, a, h, h0, reverse, batch_first),
                            torch.get_num_threads())
    return grad_a, grad_b, or_empty(grad_h0, a)


# ---- CUDA (builds with the CUDA kernels) ------------------------------------------------------

CUDA_AVAILABLE: bool = hasattr(_C, "cuda_linear_scan_forward")


def cuda_forward(a, b, h0, reverse, batch_first):
    h = empty_contiguous(a)
    _cuda.launch_by_name("cuda_linear_scan_forward", a.device, forward_args(h, a, b, h0, reverse, batch_first))
    return h


def cuda_backward(grad_h, a, h, h0, reverse, batch_first):
    grad_a, grad_b, grad_h0 = _grads(a, h0)
    _cuda.launch_by_name("cuda_linear_scan_backward", a.device,
                         backward_args(grad_a, grad_b, grad_h0, grad_h, a, h, h0, reverse, batch_first))
    return grad_a, grad_b, or_empty(grad_h0, a)


# ---- Devices without native kernels: the reference loop with the kernels' state dtype -------------


def fallback_forward(a, b, h0, reverse, batch_first):
    math = state_dtype(a.dtype)
    h = linear_scan_reference(a.to(math), b.to(math), None if h0 is None else h0.to(math), reverse=reverse,
                              batch_first=batch_first)
    return h.to(a.dtype).contiguous()


def fallback_backward(grad_h, a, h, h0, reverse, batch_first):
    math = state_dtype(a.dtype)
    grad_a, grad_b, grad_h0 = linear_scan_backward_reference(
        grad_h.to(math), a.to(math), h.to(math), None if h0 is None else h0.to(math), reverse=reverse,
        batch_first=batch_first)
    return (grad_a.to(a.dtype).contiguous(), grad_b.to(a.dtype).contiguous(),
            grad_h0.to(h0.dtype) if h0 is not None else a.new_empty(0))
