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
_NO_H0 = (0, 0, 0)  # pointer 0: absent


def _view2(t: Optional[Tensor]) -> tuple:
    """(pointer, stride_b, stride_h) of an optional (batch, hidden) tensor."""
    return _NO_H0 if t is None else (t.data_ptr(), *t.stride())


def _time_major(batch_first: bool, *tensors) -> tuple:
    """Zero-copy (seq_len, batch, hidden) views: the kernels only ever see time-major strides."""
    return tuple(t.transpose(0, 1) for t in tensors) if batch_first else tensors


def _empty_contiguous(t: Tensor) -> Tensor:
    # empty_like without arguments is the cheapest allocation; it keeps t's strides,
    # so only use it when those are the contiguous ones.
    return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


def _check_device_built(t: Tensor) -> None:
    if t.device.type != "cpu":
        raise RuntimeError(
            f"qrnn has no {t.device.type} kernels in this build (build_info: {_C.build_info()}). "
            "Rebuild with them, e.g. `pip install torch-qrnn --no-binary torch-qrnn "
            "-Ccmake.define.QRNN_CUDA=ON` on a machine with nvcc, or move the tensors to the CPU."
        )


def check_forget_mult_args(f, x, h0, batch_first) -> None:
    """Raise TypeError/ValueError naming the bad argument; shared by every entry point.
    Written for the common all-good case to touch each tensor attribute once."""
    if not isinstance(f, Tensor):
        raise TypeError(f"forget_mult: f must be a torch.Tensor, got {type(f).__name__}")
    if not isinstance(x, Tensor):
        raise TypeError(f"forget_mult: x must be a torch.Tensor, got {type(x).__name__}")
    dtype, shape = f.dtype, f.shape
    if dtype not in _DTYPE_CODES:
        raise TypeError(f"forget_mult: f must be float32, float64, bfloat16 or float16, got {dtype}")
    if x.dtype is not dtype:
        raise TypeError(f"forget_mult: x must have f's dtype {dtype}, got {x.dtype}")
    if len(shape) != 3:
        layout = "(batch, seq_len, hidden)" if batch_first else "(seq_len, batch, hidden)"
        raise ValueError(f"forget_mult: f must be 3-D {layout}, got shape {tuple(shape)}")
    if x.shape != shape:
        raise ValueError(f"forget_mult: x must have f's shape {tuple(shape)}, got {tuple(x.shape)}")
    both_cpu = f.is_cpu and x.is_cpu  # cheap attribute: skips building device objects
    if not both_cpu and x.device != f.device:
        raise ValueError(f"forget_mult: x must be on f's device {f.device}, got {x.device}")
    if h0 is None:
        return
    if not isinstance(h0, Tensor):
        raise TypeError(f"forget_mult: h0 must be a torch.Tensor or None, got {type(h0).__name__}")
    expected = (shape[0], shape[2]) if batch_first else (shape[1], shape[2])
    if h0.shape != expected:
        raise ValueError(f"forget_mult: h0 must have shape (batch, hidden) = {expected}, got {tuple(h0.shape)}")
    if h0.dtype is not dtype and not (dtype in _HALF_DTYPES and h0.dtype is torch.float32):
        allowed = f"{dtype} or torch.float32" if dtype in _HALF_DTYPES else f"{dtype}"
        raise TypeError(f"forget_mult: h0 must have dtype {allowed}, got {h0.dtype}")
    if not (both_cpu and h0.is_cpu) and h0.device != f.device:
        raise ValueError(f"forget_mult: h0 must be on f's device {f.device}, got {h0.device}")


def _forward_cpu(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    out = _empty_contiguous(f)
    f, x, h = _time_major(batch_first, f, x, out)
    code = _DTYPE_CODES[f.dtype]
    _C.forget_mult_forward(
        code, *f.shape, f.data_ptr(), *f.stride(), x.data_ptr(), *x.stride(),
        *_view2(h0), code if h0 is None else _DTYPE_CODES[h0.dtype], h.data_ptr(), *h.stride(),
        torch.get_num_threads(),
    )
    return out


def _backward_cpu(grad_h, f, x, h, h0, batch_first):
    grad_f, grad_x = _empty_contiguous(f), _empty_contiguous(f)
    grad_h0 = _empty_contiguous(h0) if h0 is not None else f.new_empty(0)
    tf, tx, th, tgh, tgf, tgx = _time_major(batch_first, f, x, h, grad_h, grad_f, grad_x)
    code = _DTYPE_CODES[f.dtype]
    _C.forget_mult_backward(
        code, *tf.shape, tf.data_ptr(), *tf.stride(), tx.data_ptr(), *tx.stride(), th.data_ptr(), *th.stride(),
        *_view2(h0), code if h0 is None else _DTYPE_CODES[h0.dtype], tgh.data_ptr(), *tgh.stride(),
        tgf.data_ptr(), *tgf.stride(), tgx.data_ptr(), *tgx.stride(), *_view2(grad_h0 if h0 is not None else None),
        torch.get_num_threads(),
    )
    return grad_f, grad_x, grad_h0


# Kernels per device type; other modules (the CUDA backend) add theirs.
FORWARD_KERNELS = {"cpu": _forward_cpu}
BACKWARD_KERNELS = {"cpu": _backward_cpu}


def _kernel(table: dict, t: Tensor):
    kernel = table["cpu"] if t.is_cpu else table.get(t.device.type)
    if kernel is None:
        _check_device_built(t)
    return kernel


@torch.library.custom_op("qrnn::forget_mult", mutates_args=())
def forget_mult_op(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
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


def _nothing_to_trace() -> bool:
    """True when no compiler, torch-function mode or dispatch mode needs to see a call."""
    return not (torch.compiler.is_compiling() or torch._C._is_torch_function_mode_enabled()
                or torch._C._len_torch_dispatch_stack())


def _plain(t: Optional[Tensor], grad_enabled: bool) -> bool:
    """A plain tensor (no subclass) that autograd does not need to track, or None."""
    return t is None or (type(t) is Tensor and not (grad_enabled and t.requires_grad))


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
    grad = torch.is_grad_enabled()
    if (type(f) is Tensor and type(x) is Tensor and _plain(h0, grad) and _nothing_to_trace()
            and not (grad and (f.requires_grad or x.requires_grad))):
        # Direct call: the dispatcher and autograd machinery would cost more than the kernel.
        return _forward_cpu(f, x, h0, batch_first) if f.is_cpu else _kernel(FORWARD_KERNELS, f)(f, x, h0, batch_first)
    return forget_mult_op(f, x, h0, batch_first)
