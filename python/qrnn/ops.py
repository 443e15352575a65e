"""PyTorch ops over the torch-free kernels in ``qrnn._C``.

``qrnn::forget_mult`` and ``qrnn::forget_mult_backward`` are ``torch.library.custom_op``s
with fake (meta) and autograd registrations, so autograd, ``torch.compile`` and
``torch.library.opcheck`` understand them. When nothing is being traced and no gradient
is needed, :func:`forget_mult` skips the dispatcher and calls the kernel directly:
the op machinery costs tens of microseconds per call, which dominates small shapes.
"""

# No `from __future__ import annotations` here: torch 2.4's custom_op reads the annotations
# of the op functions as objects and rejects strings ("unsupported type Tensor").
from typing import Optional

import torch
from torch import Tensor

from . import _C, kernel_args  # type: ignore[attr-defined]  # compiled extension, no stub: mypy looks for an attribute
from .kernel_args import DTYPE_CODES as _DTYPE_CODES
from .kernel_args import HALF_DTYPES as _HALF_DTYPES
from .kernel_args import state_dtype as _state_dtype
from .reference import forget_mult_backward_reference, forget_mult_reference

__all__ = ["forget_mult", "qrnn_gates", "qrnn_gates_unfused"]

# The argument tuples of the kernel entry points (generated from qrnn._C's definition).
_forward_args = kernel_args.forget_mult_forward
_backward_args = kernel_args.forget_mult_backward
_gates_forward_args = kernel_args.qrnn_gates_forward
_gates_backward_args = kernel_args.qrnn_gates_backward


def _empty_contiguous(t: Tensor) -> Tensor:
    # empty_like without arguments is the cheapest allocation; it keeps t's strides,
    # so only use it when those are the contiguous ones.
    return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


_STRIDED = torch.strided


def _check_dense(name: str, t: Tensor, op: str = "forget_mult") -> None:
    # Kernels read memory through data_ptr and strides: sparse and nested tensors have neither.
    if t.layout is not _STRIDED or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout)
        raise TypeError(f"{op}: {name} must be a dense (strided) tensor, got a {kind} tensor")


def check_forget_mult_args(f, x, h0, batch_first) -> None:
    """Raise TypeError/ValueError naming the bad argument; shared by every entry point.
    Written for the common all-good case to touch each tensor attribute once."""
    if not isinstance(f, Tensor):
        raise TypeError(f"forget_mult: f must be a torch.Tensor, got {type(f).__name__}")
    if not isinstance(x, Tensor):
        raise TypeError(f"forget_mult: x must be a torch.Tensor, got {type(x).__name__}")
    if f.layout is not _STRIDED or x.layout is not _STRIDED or f.is_nested or x.is_nested:
        _check_dense("f", f)  # raises, naming the argument
        _check_dense("x", x)
    if batch_first is not True and batch_first is not False:
        raise TypeError(f"forget_mult: batch_first must be a bool, got {type(batch_first).__name__}")
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
    _check_dense("h0", h0)
    expected = (shape[0], shape[2]) if batch_first else (shape[1], shape[2])
    if h0.shape != expected:
        raise ValueError(f"forget_mult: h0 must have shape (batch, hidden) = {expected}, got {tuple(h0.shape)}")
    if h0.dtype is not dtype and not (dtype in _HALF_DTYPES and h0.dtype is torch.float32):
        allowed = f"{dtype} or torch.float32" if dtype in _HALF_DTYPES else f"{dtype}"
        raise TypeError(f"forget_mult: h0 must have dtype {allowed}, got {h0.dtype}")
    if not (both_cpu and h0.is_cpu) and h0.device != f.device:
        raise ValueError(f"forget_mult: h0 must be on f's device {f.device}, got {h0.device}")


def check_forget_mult_backward_args(grad_h, f, x, h, h0, batch_first) -> None:
    """The forward checks plus grad_h and h: same shape, dtype and device as f."""
    check_forget_mult_args(f, x, h0, batch_first)
    for name, t in (("grad_h", grad_h), ("h", h)):
        if not isinstance(t, Tensor):
            raise TypeError(f"forget_mult_backward: {name} must be a torch.Tensor, got {type(t).__name__}")
        _check_dense(name, t, "forget_mult_backward")
        if t.dtype != f.dtype:
            raise TypeError(f"forget_mult_backward: {name} must have f's dtype {f.dtype}, got {t.dtype}")
        if t.shape != f.shape:
            raise ValueError(f"forget_mult_backward: {name} must have f's shape {tuple(f.shape)}, got {tuple(t.shape)}")
        if t.device != f.device:
            raise ValueError(f"forget_mult_backward: {name} must be on f's device {f.device}, got {t.device}")


def _forward_cpu(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    h = torch.empty_like(f) if f.is_contiguous() else torch.empty_like(f, memory_format=torch.contiguous_format)
    _C.forget_mult_forward(*_forward_args(h, f, x, h0, batch_first), torch.get_num_threads())
    return h


def _backward_cpu(grad_h, f, x, h, h0, batch_first):
    grad_f, grad_x = _empty_contiguous(f), _empty_contiguous(f)
    grad_h0 = _empty_contiguous(h0) if h0 is not None else None
    _C.forget_mult_backward(*_backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first),
                            torch.get_num_threads())
    return grad_f, grad_x, (grad_h0 if grad_h0 is not None else f.new_empty(0))


# Kernels per device type; other modules (the CUDA backend) add theirs.
FORWARD_KERNELS = {"cpu": _forward_cpu}
BACKWARD_KERNELS = {"cpu": _backward_cpu}


def _forward_fallback(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    """Devices without a native kernel (mps, xpu, ROCm builds, ...): the reference recurrence
    in PyTorch ops, one time step at a time, with the kernels' float32 state for 16-bit
    data. Correct anywhere torch runs, and many times slower than a kernel."""
    math = _state_dtype(f.dtype)
    h = forget_mult_reference(f.to(math), x.to(math), None if h0 is None else h0.to(math), batch_first=batch_first)
    return h.to(f.dtype).contiguous()


def _backward_fallback(grad_h, f, x, h, h0, batch_first):
    """The backward of :func:`_forward_fallback`: the reference reverse-time loop."""
    math = _state_dtype(f.dtype)
    grad_f, grad_x, grad_h0 = forget_mult_backward_reference(
        grad_h.to(math), f.to(math), x.to(math), h.to(math), None if h0 is None else h0.to(math),
        batch_first=batch_first)
    return (grad_f.to(f.dtype).contiguous(), grad_x.to(f.dtype).contiguous(),
            grad_h0.to(h0.dtype) if h0 is not None else f.new_empty(0))


def has_native_kernels(device) -> bool:
    """Whether ``device`` (a torch.device or its type name) runs qrnn's native ForgetMult
    kernels; any other device runs the slower pure-PyTorch fallback."""
    return getattr(device, "type", device) in FORWARD_KERNELS


def _kernel(table: dict, t: Tensor, fallback=None):
    kernel = table.get("cpu") if t.is_cpu else table.get(t.device.type)
    if kernel is None:
        kernel = fallback
    if kernel is None:  # only the fused-gate ops, which qrnn.qrnn_gates never calls there
        raise RuntimeError(f"qrnn has no fused gate kernel for {t.device.type} tensors: call qrnn.qrnn_gates, "
                           "which runs the unfused form on such devices")
    return kernel


@torch.library.custom_op("qrnn::forget_mult", mutates_args=())
def forget_mult_op(f: Tensor, x: Tensor, h0: Optional[Tensor], batch_first: bool) -> Tensor:
    # Checked again here: torch.ops.qrnn.forget_mult can be called directly, and the
    # kernels take shapes on trust (a smaller x would be read out of bounds).
    check_forget_mult_args(f, x, h0, batch_first)
    return _kernel(FORWARD_KERNELS, f, _forward_fallback)(f, x, h0, batch_first)


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
    return _kernel(BACKWARD_KERNELS, f, _backward_fallback)(grad_h, f, x, h, h0, batch_first)


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


_torch_function_mode = torch._C._is_torch_function_mode_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _nothing_to_trace() -> bool:
    """True when no compiler, torch-function mode or dispatch mode needs to see a call
    (forget_mult inlines the same test: a function call is a visible share of its cost)."""
    return not (torch.compiler.is_compiling() or _torch_function_mode() or _dispatch_modes())


def _plain(t: Optional[Tensor], grad_enabled: bool) -> bool:
    """A plain tensor (no subclass) that autograd does not need to track, or None."""
    return t is None or (type(t) is Tensor and not (grad_enabled and t.requires_grad))


def _any_negative_bit(a: Tensor, b: Optional[Tensor], c: Optional[Tensor]) -> bool:
    # A negative-bit view (e.g. complex.conj().imag) stores -values: the dispatcher resolves
    # it on the op path, the raw pointer of the direct path would not.
    return a.is_neg() or (b is not None and b.is_neg()) or (c is not None and c.is_neg())


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
    if (type(f) is Tensor and type(x) is Tensor
            and (h0 is None or (type(h0) is Tensor and not (grad and h0.requires_grad)))
            and not (grad and (f.requires_grad or x.requires_grad))
            and not (torch.compiler.is_compiling() or _torch_function_mode() or _dispatch_modes())
            and not (f.is_neg() or x.is_neg() or (h0 is not None and h0.is_neg()))):
        # Direct call: the dispatcher and autograd machinery would cost more than the kernel.
        if f.is_cpu:
            return _forward_cpu(f, x, h0, batch_first)
        kernel = FORWARD_KERNELS.get(f.device.type)
        if kernel is not None:  # none for meta tensors: the op's fake impl serves them
            return kernel(f, x, h0, batch_first)
    return forget_mult_op(f, x, h0, batch_first)


# =====================================================================================
# Fused QRNN gates (layers): activations + ForgetMult + output gate in one kernel.
# =====================================================================================
#
# ``qrnn::qrnn_gates`` reads the gate pre-activations G = (Z | F | O) that a QRNN
# layer's single GEMM produced, in place through strides, and writes the layer output
# and final state in one pass; its backward recomputes the activations and writes
# grad G in G's own (time, batch, gates) form, the layout the GEMM backward reads.
# Devices without a fused kernel use :func:`qrnn_gates_unfused` (PyTorch activations +
# ``qrnn.forget_mult``), which is also the reference the fused kernel is tested against.


def _gate_count(output_gate: bool) -> int:
    return 3 if output_gate else 2


def check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first) -> int:
    """Raise TypeError/ValueError naming the bad argument; returns the hidden size."""
    if not isinstance(gates, Tensor):
        raise TypeError(f"qrnn_gates: gates must be a torch.Tensor, got {type(gates).__name__}")
    _check_dense("gates", gates, "qrnn_gates")
    for name, flag in (("output_gate", output_gate), ("batch_first", batch_first)):
        if flag is not True and flag is not False:
            raise TypeError(f"qrnn_gates: {name} must be a bool, got {type(flag).__name__}")
    if gates.dtype not in _DTYPE_CODES:
        raise TypeError(f"qrnn_gates: gates must be float32, float64, bfloat16 or float16, got {gates.dtype}")
    layout = "(batch, seq_len, gates * hidden)" if batch_first else "(seq_len, batch, gates * hidden)"
    n_gates = _gate_count(output_gate)
    if gates.dim() != 3 or gates.shape[-1] % n_gates != 0:
        raise ValueError(
            f"qrnn_gates: gates must be 3-D {layout} with the last size a multiple of {n_gates} "
            f"({'Z, F, O' if output_gate else 'Z, F'} blocks), got shape {tuple(gates.shape)}"
        )
    hidden = gates.shape[-1] // n_gates
    batch = gates.shape[0] if batch_first else gates.shape[1]
    out_shape = tuple(gates.shape[:-1]) + (hidden,)
    if c0 is not None:
        if not isinstance(c0, Tensor):
            raise TypeError(f"qrnn_gates: c0 must be a torch.Tensor or None, got {type(c0).__name__}")
        _check_dense("c0", c0, "qrnn_gates")
        if tuple(c0.shape) != (batch, hidden):
            raise ValueError(f"qrnn_gates: c0 must have shape (batch, hidden) = {(batch, hidden)}, "
                             f"got {tuple(c0.shape)}")
        if c0.dtype != gates.dtype and not (gates.dtype in _HALF_DTYPES and c0.dtype == torch.float32):
            allowed = f"{gates.dtype} or torch.float32" if gates.dtype in _HALF_DTYPES else f"{gates.dtype}"
            raise TypeError(f"qrnn_gates: c0 must have dtype {allowed}, got {c0.dtype}")
        if c0.device != gates.device:
            raise ValueError(f"qrnn_gates: c0 must be on gates' device {gates.device}, got {c0.device}")
    if forget_mask is not None:
        if not isinstance(forget_mask, Tensor):
            raise TypeError(f"qrnn_gates: forget_mask must be a torch.Tensor or None, got {type(forget_mask).__name__}")
        _check_dense("forget_mask", forget_mask, "qrnn_gates")
        if tuple(forget_mask.shape) != out_shape:
            raise ValueError(f"qrnn_gates: forget_mask must have the output's shape {out_shape}, "
                             f"got {tuple(forget_mask.shape)}")
        if forget_mask.dtype != gates.dtype:
            raise TypeError(f"qrnn_gates: forget_mask must have gates' dtype {gates.dtype}, got {forget_mask.dtype}")
        if forget_mask.device != gates.device:
            raise ValueError(f"qrnn_gates: forget_mask must be on gates' device {gates.device}, "
                             f"got {forget_mask.device}")
    if not isinstance(forget_scale, (int, float)) or not 0.0 <= forget_scale <= 1.0:
        raise ValueError(f"qrnn_gates: forget_scale must be a number in [0, 1], got {forget_scale!r}")
    if lengths is not None:
        if not isinstance(lengths, Tensor) or lengths.dtype != torch.int64 or lengths.shape != (batch,):
            raise ValueError(f"qrnn_gates: lengths must be an int64 tensor of shape (batch,) = ({batch},), got "
                             + (f"{lengths.dtype} {tuple(lengths.shape)}" if isinstance(lengths, Tensor)
                                else type(lengths).__name__))
        _check_dense("lengths", lengths, "qrnn_gates")
        if lengths.device != gates.device:
            raise ValueError(f"qrnn_gates: lengths must be on gates' device {gates.device}, got {lengths.device}")
    return hidden


def check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                   output_gate, batch_first) -> None:
    """The forward checks plus the gradients and saved states the backward reads."""
    hidden = check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    out_shape = tuple(gates.shape[:-1]) + (hidden,)
    batch = gates.shape[0] if batch_first else gates.shape[1]
    state_dtypes = (gates.dtype, torch.float32) if gates.dtype in _HALF_DTYPES else (gates.dtype,)
    for name, t, shape, dtypes in (("grad_output", grad_output, out_shape, (gates.dtype,)),
                                   ("states", states, out_shape, (gates.dtype,)),
                                   ("grad_c_n", grad_c_n, (batch, hidden), state_dtypes)):
        if t is None and name != "states":
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"qrnn_gates_backward: {name} must be a torch.Tensor, got {type(t).__name__}")
        _check_dense(name, t, "qrnn_gates_backward")
        if tuple(t.shape) != shape:
            raise ValueError(f"qrnn_gates_backward: {name} must have shape {shape}, got {tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise TypeError(f"qrnn_gates_backward: {name} must have dtype {' or '.join(map(str, dtypes))}, "
                            f"got {t.dtype}")
        if t.device != gates.device:
            raise ValueError(f"qrnn_gates_backward: {name} must be on gates' device {gates.device}, got {t.device}")


def _gates_forward_outputs(gates, output_gate, batch_first, need_states=True) -> tuple:
    """Fresh (output, states or None, c_n) for a gates forward kernel."""
    shape = gates.shape
    hidden = shape[2] // _gate_count(output_gate)
    output = gates.new_empty((shape[0], shape[1], hidden))  # new_empty: gates' device even if the default moved
    # The backward needs every c[t]; without an output gate that is the output itself.
    states = gates.new_empty((shape[0], shape[1], hidden)) if (output_gate and need_states) else None
    c_n = gates.new_empty((shape[0] if batch_first else shape[1], hidden), dtype=_state_dtype(gates.dtype))
    return output, states, c_n


def _qrnn_gates_forward_cpu(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                            need_states=True):
    output, states, c_n = _gates_forward_outputs(gates, output_gate, batch_first, need_states)
    _C.qrnn_gates_forward(*_gates_forward_args(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale,
                                               output_gate, batch_first, reverse), torch.get_num_threads())
    return output, c_n, (states if states is not None else gates.new_empty(0))


def _qrnn_gates_backward_cpu(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                             output_gate, batch_first, reverse):
    grad_gates = _empty_contiguous(gates)
    grad_c0 = _empty_contiguous(c0) if c0 is not None else None
    _C.qrnn_gates_backward(*_gates_backward_args(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0,
                                                 forget_mask, lengths, forget_scale, output_gate, batch_first,
                                                 reverse), torch.get_num_threads())
    return grad_gates, (grad_c0 if grad_c0 is not None else gates.new_empty(0))


# Fused kernels per device type. A device listed here runs qrnn_gates fused; any other
# falls back to qrnn_gates_unfused. The CUDA backend (ops_cuda) adds its pair.
QRNN_GATES_FORWARD_KERNELS = {"cpu": _qrnn_gates_forward_cpu}
QRNN_GATES_BACKWARD_KERNELS = {"cpu": _qrnn_gates_backward_cpu}


def has_fused_qrnn_gates(device) -> bool:
    """Whether ``device`` (a torch.device or its type name) has the fused gate kernels."""
    kind = getattr(device, "type", device)
    return kind in QRNN_GATES_FORWARD_KERNELS and kind in QRNN_GATES_BACKWARD_KERNELS


@torch.library.custom_op("qrnn::qrnn_gates", mutates_args=())
def qrnn_gates_op(gates: Tensor, c0: Optional[Tensor], forget_mask: Optional[Tensor], lengths: Optional[Tensor],
                  forget_scale: float, output_gate: bool, batch_first: bool, reverse: bool
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (output, c_n, states); states (every c[t], for the backward) is an empty
    tensor without an output gate, where the output is c itself."""
    # Checked again here: the op can be called directly (torch.ops.qrnn.qrnn_gates), and
    # the kernels take shapes on trust (a smaller c0 or mask would be read out of bounds).
    check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    return _kernel(QRNN_GATES_FORWARD_KERNELS, gates)(gates, c0, forget_mask, lengths, forget_scale, output_gate,
                                                      batch_first, reverse)


@qrnn_gates_op.register_fake
def _(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse):
    hidden = gates.shape[-1] // _gate_count(output_gate)
    out_shape = tuple(gates.shape[:-1]) + (hidden,)
    batch = gates.shape[0] if batch_first else gates.shape[1]
    output = gates.new_empty(out_shape)
    states = gates.new_empty(out_shape) if output_gate else gates.new_empty(0)
    return output, gates.new_empty((batch, hidden), dtype=_state_dtype(gates.dtype)), states


@torch.library.custom_op("qrnn::qrnn_gates_backward", mutates_args=())
def qrnn_gates_backward_op(grad_output: Optional[Tensor], grad_c_n: Optional[Tensor], gates: Tensor,
                           states: Tensor, c0: Optional[Tensor], forget_mask: Optional[Tensor],
                           lengths: Optional[Tensor], forget_scale: float, output_gate: bool, batch_first: bool,
                           reverse: bool) -> tuple[Tensor, Tensor]:
    """Returns (grad_gates, grad_c0); grad_c0 is an empty tensor when c0 is None."""
    check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                   output_gate, batch_first)
    return _kernel(QRNN_GATES_BACKWARD_KERNELS, gates)(grad_output, grad_c_n, gates, states, c0, forget_mask,
                                                       lengths, forget_scale, output_gate, batch_first, reverse)


@qrnn_gates_backward_op.register_fake
def _(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate, batch_first,
      reverse):
    grad_c0 = torch.empty_like(c0, memory_format=torch.contiguous_format) if c0 is not None else gates.new_empty(0)
    return torch.empty_like(gates, memory_format=torch.contiguous_format), grad_c0


def _gates_setup_context(ctx, inputs, output):
    gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse = inputs
    out, _, states = output
    ctx.save_for_backward(gates, states if output_gate else out, c0, forget_mask, lengths)
    ctx.options = (forget_scale, output_gate, batch_first, reverse)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zeros pass


def _gates_backward(ctx, grad_output, grad_c_n, _grad_states):
    gates, states, c0, forget_mask, lengths = ctx.saved_tensors
    if grad_output is None and grad_c_n is None:
        return (None,) * 8
    grad_gates, grad_c0 = qrnn_gates_backward_op(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                                 *ctx.options)
    return grad_gates, (grad_c0 if c0 is not None else None), None, None, None, None, None, None


qrnn_gates_op.register_autograd(_gates_backward, setup_context=_gates_setup_context)


def qrnn_gates_unfused(gates: Tensor, c0: Optional[Tensor] = None, *, output_gate: bool = True,
                       forget_mask: Optional[Tensor] = None, forget_scale: float = 1.0,
                       lengths: Optional[Tensor] = None, batch_first: bool = False,
                       reverse: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`qrnn_gates` composed of PyTorch activations and ``qrnn.forget_mult``: the
    path for devices without a fused kernel, and the fused kernel's reference in tests.
    Same arguments and results (its 16-bit ``c_n`` passes through the 16-bit sequence)."""
    hidden = check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    time_dim = 1 if batch_first else 0
    T, B, H = gates.shape[time_dim], gates.shape[1 - time_dim], hidden
    z = torch.tanh(gates[..., :hidden])
    f = torch.sigmoid(gates[..., hidden:2 * hidden])
    if forget_mask is not None:
        f = f * forget_mask
    if forget_scale != 1.0:
        f = f * forget_scale
    state_dtype = _state_dtype(gates.dtype)
    c0_state = c0 if c0 is not None else gates.new_zeros((B, H), dtype=state_dtype)
    if lengths is None:
        if reverse:
            f, z = f.flip(time_dim), z.flip(time_dim)
        c = forget_mult(f, z, c0, batch_first=batch_first)
        c_n = c.select(time_dim, T - 1).to(state_dtype) if T > 0 else c0_state.to(state_dtype)
        if reverse:
            c = c.flip(time_dim)
    else:
        steps = torch.arange(T, device=gates.device).unsqueeze(1)  # (T, 1)
        valid = steps < lengths.unsqueeze(0)                       # (T, B)
        # Time index each step reads: the sequence mirrored within its own length when
        # reversed (an involution, so the same gather maps the result back), padding kept.
        order = torch.where(valid, lengths.unsqueeze(0) - 1 - steps, steps) if reverse else None

        def to_tbh(index):  # (T, B) -> gather index in the tensors' layout
            index = index.t() if batch_first else index
            return index.unsqueeze(-1).expand(*index.shape, H)

        if reverse:
            f, z = f.gather(time_dim, to_tbh(order)), z.gather(time_dim, to_tbh(order))
        c = forget_mult(f, z, c0, batch_first=batch_first)
        if T > 0:
            last = (lengths - 1).clamp(min=0).unsqueeze(0)  # (1, B): each sequence's last step
            c_last = c.gather(time_dim, to_tbh(last)).squeeze(time_dim).to(state_dtype)
            c_n = torch.where((lengths > 0).unsqueeze(1), c_last, c0_state.to(state_dtype))
        else:
            c_n = c0_state.to(state_dtype)
        if reverse:
            c = c.gather(time_dim, to_tbh(order))
        keep = valid.t() if batch_first else valid
        c = torch.where(keep.unsqueeze(-1), c, c.new_zeros(()))
    output = torch.sigmoid(gates[..., 2 * hidden:]) * c if output_gate else c
    return output, c_n


def qrnn_gates(gates: Tensor, c0: Optional[Tensor] = None, *, output_gate: bool = True,
               forget_mask: Optional[Tensor] = None, forget_scale: float = 1.0,
               lengths: Optional[Tensor] = None, batch_first: bool = False,
               reverse: bool = False) -> tuple[Tensor, Tensor]:
    """The QRNN pointwise step, fused: from gate pre-activations to the layer output.

    ``z = tanh(G_z)``, ``f = sigmoid(G_f) * forget_mask * forget_scale``,
    ``c[t] = f * z + (1 - f) * c[t-1]`` (``c[-1] = c0``), ``output = sigmoid(G_o) * c``
    (or ``c`` without an output gate).

    Args:
        gates: pre-activations ``(seq_len, batch, 3 * hidden)`` (``(batch, seq_len, ...)``
            with ``batch_first``), blocks Z, F, O in that order (Z, F without an output
            gate); float32, float64, bfloat16 or float16; any strides, read in place.
        c0: initial state ``(batch, hidden)``, gates' dtype or float32 (16-bit gates).
        output_gate: whether gates has the O block.
        forget_mask: zoneout keep mask in the output's shape and gates' dtype (0/1,
            unscaled), or None.
        forget_scale: multiplies f; ``1 - p`` for zoneout at evaluation.
        lengths: int64 ``(batch,)`` valid steps per sequence on gates' device; outputs
            past each end are zero and ``c_n`` is each sequence's state after its last
            valid step.
        batch_first: layout of gates and the output.
        reverse: run each sequence from its own last valid step back to step 0.

    Returns:
        ``(output, c_n)``: output in gates' dtype with ``hidden`` features; ``c_n``
        ``(batch, hidden)`` in float32 for 16-bit gates, gates' dtype otherwise.
        Differentiable in gates and c0; fused on devices that have the kernel (the CPU,
        and CUDA in builds with it), :func:`qrnn_gates_unfused` elsewhere.
    """
    check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    if reverse is not True and reverse is not False:
        raise TypeError(f"qrnn_gates: reverse must be a bool, got {type(reverse).__name__}")
    if not has_fused_qrnn_gates(gates.device):
        return qrnn_gates_unfused(gates, c0, output_gate=output_gate, forget_mask=forget_mask,
                                  forget_scale=forget_scale, lengths=lengths, batch_first=batch_first,
                                  reverse=reverse)
    grad = torch.is_grad_enabled()
    if (type(gates) is Tensor and not (grad and gates.requires_grad) and _plain(c0, grad)
            and _plain(forget_mask, grad) and _nothing_to_trace() and not _any_negative_bit(gates, c0, forget_mask)):
        # Nothing to differentiate or trace: call the kernel directly (and skip saving c[t]).
        output, c_n, _ = QRNN_GATES_FORWARD_KERNELS[gates.device.type](
            gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, need_states=False)
        return output, c_n
    output, c_n, _ = qrnn_gates_op(gates, c0, forget_mask, lengths, float(forget_scale), output_gate, batch_first,
                                   reverse)
    return output, c_n


# ---- CUDA kernels: ops_cuda adds its entries to the tables above when this build has them ----
from . import ops_cuda as _ops_cuda  # noqa: E402,F401
