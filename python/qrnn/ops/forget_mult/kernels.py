"""ForgetMult's kernels per backend: qrnn._C's CPU entry points, its CUDA launchers (in builds
with them; also their launches into given outputs and their launch plans, for tests and
benchmarks) and the pure-PyTorch fallback of devices without native kernels, each writing
fresh outputs; and the kernels' argument tuples."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ... import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub
from ..core import cuda as _cuda
from ..core.kernel_args import generate, probe, state_dtype
from ..core.outputs import empty_contiguous, or_empty
from .checks import check_forget_mult_args
from .reference import forget_mult_backward_reference, forget_mult_reference

__all__ = ["forward_args", "backward_args", "cpu_forward", "cpu_backward", "CUDA_AVAILABLE", "cuda_forward",
           "cuda_backward", "forward_into", "backward_into", "forward_plan", "backward_plan", "fallback_forward",
           "fallback_backward"]

# ---- Argument tuples, from the fields qrnn._C exports (cpp/include/qrnn/forget_mult.hpp) --------

_TIME_MAJOR = """
code = DTYPE_CODES[f.dtype]
if batch_first:
    {names} = {transposed}
T, B, H = f.shape
"""


def time_major(*names) -> str:
    """The builders' prologue: the named tensors made time-major; the dtype code and T, B, H."""
    return _TIME_MAJOR.format(names=", ".join(names), transposed=", ".join(f"{n}.transpose(0, 1)" for n in names))


_FORGET_MULT_COMMON = {
    "dtype": "code", "seq_len": "T", "batch": "B", "hidden": "H",
    "f": "f", "x": "x", "h0": "(_NO_VIEW2 if h0 is None else (h0.data_ptr(), *h0.stride()))",
    "h0_dtype": "code if h0 is None else DTYPE_CODES[h0.dtype]",
}
_fm = probe(2, 3, 4)
forward_args: Callable[..., tuple] = generate(
    "forget_mult_forward", "h, f, x, h0, batch_first", time_major("h", "f", "x"),
    {**_FORGET_MULT_COMMON, "h": "h"},
    [(_fm, _fm, _fm, None, False), (_fm, _fm, _fm, probe(2, 4), True)])
backward_args: Callable[..., tuple] = generate(
    "forget_mult_backward", "grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first",
    time_major("grad_f", "grad_x", "grad_h", "f", "x", "h"),
    {**_FORGET_MULT_COMMON, "h": "h", "grad_h": "grad_h", "grad_f": "grad_f", "grad_x": "grad_x",
     "grad_h0": "view2(grad_h0)"},
    [(_fm, _fm, None, _fm, _fm, _fm, _fm, None, False)])


def _grads(f: Tensor, h0: Optional[Tensor]) -> tuple:
    """Fresh (grad_f, grad_x, grad_h0 or None) for a backward kernel."""
    return empty_contiguous(f), empty_contiguous(f), (empty_contiguous(h0) if h0 is not None else None)


# ---- CPU --------------------------------------------------------------------------------------


def cpu_forward(f, x, h0, batch_first):
    # empty_contiguous inlined: the eager path's cost at small shapes is mostly calls.
    h = torch.empty_like(f) if f.is_contiguous() else torch.empty_like(f, memory_format=torch.contiguous_format)
    _C.forget_mult_forward(*forward_args(h, f, x, h0, batch_first), torch.get_num_threads())
    return h


def cpu_backward(grad_h, f, x, h, h0, batch_first):
    grad_f, grad_x, grad_h0 = _grads(f, h0)
    _C.forget_mult_backward(*backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first),
                            torch.get_num_threads())
    return grad_f, grad_x, or_empty(grad_h0, f)


# ---- CUDA (builds with the CUDA kernels) ------------------------------------------------------

CUDA_AVAILABLE: bool = hasattr(_C, "cuda_forget_mult_forward")


def _launch_forward(h, f, x, h0, batch_first) -> None:
    _cuda.launch_by_name("cuda_forget_mult_forward", f.device, forward_args(h, f, x, h0, batch_first))


def _launch_backward(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first) -> None:
    _cuda.launch_by_name("cuda_forget_mult_backward", f.device,
                         backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first))


def cuda_forward(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    h = empty_contiguous(f)
    _launch_forward(h, f, x, h0, batch_first)
    return h


def cuda_backward(grad_h, f, x, h, h0, batch_first):
    grad_f, grad_x, grad_h0 = _grads(f, h0)
    _launch_backward(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
    return grad_f, grad_x, or_empty(grad_h0, f)


def forward_into(h: Tensor, f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *,
                 batch_first: bool = False) -> Tensor:
    """The forward kernel writing into a given (any-strided) ``h``: the very launch the op
    makes into its fresh output. Tests pass a NaN-filled ``h`` to prove every element is
    written, and views of wider buffers to prove nothing else is."""
    check_forget_mult_args(f, x, h0, batch_first)
    _cuda.check_out("h", h, f)
    _launch_forward(h, f, x, h0, batch_first)
    return h


def backward_into(grad_f: Tensor, grad_x: Tensor, grad_h0: Optional[Tensor], grad_h: Tensor, f: Tensor,
                  x: Tensor, h: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False) -> tuple:
    """The backward kernel writing into given ``grad_f``, ``grad_x`` and ``grad_h0`` (None to
    skip it), as :func:`forward_into`."""
    check_forget_mult_args(f, x, h0, batch_first)
    for name, t in (("grad_f", grad_f), ("grad_x", grad_x), ("grad_h", grad_h), ("h", h)):
        _cuda.check_out(name, t, f)
    if grad_h0 is not None:
        if h0 is None:
            raise ValueError("grad_h0 needs h0 (its dtype and layout)")
        _cuda.check_out("grad_h0", grad_h0, h0)
    _launch_backward(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
    return grad_f, grad_x, grad_h0


def forward_plan(h: Tensor, f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                 schedule: str = "auto") -> tuple:
    """``(vector_width, chunks)`` that :func:`forward_into` would launch with these tensors.
    Host-only: only sizes, strides and addresses are looked at, so CPU tensors answer too."""
    return _C.cuda_forget_mult_forward_plan(*forward_args(h, f, x, h0, batch_first), _cuda.SCHEDULES[schedule])


def backward_plan(grad_f: Tensor, grad_x: Tensor, grad_h0: Optional[Tensor], grad_h: Tensor, f: Tensor,
                  x: Tensor, h: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                  schedule: str = "auto") -> tuple:
    """``(vector_width, chunks)`` that :func:`backward_into` would launch (host-only)."""
    args = backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
    return _C.cuda_forget_mult_backward_plan(*args, _cuda.SCHEDULES[schedule])


# ---- Devices without native kernels: the reference loop with the kernels' state dtype -------------


def fallback_forward(f, x, h0, batch_first):
    math = state_dtype(f.dtype)
    h = forget_mult_reference(f.to(math), x.to(math), None if h0 is None else h0.to(math), batch_first=batch_first)
    return h.to(f.dtype).contiguous()


def fallback_backward(grad_h, f, x, h, h0, batch_first):
    """The backward of :func:`fallback_forward`: the reference reverse-time loop."""
    math = state_dtype(f.dtype)
    grad_f, grad_x, grad_h0 = forget_mult_backward_reference(
        grad_h.to(math), f.to(math), x.to(math), h.to(math), None if h0 is None else h0.to(math),
        batch_first=batch_first)
    return (grad_f.to(f.dtype).contiguous(), grad_x.to(f.dtype).contiguous(),
            grad_h0.to(h0.dtype) if h0 is not None else f.new_empty(0))
