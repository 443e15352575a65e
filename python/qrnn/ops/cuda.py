"""The CUDA kernels behind the ``qrnn::forget_mult`` and ``qrnn::qrnn_gates`` ops, which the op
families register for device type ``"cuda"`` when this build has them (``AVAILABLE``,
``qrnn.build_info()["cuda"]``), and their launches into given outputs (``forward_into`` and the others below).

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

from .. import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub
from ._outputs import empty_contiguous, forget_mult_grads, or_empty, qrnn_gates_grads, qrnn_gates_outputs
from .checks import check_forget_mult_args, check_qrnn_gates_args, check_qrnn_gates_backward_args
from .kernel_args import forget_mult_backward as _forget_mult_backward_args
from .kernel_args import forget_mult_forward as _forget_mult_forward_args
from .kernel_args import qrnn_gates_backward as _qrnn_gates_backward_args
from .kernel_args import qrnn_gates_forward as _qrnn_gates_forward_args

__all__ = ["AVAILABLE", "current_stream_handle", "schedule", "forward_into", "backward_into", "forward_plan",
           "backward_plan", "gates_forward_into", "gates_backward_into", "gates_forward_width", "gates_backward_width"]

AVAILABLE: bool = hasattr(_C, "cuda_forget_mult_forward")

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


def launch(kernel, device: torch.device, args: tuple, schedule: bool = True) -> None:
    """Run `kernel` on `device`'s current stream. The C++ launcher makes `device` current
    for the launch itself (its CUDA runtime is not torch's, so torch's device switch is not
    relied on). ForgetMult kernels also take the schedule."""
    index = runtime.index(device)
    stream = runtime.stream(index)
    if schedule:
        kernel(*args, stream, _schedule, index)
    else:
        kernel(*args, stream, index)


def launch_by_name(launcher: str, device: torch.device, args: tuple) -> None:
    """:func:`launch` of qrnn._C's launcher ``launcher`` (a scan family's: it takes the
    schedule), looked up at the call so that tests can stand in for qrnn._C here."""
    launch(getattr(_C, launcher), device, args)


def _forget_mult_forward_launch(h, f, x, h0, batch_first) -> None:
    launch(_C.cuda_forget_mult_forward, f.device, _forget_mult_forward_args(h, f, x, h0, batch_first))


def _forget_mult_backward_launch(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first) -> None:
    launch(_C.cuda_forget_mult_backward, f.device,
            _forget_mult_backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first))


def forget_mult_forward(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    h = empty_contiguous(f)
    _forget_mult_forward_launch(h, f, x, h0, batch_first)
    return h


def forget_mult_backward(grad_h, f, x, h, h0, batch_first):
    grad_f, grad_x, grad_h0 = forget_mult_grads(f, h0)
    _forget_mult_backward_launch(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
    return grad_f, grad_x, or_empty(grad_h0, f)


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
    check_forget_mult_args(f, x, h0, batch_first)
    _check_out("h", h, f)
    _forget_mult_forward_launch(h, f, x, h0, batch_first)
    return h


def backward_into(grad_f: Tensor, grad_x: Tensor, grad_h0: Optional[Tensor], grad_h: Tensor, f: Tensor,
                  x: Tensor, h: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False) -> tuple:
    """The backward kernel writing into given ``grad_f``, ``grad_x`` and ``grad_h0`` (None to
    skip it), as :func:`forward_into`."""
    check_forget_mult_args(f, x, h0, batch_first)
    for name, t in (("grad_f", grad_f), ("grad_x", grad_x), ("grad_h", grad_h), ("h", h)):
        _check_out(name, t, f)
    if grad_h0 is not None:
        if h0 is None:
            raise ValueError("grad_h0 needs h0 (its dtype and layout)")
        _check_out("grad_h0", grad_h0, h0)
    _forget_mult_backward_launch(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
    return grad_f, grad_x, grad_h0


def forward_plan(h: Tensor, f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                 schedule: str = "auto") -> tuple:
    """``(vector_width, chunks)`` that :func:`forward_into` would launch with these tensors.
    Host-only: only sizes, strides and addresses are looked at, so CPU tensors answer too."""
    return _C.cuda_forget_mult_forward_plan(*_forget_mult_forward_args(h, f, x, h0, batch_first), _SCHEDULES[schedule])


def backward_plan(grad_f: Tensor, grad_x: Tensor, grad_h0: Optional[Tensor], grad_h: Tensor, f: Tensor,
                  x: Tensor, h: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                  schedule: str = "auto") -> tuple:
    """``(vector_width, chunks)`` that :func:`backward_into` would launch (host-only)."""
    args = _forget_mult_backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
    return _C.cuda_forget_mult_backward_plan(*args, _SCHEDULES[schedule])


# ---- Fused QRNN gates ------------------------------------------------------------------


def _qrnn_gates_forward_launch(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                               batch_first, reverse) -> None:
    launch(_C.cuda_qrnn_gates_forward, gates.device,
            _qrnn_gates_forward_args(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                                     batch_first, reverse), schedule=False)


def _qrnn_gates_backward_launch(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                forget_scale, output_gate, batch_first, reverse) -> None:
    launch(_C.cuda_qrnn_gates_backward, gates.device,
            _qrnn_gates_backward_args(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask,
                                      lengths, forget_scale, output_gate, batch_first, reverse), schedule=False)


def qrnn_gates_forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                       need_states=True):
    output, states, c_n = qrnn_gates_outputs(gates, output_gate, batch_first, need_states)
    _qrnn_gates_forward_launch(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                               batch_first, reverse)
    return output, c_n, or_empty(states, gates)


def qrnn_gates_backward(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                        batch_first, reverse):
    grad_gates, grad_c0 = qrnn_gates_grads(gates, c0)
    _qrnn_gates_backward_launch(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                forget_scale, output_gate, batch_first, reverse)
    return grad_gates, or_empty(grad_c0, gates)


def gates_forward_into(output: Tensor, states: Optional[Tensor], c_n: Optional[Tensor], gates: Tensor,
                       c0: Optional[Tensor] = None, forget_mask: Optional[Tensor] = None,
                       lengths: Optional[Tensor] = None, *, forget_scale: float = 1.0, output_gate: bool = True,
                       batch_first: bool = False, reverse: bool = False) -> Tensor:
    """The fused gates forward writing into given (any-strided) ``output``, ``states`` and
    ``c_n`` (None: not written), as :func:`forward_into` does for ForgetMult."""
    check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    _qrnn_gates_forward_launch(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                               batch_first, reverse)
    return output


def gates_backward_into(grad_gates: Tensor, grad_c0: Optional[Tensor], grad_output: Optional[Tensor],
                        grad_c_n: Optional[Tensor], gates: Tensor, states: Tensor, c0: Optional[Tensor] = None,
                        forget_mask: Optional[Tensor] = None, lengths: Optional[Tensor] = None, *,
                        forget_scale: float = 1.0, output_gate: bool = True, batch_first: bool = False,
                        reverse: bool = False) -> Tensor:
    """The fused gates backward writing into given ``grad_gates`` and ``grad_c0`` (None: not written)."""
    check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                   output_gate, batch_first)
    _qrnn_gates_backward_launch(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                forget_scale, output_gate, batch_first, reverse)
    return grad_gates


def gates_forward_width(args: tuple) -> int:
    """Hidden units per thread that the gates forward launches for ``kernel_args.qrnn_gates_forward``
    (host-only, so CPU tensors answer too)."""
    return _C.cuda_qrnn_gates_forward_width(*args)[0]


def gates_backward_width(args: tuple) -> int:
    """As :func:`gates_forward_width`, for ``kernel_args.qrnn_gates_backward``."""
    return _C.cuda_qrnn_gates_backward_width(*args)[0]

