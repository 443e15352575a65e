"""linear_scan's ONNX translation: an ONNX ``Scan`` of ``h = a h + b``, reversed by flipping
time around it. Loaded by :mod:`qrnn.onnx`."""

import onnxscript

from ..core.onnx import TState, dtype_code, flip_time, initial_state, op, state_code, time_major

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


def linear_scan(a, b, h0=None, reverse: bool = False, batch_first: bool = False):
    """ONNX translation of ``qrnn::linear_scan``: every state h (``a`` as given, never ``1 - a``,
    so decays close to 1 keep their precision here too)."""
    data_code = dtype_code(a)
    code = state_code(data_code)
    a32 = op.Cast(time_major(a, batch_first), to=code)
    b32 = op.Cast(time_major(b, batch_first), to=code)
    if reverse:  # the Scan runs forwards: feed it the steps last to first, then put them back
        a32, b32 = flip_time(a32), flip_time(b32)
    _, h_all = linear_scan_scan(a32, b32, initial_state(h0, a32, code))
    if reverse:
        h_all = flip_time(h_all)
    return time_major(op.Cast(h_all, to=data_code), batch_first)


TRANSLATIONS = {"linear_scan": linear_scan}
