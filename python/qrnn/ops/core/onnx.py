"""What the families' ONNX translations share: the untyped opset, the state dtype of 16-bit
data, layouts and time flips, initial states, and the walk of a call with sequences (lengths,
packed ``cu_seqlens``, reverse) over the time-major arrays, as ``qrnn.ops.core.sequences``
walks them. Imported only by the families' ``onnx`` modules, which :mod:`qrnn.onnx` loads (it
imports onnxscript; ``import qrnn`` never does)."""

from typing import Any, NamedTuple, Optional, TypeVar, Union

import onnx
from onnxscript import opset18
from onnxscript.onnx_types import DOUBLE, FLOAT

# The ops build a graph whose value types are known only when it is traced; onnxscript's
# per-op type variables cannot follow them through this module, so the opset is untyped here.
op: Any = opset18

# The recurrence runs in float32 or float64 (16-bit inputs are widened first, like the kernels).
TState = TypeVar("TState", bound=Union[FLOAT, DOUBLE])

_FLOAT = 1  # onnx.TensorProto.FLOAT
_INT64 = 7
_ZERO_INT64 = onnx.helper.make_tensor("zero", _INT64, [1], [0])
_DOUBLE = 11
_HALF_TYPES = (10, 16)  # FLOAT16, BFLOAT16


def dtype_code(value) -> int:
    dtype = value.dtype
    return int(getattr(dtype, "value", dtype))


def state_code(code: int) -> int:
    return _FLOAT if code in _HALF_TYPES or code not in (_FLOAT, _DOUBLE) else code


def axes(*axes: int):
    return op.Constant(value_ints=list(axes))


def zeros_like_step(t, code: int):
    """Zeros of shape (batch, hidden) from a time-major (seq_len, batch, hidden) value."""
    shape = op.Shape(t, start=1, end=3)
    return op.Cast(op.ConstantOfShape(shape), to=code)


def zeros_like_steps(t, code: int):
    """Zeros of a time-major value's shape."""
    return op.Cast(op.ConstantOfShape(op.Shape(t)), to=code)


def time_major(t, batch_first: bool):
    return op.Transpose(t, perm=[1, 0, 2]) if batch_first else t


def flip_time(t):
    return op.Slice(t, axes(-1), axes(-(2 ** 63)), axes(0), axes(-1))


def initial_state(h0, like, code: int):
    return zeros_like_step(like, code) if h0 is None else op.Cast(h0, to=code)


def _steps(like):
    """0 .. seq_len - 1 of a time-major value, (T,) int64."""
    seq_len = op.Squeeze(op.Shape(like, start=0, end=1), axes(0))
    return op.Range(op.Constant(value_int=0), seq_len, op.Constant(value_int=1))


class Walk(NamedTuple):
    """How a call with sequences walks time-major (T, rows, H) values; None: nothing to do.

    valid: (T, rows, 1), the real steps (``lengths``); padding is held still, then zeroed.
    order: (T, rows, H), the step each walked position reads (each sequence mirrored within
        itself when reversed: an involution, so the same gather puts the states back).
    flip: reversed dense rows (no lengths): the whole time axis mirrored.
    start: (T, 1, 1), packed: a sequence's first walked step, where its own initial state
        ``init`` (T, 1, H; None: zeros) replaces the carried one.
    """
    valid: Any = None
    order: Any = None
    flip: bool = False
    start: Any = None
    init: Any = None

    def gather(self, value):
        """``value`` in walked order."""
        if self.flip:
            return flip_time(value)
        return value if self.order is None else op.GatherElements(value, self.order, axis=0)

    def restore(self, states, code: int):
        """Walked states back in the arrays' order, zero on padding steps."""
        states = self.gather(states)
        if self.valid is not None:
            states = op.Where(self.valid, states, op.Cast(op.Constant(value_float=0.0), to=code))
        return states


def walk(like, h0, lengths, cu_seqlens, reverse: bool) -> Walk:
    """The :class:`Walk` of a call on ``like`` (time-major); ``h0`` is the (sequences, hidden)
    initial state in the state dtype, or None."""
    if lengths is None and cu_seqlens is None:
        return Walk(flip=reverse)
    steps = _steps(like)
    t = op.Unsqueeze(steps, axes(1))  # (T, 1)
    if lengths is not None:
        lengths = op.Unsqueeze(op.Cast(lengths, to=_INT64), axes(0))  # (1, B)
        valid = op.Less(t, lengths)  # (T, B)
        index = op.Where(valid, op.Sub(op.Sub(lengths, op.Constant(value_int=1)), t), t) if reverse else None
        order = None if index is None else op.Expand(op.Unsqueeze(index, axes(2)), op.Shape(like))
        return Walk(valid=op.Unsqueeze(valid, axes(2)), order=order)
    offsets = op.Cast(cu_seqlens, to=_INT64)
    ends = op.Slice(offsets, axes(1), axes(2 ** 62), axes(0))  # (N,)
    # The sequence of each step, as qrnn.ops.core.sequences.sequence_of_steps counts it.
    inner = op.Slice(offsets, axes(1), axes(-1), axes(0))
    marks = op.ScatterElements(op.ConstantOfShape(op.Add(op.Shape(like, start=0, end=1), axes(1)),
                                                  value=_ZERO_INT64),
                               inner, op.Expand(op.Constant(value_int=1), op.Shape(inner)), axis=0, reduction="add")
    sequence = op.Slice(op.CumSum(marks, op.Constant(value_int=0)), axes(0), op.Shape(like, start=0, end=1),
                        axes(0))  # (T,)
    first = op.Gather(offsets, sequence, axis=0)
    order = None
    if reverse:  # step t of sequence n reads step first + last - t
        last = op.Sub(op.Gather(ends, sequence, axis=0), op.Constant(value_int=1))
        index = op.Sub(op.Add(first, last), steps)
        order = op.Expand(op.Unsqueeze(index, axes(1, 2)), op.Shape(like))
    init = None if h0 is None else op.Unsqueeze(op.Gather(h0, sequence, axis=0), axes(1))
    return Walk(order=order, start=op.Unsqueeze(op.Equal(steps, first), axes(1, 2)), init=init)


def packed_final_states(states, cu_seqlens, h0: Optional[Any], code: int, reverse: bool):
    """Each packed sequence's state after its last walked step, (N, H), from the time-major
    (T, 1, H) states in the arrays' order; an empty sequence keeps ``h0`` (or zeros)."""
    offsets = op.Cast(cu_seqlens, to=_INT64)
    starts = op.Slice(offsets, axes(0), axes(-1), axes(0))
    ends = op.Slice(offsets, axes(1), axes(2 ** 62), axes(0))
    rows = op.Squeeze(states, axes(1))  # (T, H)
    # One row of zeros past the end: an empty sequence's index lands there (or on -1, the same row).
    zero_row = op.Cast(op.ConstantOfShape(op.Concat(axes(1), op.Shape(rows, start=1, end=2), axis=0)), to=code)
    rows = op.Concat(rows, zero_row, axis=0)
    at = starts if reverse else op.Sub(ends, op.Constant(value_int=1))
    picked = op.Gather(rows, at, axis=0)  # (N, H)
    fallback = op.Cast(op.ConstantOfShape(op.Shape(picked)), to=code) if h0 is None else h0
    return op.Where(op.Unsqueeze(op.Greater(ends, starts), axes(1)), picked, fallback)
