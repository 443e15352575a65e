"""linear_scan's ONNX translation: an ONNX ``Scan`` of ``h = a h + b``, walked as
:func:`qrnn.ops.core.onnx.walk` says for lengths, packed sequences and reverse. Loaded by
:mod:`qrnn.onnx`."""

import onnxscript
from onnxscript.onnx_types import BOOL

from ..core.onnx import TState, dtype_code, initial_state, op, state_code, time_major, walk, zeros_like_steps

__all__ = ["TRANSLATIONS", "linear_scan"]


@onnxscript.script()
def linear_scan_scan(a: TState, b: TState, h0: TState) -> tuple[TState, TState]:
    """Time-major ``h[t] = a[t] * h[t-1] + b[t]``: (last state, every state)."""
    @onnxscript.graph()
    def step(h_prev, a_t, b_t):
        h = a_t * h_prev + b_t
        h_out = op.Identity(h)
        return h, h_out

    h_last, h_all = op.Scan(h0, a, b, body=step, num_scan_inputs=2)
    return h_last, h_all


@onnxscript.script()
def linear_scan_packed_scan(a: TState, b: TState, start: BOOL, init: TState, h0: TState) -> tuple[TState, TState]:
    """:func:`linear_scan_scan` where a packed sequence's first step starts from ``init``."""
    @onnxscript.graph()
    def step(h_prev, a_t, b_t, start_t, init_t):
        h = a_t * op.Where(start_t, init_t, h_prev) + b_t
        h_out = op.Identity(h)
        return h, h_out

    h_last, h_all = op.Scan(h0, a, b, start, init, body=step, num_scan_inputs=4)
    return h_last, h_all


def linear_scan(a, b, h0=None, reverse: bool = False, batch_first: bool = False, lengths=None, cu_seqlens=None):
    """ONNX translation of ``qrnn::linear_scan``: every state h (``a`` as given, never ``1 - a``,
    so decays close to 1 keep their precision here too)."""
    data_code = dtype_code(a)
    code = state_code(data_code)
    a32 = op.Cast(time_major(a, batch_first), to=code)
    b32 = op.Cast(time_major(b, batch_first), to=code)
    h0 = None if h0 is None else op.Cast(h0, to=code)
    steps = walk(a32, h0, lengths, cu_seqlens, reverse)  # the Scan runs forwards: feed it the walked order
    a32, b32 = steps.gather(a32), steps.gather(b32)
    if steps.valid is not None:  # padding: a = 1, b = 0 (zeroed afterwards)
        a32 = op.Where(steps.valid, a32, op.Cast(op.Constant(value_float=1.0), to=code))
        b32 = op.Where(steps.valid, b32, op.Cast(op.Constant(value_float=0.0), to=code))
    if steps.start is not None:
        init = zeros_like_steps(a32, code) if steps.init is None else steps.init
        _, h_all = linear_scan_packed_scan(a32, b32, steps.start, init, initial_state(None, a32, code))
    else:
        _, h_all = linear_scan_scan(a32, b32, initial_state(h0, a32, code))
    return time_major(op.Cast(steps.restore(h_all, code), to=data_code), batch_first)


TRANSLATIONS = {"linear_scan": linear_scan}
