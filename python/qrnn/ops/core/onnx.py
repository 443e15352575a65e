"""What the families' ONNX translations share: the untyped opset, the state dtype of 16-bit
data, layouts and time flips, initial states. Imported only by the families' ``onnx``
modules, which :mod:`qrnn.onnx` loads (it imports onnxscript; ``import qrnn`` never does)."""

from typing import Any, TypeVar, Union

from onnxscript import opset18
from onnxscript.onnx_types import DOUBLE, FLOAT

# The ops build a graph whose value types are known only when it is traced; onnxscript's
# per-op type variables cannot follow them through this module, so the opset is untyped here.
op: Any = opset18

# The recurrence runs in float32 or float64 (16-bit inputs are widened first, like the kernels).
TState = TypeVar("TState", bound=Union[FLOAT, DOUBLE])

_FLOAT = 1  # onnx.TensorProto.FLOAT
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


def time_major(t, batch_first: bool):
    return op.Transpose(t, perm=[1, 0, 2]) if batch_first else t


def flip_time(t):
    return op.Slice(t, axes(-1), axes(-(2 ** 63)), axes(0), axes(-1))


def initial_state(h0, like, code: int):
    return zeros_like_step(like, code) if h0 is None else op.Cast(h0, to=code)
