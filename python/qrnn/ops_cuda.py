"""The CUDA kernels behind the ``qrnn::forget_mult`` ops, registered for device type
``"cuda"`` in :mod:`qrnn.ops` when this build has them (``qrnn.build_info()["cuda"]``).

Every call reads the current CUDA stream of the tensors' device (never cached, so
``torch.cuda.stream(...)`` blocks, CUDA graphs and ``torch.compile(mode="reduce-overhead")``
are honoured), enters that device when it is not the current one, allocates the outputs
with torch (the caching allocator, ordered on that stream) and launches. The C++ side
neither allocates nor synchronises.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor

from . import _C, ops

__all__ = ["AVAILABLE", "schedule", "forward_into", "backward_into", "forward_plan", "backward_plan"]

AVAILABLE = hasattr(_C, "cuda_forget_mult_forward")

# Codes of qrnn::cuda::Schedule (cpp/include/qrnn/forget_mult_cuda.hpp).
_SCHEDULES = {"auto": 0, "serial": 1, "chunked": 2}
_schedule = _SCHEDULES["auto"]

# The raw cudaStream_t of a device's current stream: what torch.cuda.current_stream(i).cuda_stream
# returns, without building a Stream object per call (the getter torch.compile's code uses).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_handle(index: int) -> int:
    """The current CUDA stream of device `index`, as the integer cudaStream_t."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


@contextlib.contextmanager
def schedule(name: str):
    """Force the kernels' time schedule inside the block: ``"auto"`` (the size rule),
    ``"serial"`` or ``"chunked"``. For tests and benchmarks; results agree to rounding."""
    global _schedule
    if name not in _SCHEDULES:
        raise ValueError(f"schedule: expected one of {sorted(_SCHEDULES)}, got {name!r}")
    previous, _schedule = _schedule, _SCHEDULES[name]
    try:
        yield
    finally:
        _schedule = previous


def _forward_args(h: Tensor, f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> tuple:
    code = ops._DTYPE_CODES[f.dtype]
    T, B, H = ops._sizes(f, batch_first)
    return (
        code, T, B, H,
        f.data_ptr(), ops._strides3(f, batch_first),
        x.data_ptr(), ops._strides3(x, batch_first),
        *ops._h0_args(h0, code),
        h.data_ptr(), ops._strides3(h, batch_first),
    )


def _backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first) -> tuple:
    code = ops._DTYPE_CODES[f.dtype]
    T, B, H = ops._sizes(f, batch_first)
    h0_ptr, h0_strides, h0_code = ops._h0_args(h0, code)
    return (
        code, T, B, H,
        f.data_ptr(), ops._strides3(f, batch_first),
        x.data_ptr(), ops._strides3(x, batch_first),
        h.data_ptr(), ops._strides3(h, batch_first),
        h0_ptr, h0_strides, h0_code,
        grad_h.data_ptr(), ops._strides3(grad_h, batch_first),
        grad_f.data_ptr(), ops._strides3(grad_f, batch_first),
        grad_x.data_ptr(), ops._strides3(grad_x, batch_first),
        grad_h0.data_ptr() if grad_h0 is not None else 0,
        grad_h0.stride() if grad_h0 is not None else ops._NO_STRIDES2,
    )


def _launch(kernel, device: torch.device, args: tuple) -> None:
    """Run `kernel` on `device`'s current stream, with `device` current (a stream only
    takes launches from its own device's context)."""
    index = device.index
    if index == torch.cuda.current_device():
        kernel(*args, current_stream_handle(index), _schedule)
    else:
        with torch.cuda.device(index):
            kernel(*args, current_stream_handle(index), _schedule)


# empty_like(..., contiguous_format) allocates the same fresh contiguous tensor as
# torch.empty(shape, dtype=, device=) at under half the Python cost.
_CONTIGUOUS = torch.contiguous_format


def _forward_cuda(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    h = torch.empty_like(f, memory_format=_CONTIGUOUS)
    _launch(_C.cuda_forget_mult_forward, f.device, _forward_args(h, f, x, h0, batch_first))
    return h


def _backward_cuda(grad_h, f, x, h, h0, batch_first):
    grad_f = torch.empty_like(f, memory_format=_CONTIGUOUS)
    grad_x = torch.empty_like(f, memory_format=_CONTIGUOUS)
    grad_h0 = torch.empty_like(h0, memory_format=_CONTIGUOUS) if h0 is not None else None
    _launch(_C.cuda_forget_mult_backward, f.device,
            _backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first))
    return grad_f, grad_x, (grad_h0 if grad_h0 is not None else f.new_empty(0))


def _check_out(name: str, out: Tensor, like: Tensor, dtype=None) -> None:
    dtype = like.dtype if dtype is None else dtype
    if out.shape != like.shape or out.dtype != dtype or out.device != like.device:
        raise ValueError(f"{name} must be {tuple(like.shape)} {dtype} on {like.device}, "
                         f"got {tuple(out.shape)} {out.dtype} on {out.device}")


def forward_into(h: Tensor, f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *,
                 batch_first: bool = False) -> Tensor:
    """The forward kernel writing into a given (any-strided) ``h``: the very launch the op
    makes into its fresh output. Tests pass a NaN-filled ``h`` to prove every element is
    written, and views of wider buffers to prove nothing else is."""
    ops.check_forget_mult_args(f, x, h0, batch_first)
    _check_out("h", h, f)
    _launch(_C.cuda_forget_mult_forward, f.device, _forward_args(h, f, x, h0, batch_first))
    return h


def backward_into(grad_f: Tensor, grad_x: Tensor, grad_h0: Optional[Tensor], grad_h: Tensor, f: Tensor,
                  x: Tensor, h: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False) -> tuple:
    """The backward kernel writing into given ``grad_f``, ``grad_x`` and ``grad_h0`` (None to
    skip it), as :func:`forward_into`."""
    ops.check_forget_mult_args(f, x, h0, batch_first)
    for name, t in (("grad_f", grad_f), ("grad_x", grad_x), ("grad_h", grad_h), ("h", h)):
        _check_out(name, t, f)
    if grad_h0 is not None:
        if h0 is None:
            raise ValueError("grad_h0 needs h0 (its dtype and layout)")
        _check_out("grad_h0", grad_h0, h0)
    _launch(_C.cuda_forget_mult_backward, f.device,
            _backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first))
    return grad_f, grad_x, grad_h0


def forward_plan(h: Tensor, f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                 schedule: str = "auto") -> tuple:
    """``(vector_width, chunks)`` that :func:`forward_into` would launch with these tensors.
    Host-only: only sizes, strides and addresses are looked at, so CPU tensors answer too."""
    return _C.cuda_forget_mult_forward_plan(*_forward_args(h, f, x, h0, batch_first), _SCHEDULES[schedule])


def backward_plan(grad_f: Tensor, grad_x: Tensor, grad_h0: Optional[Tensor], grad_h: Tensor, f: Tensor,
                  x: Tensor, h: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                  schedule: str = "auto") -> tuple:
    """``(vector_width, chunks)`` that :func:`backward_into` would launch (host-only)."""
    args = _backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
    return _C.cuda_forget_mult_backward_plan(*args, _SCHEDULES[schedule])


if AVAILABLE:
    ops.FORWARD_KERNELS["cuda"] = _forward_cuda
    ops.BACKWARD_KERNELS["cuda"] = _backward_cuda
