"""ForgetMult's ONNX translation: an ONNX ``Scan`` of ``h = h + f (x - h)``, and the recurrence
with lengths, packed sequences and reverse that the fused gates' translation runs on. Loaded by
:mod:`qrnn.onnx`."""

import onnxscript
from onnxscript.onnx_types import BOOL

from ..core.onnx import (
    TState,
    dtype_code,
    initial_state,
    op,
    packed_final_states,
    state_code,
    time_major,
    walk,
    zeros_like_steps,
)

__all__ = ["TRANSLATIONS", "forget_mult", "recurrence"]


@onnxscript.script()
def forget_mult_scan(f: TState, x: TState, h0: TState) -> tuple[TState, TState]:
    """Time-major ``h[t] = h[t-1] + f[t] * (x[t] - h[t-1])``: (last state, every state)."""
    @onnxscript.graph()
    def step(h_prev, f_t, x_t):
        h = h_prev + f_t * (x_t - h_prev)
        h_out = op.Identity(h)
        return h, h_out

    h_last, h_all = op.Scan(h0, f, x, body=step, num_scan_inputs=2)
    return h_last, h_all


@onnxscript.script()
def forget_mult_packed_scan(f: TState, x: TState, start: BOOL, init: TState, h0: TState) -> tuple[TState, TState]:
    """:func:`forget_mult_scan` where a packed sequence's first step starts from ``init``."""
    @onnxscript.graph()
    def step(h_prev, f_t, x_t, start_t, init_t):
        h_in = op.Where(start_t, init_t, h_prev)
        h = h_in + f_t * (x_t - h_in)
        h_out = op.Identity(h)
        return h, h_out

    h_last, h_all = op.Scan(h0, f, x, start, init, body=step, num_scan_inputs=4)
    return h_last, h_all


def recurrence(f, x, h0, code: int, lengths, reverse: bool, cu_seqlens=None):
    """Every state (time-major, zero past each sequence's end when lengths are given) and the
    final state of each sequence (batch row, or packed sequence), for f, x and the initial
    state ``h0`` (None: zeros) already in dtype ``code``."""
    steps = walk(f, h0, lengths, cu_seqlens, reverse)
    f, x = steps.gather(f), steps.gather(x)
    if steps.valid is not None:  # f = 0 past the end: the state holds still, so the last one is final
        f = op.Where(steps.valid, f, op.Cast(op.Constant(value_float=0.0), to=code))
    if steps.start is not None:
        init = zeros_like_steps(f, code) if steps.init is None else steps.init
        _, h_all = forget_mult_packed_scan(f, x, steps.start, init, initial_state(None, f, code))
        h_all = steps.restore(h_all, code)
        return h_all, packed_final_states(h_all, cu_seqlens, h0, code, reverse)
    h_last, h_all = forget_mult_scan(f, x, initial_state(h0, f, code))
    return steps.restore(h_all, code), h_last


def forget_mult(f, x, h0=None, batch_first: bool = False, lengths=None, cu_seqlens=None, reverse: bool = False):
    """ONNX translation of ``qrnn::forget_mult``: every state h."""
    data_code = dtype_code(f)
    code = state_code(data_code)
    f32 = op.Cast(time_major(f, batch_first), to=code)
    x32 = op.Cast(time_major(x, batch_first), to=code)
    h0 = None if h0 is None else op.Cast(h0, to=code)
    h_all, _ = recurrence(f32, x32, h0, code, lengths, reverse, cu_seqlens)
    return time_major(op.Cast(h_all, to=data_code), batch_first)


# {op name: translation} of the family's forward op (its backward is never translated).
TRANSLATIONS = {"forget_mult": forget_mult}
