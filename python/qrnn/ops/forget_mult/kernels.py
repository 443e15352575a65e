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
from ..core.kernel_args import SEQUENCE_FIELDS, SEQUENCE_PROLOGUE, generate, probe, state_dtype
from ..core.outputs import empty_contiguous, or_empty
from ..linear_scan import kernels as _ls
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


def _view(name: str) -> str:
    """A time-major view's numbers, walked from the last step for a whole-row reverse."""
    return f"(({name}.data_ptr(), *{name}.stride()) if not whole else time_view3({name}, False, True))"


_FORGET_MULT_COMMON = {
    **SEQUENCE_FIELDS, "dtype": "code", "seq_len": "T", "batch": "B if cu_seqlens is None else cu_seqlens.shape[0] - 1",
    "hidden": "H", "f": _view("f"), "x": _view("x"), "h": _view("h"),
    "h0": "(_NO_VIEW2 if h0 is None else (h0.data_ptr(), *h0.stride()))",
    "h0_dtype": "code if h0 is None else DTYPE_CODES[h0.dtype]",
}
_SEQUENCES = "lengths=None, cu_seqlens=None, reverse=False"
_fm = probe(2, 3, 4)
forward_args: Callable[..., tuple] = generate(
    "forget_mult_forward", f"h, f, x, h0, batch_first, {_SEQUENCES}",
    time_major("h", "f", "x") + SEQUENCE_PROLOGUE, _FORGET_MULT_COMMON,
    [(_fm, _fm, _fm, None, False), (_fm, _fm, _fm, probe(2, 4), True, None, None, True)])
backward_args: Callable[..., tuple] = generate(
    "forget_mult_backward", f"grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first, {_SEQUENCES}",
    time_major("grad_f", "grad_x", "grad_h", "f", "x", "h") + SEQUENCE_PROLOGUE,
    {**_FORGET_MULT_COMMON, "grad_h": _view("grad_h"), "grad_f": _view("grad_f"), "grad_x": _view("grad_x"),
     "grad_h0": "view2(grad_h0)"},
    [(_fm, _fm, None, _fm, _fm, _fm, _fm, None, False)])


def _grads(f: Tensor, h0: Optional[Tensor]) -> tuple:
    """Fresh (grad_f, grad_x, grad_h0 or None) for a backward kernel."""
    return empty_contiguous(f), empty_contiguous(f), (empty_contiguous(h0) if h0 is not None else None)


# ---- CPU --------------------------------------------------------------------------------------


def cpu_forward(f, x, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False):
    # empty_contiguous inlined: the eager path's cost at small shapes is mostly calls.
    h = torch.empty_like(f) if f.is_contiguous() else torch.empty_like(f, memory_format=torch.contiguous_format)
    _C.forget_mult_forward(*forward_args(h, f, x, h0, batch_first, lengths, cu_seqlens, reverse),
                           torch.get_num_threads())
    return h


def cpu_backward(grad_h, f, x, h, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False):
    grad_f, grad_x, grad_h0 = _grads(f, h0)
    _C.forget_mult_backward(*backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first, lengths,
                                           cu_seqlens, reverse), torch.get_num_threads())
    return grad_f, grad_x, or_empty(grad_h0, f)


# ---- CUDA (builds with the CUDA kernels) ------------------------------------------------------

CUDA_AVAILABLE: bool = hasattr(_C, "cuda_forget_mult_forward")


def _launch_forward(h, f, x, h0, batch_first, reverse=False) -> None:
    _cuda.launch_by_name("cuda_forget_mult_forward", f.device,
                         forward_args(h, f, x, h0, batch_first, None, None, reverse))


def _launch_backward(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first, reverse=False) -> None:
    _cuda.launch_by_name("cuda_forget_mult_backward", f.device,
                         backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first, None, None, reverse))


def cuda_forward(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool, lengths=None, cu_seqlens=None,
                 reverse=False) -> Tensor:
    if lengths is not None or cu_seqlens is not None:
        return _with_sequences_forward(_ls.cuda_forward, f, x, h0, batch_first, lengths, cu_seqlens, reverse)
    h = empty_contiguous(f)
    _launch_forward(h, f, x, h0, batch_first, reverse)
    return h


def cuda_backward(grad_h, f, x, h, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False):
    if lengths is not None or cu_seqlens is not None:
        return _with_sequences_backward(_ls.cuda_backward, grad_h, f, x, h, h0, batch_first, lengths, cu_seqlens,
                                        reverse)
    grad_f, grad_x, grad_h0 = _grads(f, h0)
    _launch_backward(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first, reverse)
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


def fallback_forward(f, x, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False):
    if lengths is not None or cu_seqlens is not None or reverse:
        return _with_sequences_forward(_ls.fallback_forward, f, x, h0, batch_first, lengths, cu_seqlens, reverse)
    math = state_dtype(f.dtype)
    h = forget_mult_reference(f.to(math), x.to(math), None if h0 is None else h0.to(math), batch_first=batch_first)
    return h.to(f.dtype).contiguous()


def fallback_backward(grad_h, f, x, h, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False):
    """The backward of :func:`fallback_forward`: the reference reverse-time loop."""
    if lengths is not None or cu_seqlens is not None or reverse:
        return _with_sequences_backward(_ls.fallback_backward, grad_h, f, x, h, h0, batch_first, lengths, cu_seqlens,
                                        reverse)
    math = state_dtype(f.dtype)
    grad_f, grad_x, grad_h0 = forget_mult_backward_reference(
        grad_h.to(math), f.to(math), x.to(math), h.to(math), None if h0 is None else h0.to(math),
        batch_first=batch_first)
    return (grad_f.to(f.dtype).contiguous(), grad_x.to(f.dtype).contiguous(),
            grad_h0.to(h0.dtype) if h0 is not None else f.new_empty(0))


# ---- Through linear_scan's kernels: h = (1 - f) h + f x ----------------------------------------------
# For the kernels that have no sequences (CUDA) or no reverse (the fallback's reference loop).


def _with_sequences_forward(ls_forward, f, x, h0, batch_first, lengths, cu_seqlens, reverse):
    math = state_dtype(f.dtype)
    fm = f.to(math)
    h = ls_forward(1 - fm, fm * x.to(math), h0, reverse, batch_first, lengths, cu_seqlens)
    return h.to(f.dtype).contiguous()


def _with_sequences_backward(ls_backward, grad_h, f, x, h, h0, batch_first, lengths, cu_seqlens, reverse):
    math = state_dtype(f.dtype)
    fm, xm = f.to(math), x.to(math)
    grad_a, grad_b, grad_h0 = ls_backward(grad_h.to(math), 1 - fm, h.to(math), h0, reverse, batch_first, lengths,
                                          cu_seqlens)
    return ((grad_b * xm - grad_a).to(f.dtype).contiguous(), (grad_b * fm).to(f.dtype).contiguous(), grad_h0)
