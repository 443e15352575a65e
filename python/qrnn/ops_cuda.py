"""The CUDA kernels behind the ``qrnn::forget_mult`` and ``qrnn::qrnn_gates`` ops, registered
for device type ``"cuda"`` in :mod:`qrnn.ops` when this build has them
(``qrnn.build_info()["cuda"]``).

Every call reads the current CUDA stream of the tensors' device (never cached, so
``torch.cuda.stream(...)`` blocks, CUDA graphs and ``torch.compile(mode="reduce-overhead")``
are honoured), passes that device to the launcher (which makes it current), allocates the outputs
with torch (the caching allocator, ordered on that stream) and launches. The C++ side
neither allocates nor synchronises.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor

from . import _C, ops

__all__ = ["AVAILABLE", "schedule", "forward_into", "backward_into", "forward_plan", "backward_plan",
           "gates_forward_into", "gates_backward_into", "gates_forward_width", "gates_backward_width"]

AVAILABLE = hasattr(_C, "cuda_forget_mult_forward")

# Codes of qrnn::cuda::Schedule, as qrnn._C exports them.
_SCHEDULES = _C.cuda_schedules() if AVAILABLE else {"auto": 0}
_schedule = _SCHEDULES["auto"]

# The raw cudaStream_t of a device's current stream: what torch.cuda.current_stream(i).cuda_stream
# returns, without building a Stream object per call (the getter torch.compile's code uses).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_handle(index: int) -> int:
    """The current CUDA stream of device `index`, as the integer cudaStream_t."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _device_index(device: torch.device) -> int:
    return device.index  # a CUDA tensor's device always has its index


class Runtime:
    """The CUDA lookups a launch makes: the device index and torch's current stream of it.
    Tests substitute a stand-in that lets CPU tensors go through this module to the
    emulated kernels (tests/conftest.py)."""

    index = staticmethod(_device_index)
    stream = staticmethod(current_stream_handle)


runtime = Runtime()


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


def _launch(kernel, device: torch.device, args: tuple, schedule: bool = True) -> None:
    """Run `kernel` on `device`'s current stream. The C++ launcher makes `device` current
    for the launch itself (its CUDA runtime is not torch's, so torch's device switch is not
    relied on). ForgetMult kernels also take the schedule."""
    index = runtime.index(device)
    stream = runtime.stream(index)
    if schedule:
        kernel(*args, stream, _schedule, index)
    else:
        kernel(*args, stream, index)


def _forward_cuda(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    h = ops._empty_contiguous(f)
    _launch(_C.cuda_forget_mult_forward, f.device, ops._forward_args(h, f, x, h0, batch_first))
    return h


def _backward_cuda(grad_h, f, x, h, h0, batch_first):
    grad_f, grad_x = ops._empty_contiguous(f), ops._empty_contiguous(f)
    grad_h0 = ops._empty_contiguous(h0) if h0 is not None else None
    _launch(_C.cuda_forget_mult_backward, f.device,
            ops._backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first))
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
    _launch(_C.cuda_forget_mult_forward, f.device, ops._forward_args(h, f, x, h0, batch_first))
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
            ops._backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first))
    return grad_f, grad_x, grad_h0


def forward_plan(h: Tensor, f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                 schedule: str = "auto") -> tuple:
    """``(vector_width, chunks)`` that :func:`forward_into` would launch with these tensors.
    Host-only: only sizes, strides and addresses are looked at, so CPU tensors answer too."""
    return _C.cuda_forget_mult_forward_plan(*ops._forward_args(h, f, x, h0, batch_first), _SCHEDULES[schedule])


def backward_plan(grad_f: Tensor, grad_x: Tensor, grad_h0: Optional[Tensor], grad_h: Tensor, f: Tensor,
                  x: Tensor, h: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                  schedule: str = "auto") -> tuple:
    """``(vector_width, chunks)`` that :func:`backward_into` would launch (host-only)."""
    args = ops._backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
    return _C.cuda_forget_mult_backward_plan(*args, _SCHEDULES[schedule])


# ---- Fused QRNN gates ------------------------------------------------------------------


def _gates_forward_cuda(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                        need_states=True):
    output, states, c_n = ops._gates_forward_outputs(gates, output_gate, batch_first, need_states)
    _launch(_C.cuda_qrnn_gates_forward, gates.device,
            ops._gates_forward_args(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                                    batch_first, reverse), schedule=False)
    return output, c_n, (states if states is not None else gates.new_empty(0))


def _gates_backward_cuda(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                         output_gate, batch_first, reverse):
    grad_gates = ops._empty_contiguous(gates)
    grad_c0 = ops._empty_contiguous(c0) if c0 is not None else None
    _launch(_C.cuda_qrnn_gates_backward, gates.device,
            ops._gates_backward_args(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask,
                                     lengths, forget_scale, output_gate, batch_first, reverse), schedule=False)
    return grad_gates, (grad_c0 if grad_c0 is not None else gates.new_empty(0))


def gates_forward_into(output: Tensor, states: Optional[Tensor], c_n: Optional[Tensor], gates: Tensor,
                       c0: Optional[Tensor] = None, forget_mask: Optional[Tensor] = None,
                       lengths: Optional[Tensor] = None, *, forget_scale: float = 1.0, output_gate: bool = True,
                       batch_first: bool = False, reverse: bool = False) -> Tensor:
    """The fused gates forward writing into given (any-strided) ``output``, ``states`` and
    ``c_n`` (None: not written), as :func:`forward_into` does for ForgetMult."""
    ops.check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    _launch(_C.cuda_qrnn_gates_forward, gates.device,
            ops._gates_forward_args(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                                    batch_first, reverse), schedule=False)
    return output


def gates_backward_into(grad_gates: Tensor, grad_c0: Optional[Tensor], grad_output: Optional[Tensor],
                        grad_c_n: Optional[Tensor], gates: Tensor, states: Tensor, c0: Optional[Tensor] = None,
                        forget_mask: Optional[Tensor] = None, lengths: Optional[Tensor] = None, *,
                        forget_scale: float = 1.0, output_gate: bool = True, batch_first: bool = False,
                        reverse: bool = False) -> Tensor:
    """The fused gates backward writing into given ``grad_gates`` and ``grad_c0`` (None: not written)."""
    ops.check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                       output_gate, batch_first)
    _launch(_C.cuda_qrnn_gates_backward, gates.device,
            ops._gates_backward_args(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask,
                                     lengths, forget_scale, output_gate, batch_first, reverse), schedule=False)
    return grad_gates


def gates_forward_width(args: tuple) -> int:
    """Hidden units per thread that the gates forward launches for ``ops._gates_forward_args``
    (host-only, so CPU tensors answer too)."""
    return _C.cuda_qrnn_gates_forward_width(*args)[0]


def gates_backward_width(args: tuple) -> int:
    """As :func:`gates_forward_width`, for ``ops._gates_backward_args``."""
    return _C.cuda_qrnn_gates_backward_width(*args)[0]


if AVAILABLE:
    ops.FORWARD_KERNELS["cuda"] = _forward_cuda
    ops.BACKWARD_KERNELS["cuda"] = _backward_cuda
    ops.QRNN_GATES_FORWARD_KERNELS["cuda"] = _gates_forward_cuda
    ops.QRNN_GATES_BACKWARD_KERNELS["cuda"] = _gates_backward_cuda
