"""PyTorch ops over the torch-free kernels in ``qrnn._C``.

``qrnn::forget_mult`` and ``qrnn::forget_mult_backward`` are ``torch.library.custom_op``s
with fake (meta) and autograd registrations, so autograd, ``torch.compile`` and
``torch.library.opcheck`` understand them. When nothing is being traced and no gradient
is needed, :func:`forget_mult` skips the dispatcher and calls the kernel directly:
the op machinery costs tens of microseconds per call, which dominates small shapes.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import _C

__all__ = ["forget_mult"]

# Codes of qrnn::DType in cpp/include/qrnn/dtype.hpp.
_DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.bfloat16: 2, torch.float16: 3}
_HALF_DTYPES = (torch.bfloat16, torch.float16)
_NO_STRIDES2 = (0, 0)


def _strides3(t: Tensor, batch_first: bool) -> tuple:
    """Element strides of a 3-D tensor in the kernel's (time, batch, hidden) order."""
    s = t.stride()
    return (s[1], s[0], s[2]) if batch_first else s


def _h0_args(h0: Optional[Tensor], dtype_code: int) -> tuple:
    if h0 is None:
        return 0, _NO_STRIDES2, dtype_code
    return h0.data_ptr(), h0.stride(), _DTYPE_CODES[h0.dtype]


def _check_device_built(t: Tensor) -> None:
    if t.device.type != "cpu":
        raise RuntimeError(
            f"qrnn has no {t.device.type} kernels in this build (build_info: {_C.build_info()}). "
            "Rebuild with them, e.g. `pip install torch-qrnn --no-binary torch-qrnn "
            "-Ccmake.define.QRNN_CUDA=ON` on a machine with nvcc, or move the tensors to the CPU."
        )


def _check_dense(name: str, t: Tensor) -> None:
    # Kernels read memory through data_ptr and strides: sparse and nested tensors have neither.
    if t.layout != torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout)
        raise TypeError(f"forget_mult: {name} must be a dense (strided) tensor, got a {kind} tensor")


def check_forget_mult_args(f, x, h0, batch_first) -> None:
    """Raise TypeError/ValueError naming the bad argument; shared by every entry point."""
    for name, t in (("f", f), ("x", x)):
        if not isinstance(t, Tensor):
            raise TypeError(f"forget_mult: {name} must be a torch.Tensor, got {type(t).__name__}")
        _check_dense(name, t)
    if batch_first is not True and batch_first is not False:
        raise TypeError(f"forget_mult: batch_first must be a bool, got {type(batch_first).__name__}")
    if f.dtype not in _DTYPE_CODES:
        raise TypeError(
            f"forget_mult: f must be float32, float64, bfloat16 or float16, got {f.dtype}"
        )
    if x.dtype != f.dtype:
        raise TypeError(f"forget_mult: x must have f's dtype {f.dtype}, got {x.dtype}")
    if f.dim() != 3:
        layout = "(batch, seq_len, hidden)" if batch_first else "(seq_len, batch, hidden)"
        raise ValueError(f"forget_mult: f must be 3-D {layout}, got shape {tuple(f.shape)}")
    if x.shape != f.shape:
        raise ValueError(f"forget_mult: x must have f's shape {tuple(f.shape)}, got {tuple(x.shape)}")
    if x.device != f.device:
        raise ValueError(f"forget_mult: x must be on f's device {f.device}, got {x.device}")
    if h0 is not None:
        if not isinstance(h0, Tensor):
            raise TypeError(f"forget_mult: h0 must be a torch.Tensor or None, got {type(h0).__name__}")
        _check_dense("h0", h0)
        batch, hidden = (f.shape[0], f.shape[2]) if batch_first else (f.shape[1], f.shape[2])
        if h0.shape != (batch, hidden):
            raise ValueError(
                f"forget_mult: h0 must have shape (batch, hidden) = {(batch, hidden)}, got {tuple(h0.shape)}"
            )
        if h0.dtype != f.dtype and not (f.dtype in _HALF_DTYPES and h0.dtype == torch.float32):
            allowed = f"{f.dtype} or torch.float32" if f.dtype in _HALF_DTYPES else f"{f.dtype}"
            raise TypeError(f"forget_mult: h0 must have dtype {allowed}, got {h0.dtype}")
        if h0.device != f.device:
            raise ValueError(f"forget_mult: h0 must be on f's device {f.device}, got {h0.device}")


def check_forget_mult_backward_args(grad_h, f, x, h, h0, batch_first) -> None:
    """The forward checks plus grad_h and h: same shape, dtype and device as f."""
    check_forget_mult_args(f, x, h0, batch_first)
    for name, t in (("grad_h", grad_h), ("h", h)):
        if not isinstance(t, Tensor):
            raise TypeError(f"forget_mult_backward: {name} must be a torch.Tensor, got {type(t).__name__}")
        _check_dense(name, t)
        if t.dtype != f.dtype:
            raise TypeError(f"forget_mult_backward: {name} must have f's dtype {f.dtype}, got {t.dtype}")
        if t.shape != f.shape:
            raise ValueError(f"forget_mult_backward: {name} must have f's shape {tuple(f.shape)}, got {tuple(t.shape)}")
        if t.device != f.device:
            raise ValueError(f"forget_mult_backward: {name} must be on f's device {f.device}, got {t.device}")


def _sizes(f: Tensor, batch_first: bool) -> tuple:
    s = f.shape
    return (s[1], s[0], s[2]) if batch_first else (s[0], s[1], s[2])


def _forward_cpu(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    h = torch.empty(f.shape, dtype=f.dtype)
    code = _DTYPE_CODES[f.dtype]
    T, B, H = _sizes(f, batch_first)
    _C.forget_mult_forward(
        code, T, B, H,
        f.data_ptr(), _strides3(f, batch_first),
        x.data_ptr(), _strides3(x, batch_first),
        *_h0_args(h0, code),
        h.data_ptr(), _strides3(h, batch_first),
        torch.get_num_threads(),
    )
    return h


def _backward_cpu(grad_h, f, x, h, h0, batch_first):
    grad_f = torch.empty(f.shape, dtype=f.dtype)
    grad_x = torch.empty(f.shape, dtype=f.dtype)
    grad_h0 = torch.empty(h0.shape, dtype=h0.dtype) if h0 is not None else f.new_empty(0)
    code = _DTYPE_CODES[f.dtype]
    T, B, H = _sizes(f, batch_first)
    h0_ptr, h0_strides, h0_code = _h0_args(h0, code)
    _C.forget_mult_backward(
        code, T, B, H,
        f.data_ptr(), _strides3(f, batch_first),
        x.data_ptr(), _strides3(x, batch_first),
        h.data_ptr(), _strides3(h, batch_first),
        h0_ptr, h0_strides, h0_code,
        grad_h.data_ptr(), _strides3(grad_h, batch_first),
        grad_f.data_ptr(), _strides3(grad_f, batch_first),
        grad_x.data_ptr(), _strides3(grad_x, batch_first),
        grad_h0.data_ptr() if h0 is not None else 0, grad_h0.stride() if h0 is not None else _NO_STRIDES2,
        torch.get_num_threads(),
    )
    return grad_f, grad_x, grad_h0


# Kernels per device type; other modules (the CUDA backend) add theirs.
FORWARD_KERNELS = {"cpu": _forward_cpu}
BACKWARD_KERNELS = {"cpu": _backward_cpu}


def _kernel(table: dict, t: Tensor):
    kernel = table.get(t.device.type)
    if kernel is None:
        _check_device_built(t)
    return kernel


@torch.library.custom_op("qrnn::forget_mult", mutates_args=())
def forget_mult_op(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    # Checked again here: torch.ops.qrnn.forget_mult can be called directly, and the
    # kernels take shapes on trust (a smaller x would be read out of bounds).
    check_forget_mult_args(f, x, h0, batch_first)
    return _kernel(FORWARD_KERNELS, f)(f, x, h0, batch_first)


@forget_mult_op.register_fake
def _(f, x, h0, batch_first):
    torch._check(x.shape == f.shape, lambda: "forget_mult: x must have f's shape")
    return torch.empty_like(f, memory_format=torch.contiguous_format)


@torch.library.custom_op("qrnn::forget_mult_backward", mutates_args=())
def forget_mult_backward_op(
    grad_h: Tensor, f: Tensor, x: Tensor, h: Tensor, h0: Optional[Tensor], batch_first: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (grad_f, grad_x, grad_h0); grad_h0 is an empty tensor when h0 is None."""
    check_forget_mult_backward_args(grad_h, f, x, h, h0, batch_first)
    return _kernel(BACKWARD_KERNELS, f)(grad_h, f, x, h, h0, batch_first)


@forget_mult_backward_op.register_fake
def _(grad_h, f, x, h, h0, batch_first):
    grad_f = torch.empty_like(f, memory_format=torch.contiguous_format)
    grad_x = torch.empty_like(f, memory_format=torch.contiguous_format)
    grad_h0 = torch.empty_like(h0, memory_format=torch.contiguous_format) if h0 is not None else f.new_empty(0)
    return grad_f, grad_x, grad_h0


def _setup_context(ctx, inputs, output):
    f, x, h0, batch_first = inputs
    ctx.save_for_backward(f, x, output, h0)
    ctx.batch_first = batch_first


def _backward(ctx, grad_h):
    f, x, h, h0 = ctx.saved_tensors
    grad_f, grad_x, grad_h0 = forget_mult_backward_op(grad_h, f, x, h, h0, ctx.batch_first)
    return grad_f, grad_x, (grad_h0 if h0 is not None else None), None


forget_mult_op.register_autograd(_backward, setup_context=_setup_context)


def _direct_call_ok(*tensors) -> bool:
    """True when no autograd, tracing, subclass or mode needs to see this call."""
    if torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled():
        return False
    if torch._C._len_torch_dispatch_stack() > 0:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        # A negative-bit view (e.g. complex.conj().imag) stores -values: the dispatcher
        # resolves it on the op path, the raw pointer would not.
        if t is not None and (type(t) is not Tensor or (grad and t.requires_grad) or t.is_neg()):
            return False
    return True


def forget_mult(f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False) -> Tensor:
    """ForgetMult: ``h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1]`` with ``h[-1] = h0``.

    The convention of the original pytorch-qrnn: ``f`` (the forget gate, usually a
    sigmoid output) weights the new candidate ``x``; ``1 - f`` keeps the old state.

    Args:
        f: forget gate, ``(seq_len, batch, hidden)`` (or ``(batch, seq_len, hidden)``
            with ``batch_first=True``); float32, float64, bfloat16 or float16, CPU or CUDA.
        x: candidate values, same shape, dtype and device as ``f``.
        h0: initial state ``(batch, hidden)``, or None for zeros. Its dtype is ``f``'s, or
            float32 for 16-bit ``f`` (a float32 carried state).
        batch_first: whether dimension 0 is batch instead of time.

    Returns:
        ``h``, every step's state, in ``f``'s shape, layout convention and dtype. Math
        and the carried state are float32 for 16-bit inputs (float64 for float64).
        Any strides are accepted without a copy. Differentiable in ``f``, ``x`` and
        ``h0``; works under ``torch.compile(fullgraph=True)``.
    """
    check_forget_mult_args(f, x, h0, batch_first)
    kernel = FORWARD_KERNELS.get(f.device.type)  # none for meta tensors: the op's fake impl serves them
    if kernel is not None and _direct_call_ok(f, x, h0):
        return kernel(f, x, h0, batch_first)
    return forget_mult_op(f, x, h0, batch_first)
