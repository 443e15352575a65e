"""ONNX export of models holding qrnn layers (``torch.onnx.export(..., dynamo=True)``).

The exporter meets qrnn's custom ops (``qrnn::qrnn_gates``, ``qrnn::forget_mult``,
``qrnn::linear_scan``) in the graph that ``torch.export`` captures and needs a translation for each; this module gives
them, as ONNX Script functions over an ONNX ``Scan`` (the recurrence) and plain ONNX ops
(activations, masks, layouts)::

    onnx_program = torch.onnx.export(model, (x,), dynamo=True,
                                     custom_translation_table=qrnn.onnx.custom_translation_table())

or ``qrnn.onnx.export(model, (x,))``, which passes the table for you. Importing this module
also adds the translations to the exporter's own table where this torch version allows it
(:data:`registered`), so a plain ``torch.onnx.export(model, (x,))`` works too. Every option of the
forward ops is translated (initial state, lengths, reverse, batch_first, output gate,
zoneout mask and scale; 16-bit inputs compute in float32 as the kernels do). The backward
ops are not (ONNX graphs are for inference): exporting a graph that holds them raises an
error saying so. The legacy TorchScript exporter (``dynamo=False``) is not supported.

Importing this module imports onnxscript; ``import qrnn`` alone never does.
"""

from typing import Any, Callable, Optional, TypeVar, Union

import onnxscript
import torch
from onnxscript import opset18
from onnxscript.onnx_types import DOUBLE, FLOAT

from . import ops as _ops  # noqa: F401  (registers the torch.ops.qrnn ops)

# The ops build a graph whose value types are known only when it is traced; onnxscript's
# per-op type variables cannot follow them through this module, so the opset is untyped here.
op: Any = opset18

__all__ = ["custom_translation_table", "export", "registered"]

# The recurrence runs in float32 or float64 (16-bit gates are widened first, like the kernels).
_TState = TypeVar("_TState", bound=Union[FLOAT, DOUBLE])

_FLOAT = 1  # onnx.TensorProto.FLOAT
_DOUBLE = 11
_HALF_TYPES = (10, 16)  # FLOAT16, BFLOAT16


@onnxscript.script()
def _forget_mult_scan(f: _TState, x: _TState, h0: _TState) -> tuple[_TState, _TState]:
    """Time-major ``h[t] = h[t-1] + f[t] * (x[t] - h[t-1])``: (last state, every state)."""
    @onnxscript.graph()
    def step(h_prev, f_t, x_t):
        h = h_prev + f_t * (x_t - h_prev)
        h_out = op.Identity(h)
        return h, h_out

    h_last, h_all = op.Scan(h0, f, x, body=step, num_scan_inputs=2)
    return h_last, h_all


@onnxscript.script()
def _linear_scan_scan(a: _TState, b: _TState, h0: _TState) -> tuple[_TState, _TState]:
    """Time-major ``h[t] = a[t] * h[t-1] + b[t]``: (last state, every state)."""
    @onnxscript.graph()
    def step(h_prev, a_t, b_t):
        h = a_t * h_prev + b_t
        h_out = op.Identity(h)
        return h, h_out

    h_last, h_all = op.Scan(h0, a, b, body=step, num_scan_inputs=2)
    return h_last, h_all


def _dtype_code(value) -> int:
    dtype = value.dtype
    return int(getattr(dtype, "value", dtype))


def _state_code(code: int) -> int:
    return _FLOAT if code in _HALF_TYPES or code not in (_FLOAT, _DOUBLE) else code


def _axes(*axes: int):
    return op.Constant(value_ints=list(axes))


def _zeros_like_step(t, code: int):
    """Zeros of shape (batch, hidden) from a time-major (seq_len, batch, hidden) value."""
    shape = op.Shape(t, start=1, end=3)
    return op.Cast(op.ConstantOfShape(shape), to=code)


def _time_major(t, batch_first: bool):
    return op.Transpose(t, perm=[1, 0, 2]) if batch_first else t


def _flip_time(t):
    return op.Slice(t, _axes(-1), _axes(-(2 ** 63)), _axes(0), _axes(-1))


def _recurrence(f, x, h0, code: int, lengths, reverse: bool):
    """Every state (time-major, zero past each sequence's end when lengths are given) and the
    state after each sequence's last valid step, for f, x, h0 already in dtype ``code``."""
    valid = None
    if lengths is not None:
        seq_len = op.Squeeze(op.Shape(f, start=0, end=1), _axes(0))
        steps = op.Range(op.Constant(value_int=0), seq_len, op.Constant(value_int=1))  # (T,)
        lengths = op.Cast(lengths, to=7)  # int64
        valid = op.Less(op.Unsqueeze(steps, _axes(1)), op.Unsqueeze(lengths, _axes(0)))  # (T, B)
    order = None
    if reverse:
        if valid is None:
            f, x = _flip_time(f), _flip_time(x)
        else:  # each sequence mirrored within its own length, padding in place (an involution)
            t = op.Unsqueeze(steps, _axes(1))
            mirrored = op.Sub(op.Sub(op.Unsqueeze(lengths, _axes(0)), op.Constant(value_int=1)), t)
            order = op.Expand(op.Unsqueeze(op.Where(valid, mirrored, t), _axes(2)), op.Shape(f))
            f, x = op.GatherElements(f, order, axis=0), op.GatherElements(x, order, axis=0)
    if valid is not None:  # f = 0 past the end: the state holds still, so the last one is c_n
        f = op.Where(op.Unsqueeze(valid, _axes(2)), f, op.Cast(op.Constant(value_float=0.0), to=code))
    h_last, h_all = _forget_mult_scan(f, x, h0)
    if reverse:
        h_all = _flip_time(h_all) if order is None else op.GatherElements(h_all, order, axis=0)
    if valid is not None:
        h_all = op.Where(op.Unsqueeze(valid, _axes(2)), h_all, op.Cast(op.Constant(value_float=0.0), to=code))
    return h_all, h_last


def _initial_state(h0, like, code: int):
    return _zeros_like_step(like, code) if h0 is None else op.Cast(h0, to=code)


def qrnn_gates(gates, c0=None, forget_mask=None, lengths=None, forget_scale: float = 1.0,
               output_gate: bool = True, batch_first: bool = False, reverse: bool = False):
    """ONNX translation of ``qrnn::qrnn_gates``: (output, c_n, states)."""
    data_code = _dtype_code(gates)
    code = _state_code(data_code)
    g = op.Cast(_time_major(gates, batch_first), to=code)
    parts = op.Split(g, axis=2, num_outputs=3 if output_gate else 2)
    z, f = op.Tanh(parts[0]), op.Sigmoid(parts[1])
    if forget_mask is not None:
        f = op.Mul(f, op.Cast(_time_major(forget_mask, batch_first), to=code))
    if forget_scale != 1.0:
        f = op.Mul(f, op.Cast(op.Constant(value_float=float(forget_scale)), to=code))
    c_all, c_n = _recurrence(f, z, _initial_state(c0, f, code), code, lengths, reverse)
    output = op.Mul(op.Sigmoid(parts[2]), c_all) if output_gate else c_all
    output = _time_major(op.Cast(output, to=data_code), batch_first)
    if output_gate:
        states = _time_major(op.Cast(c_all, to=data_code), batch_first)
    else:  # the op returns an empty tensor here (the output is the state itself)
        states = op.Cast(op.ConstantOfShape(_axes(0)), to=data_code)
    return output, c_n, states


def forget_mult(f, x, h0=None, batch_first: bool = False):
    """ONNX translation of ``qrnn::forget_mult``: every state h."""
    data_code = _dtype_code(f)
    code = _state_code(data_code)
    f32 = op.Cast(_time_major(f, batch_first), to=code)
    x32 = op.Cast(_time_major(x, batch_first), to=code)
    h_all, _ = _recurrence(f32, x32, _initial_state(h0, f32, code), code, None, False)
    return _time_major(op.Cast(h_all, to=data_code), batch_first)


def linear_scan(a, b, h0=None, reverse: bool = False, batch_first: bool = False):
    """ONNX translation of ``qrnn::linear_scan``: every state h (``a`` as given, never ``1 - a``,
    so decays close to 1 keep their precision here too)."""
    data_code = _dtype_code(a)
    code = _state_code(data_code)
    a32 = op.Cast(_time_major(a, batch_first), to=code)
    b32 = op.Cast(_time_major(b, batch_first), to=code)
    if reverse:  # the Scan runs forwards: feed it the steps last to first, then put them back
        a32, b32 = _flip_time(a32), _flip_time(b32)
    _, h_all = _linear_scan_scan(a32, b32, _initial_state(h0, a32, code))
    if reverse:
        h_all = _flip_time(h_all)
    return _time_major(op.Cast(h_all, to=data_code), batch_first)


def _untranslated(name: str):
    def translation(*args, **kwargs):
        raise NotImplementedError(
            f"qrnn.onnx: {name} is not translated to ONNX: it is part of a training (backward) graph, and "
            "ONNX export of qrnn models covers inference. Export the model in eval mode without gradients.")
    translation.__name__ = name.replace("::", "_")
    return translation


def custom_translation_table() -> dict:
    """``{op: ONNX translation}`` for every qrnn op, to pass as ``torch.onnx.export(...,
    dynamo=True, custom_translation_table=...)`` (merge it with your own table if you have one)."""
    return _table()


def _table() -> dict:
    qrnn_ops = torch.ops.qrnn
    return {
        qrnn_ops.qrnn_gates.default: qrnn_gates,
        qrnn_ops.forget_mult.default: forget_mult,
        qrnn_ops.linear_scan.default: linear_scan,
        qrnn_ops.qrnn_gates_backward.default: _untranslated("qrnn::qrnn_gates_backward"),
        qrnn_ops.forget_mult_backward.default: _untranslated("qrnn::forget_mult_backward"),
        qrnn_ops.linear_scan_backward.default: _untranslated("qrnn::linear_scan_backward"),
    }


def export(model, args=(), f=None, *, custom_translation_table: Optional[dict] = None, **kwargs):
    """``torch.onnx.export(model, args, f, dynamo=True, ...)`` with qrnn's translations added
    to ``custom_translation_table`` (yours take precedence). Returns the ONNXProgram."""
    if kwargs.pop("dynamo", True) is not True:
        raise ValueError("qrnn.onnx.export uses the dynamo exporter; the TorchScript exporter (dynamo=False) "
                         "cannot translate qrnn's custom ops")
    table = {**_table(), **(custom_translation_table or {})}
    return torch.onnx.export(model, args, f, dynamo=True, custom_translation_table=table, **kwargs)


def _register_with_exporter() -> bool:
    """Add the forward translations to the table the dynamo exporter starts from, so plain
    ``torch.onnx.export(model, args)`` (e.g. an unchanged ``--onnx-export`` script) finds them.
    That table is internal to torch (checked with torch 2.13): on any mismatch nothing is
    changed and False is returned; ``custom_translation_table()`` always works."""
    try:
        from torch.onnx._internal.exporter import _registration
        from torch.onnx._internal.exporter._torchlib import _torchlib_registry
        registry = _torchlib_registry._registry
        if not isinstance(registry, list):
            return False
        _torchlib_registry.get_torchlib_ops()  # load torch's own entries first (it checks for them)
        ours: dict[Any, Callable[..., Any]] = {torch.ops.qrnn.qrnn_gates.default: qrnn_gates,
                                               torch.ops.qrnn.forget_mult.default: forget_mult,
                                               torch.ops.qrnn.linear_scan.default: linear_scan}
        present = {id(meta.onnx_function) for meta in registry}
        metas = [_registration.OnnxDecompMeta(onnx_function=fn, fx_target=target, signature=None)
                 for target, fn in ours.items() if id(fn) not in present]
    except Exception:  # a torch without this internal layout: the explicit table still works
        return False
    registry.extend(metas)
    return True


#: Whether importing this module added the translations to torch's exporter (see above).
registered = _register_with_exporter()
