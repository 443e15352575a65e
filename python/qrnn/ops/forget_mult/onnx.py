"""ForgetMult's ONNX translation: an ONNX ``Scan`` of ``h = h + f (x - h)``, and the recurrence
with lengths and reverse that the fused gates' translation runs on. Loaded by :mod:`qrnn.onnx`."""

import onnxscript

from ..core.onnx import TState, axes, dtype_code, flip_time, initial_state, op, state_code, time_major

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


def recurrence(f, x, h0, code: int, lengths, reverse: bool):
    """Every state (time-major, zero past each sequence's end when lengths are given) and the
    state after each sequence's last valid step, for f, x, h0 already in dtype ``code``."""
    valid = None
    if lengths is not None:
        seq_len = op.Squeeze(op.Shape(f, start=0, end=1), axes(0))
        steps = op.Range(op.Constant(value_int=0), seq_len, op.Constant(value_int=1))  # (T,)
        lengths = op.Cast(lengths, to=7)  # int64
        valid = op.Less(op.Unsqueeze(steps, axes(1)), op.Unsqueeze(lengths, axes(0)))  # (T, B)
    order = None
    if reverse:
        if valid is None:
            f, x = flip_time(f), flip_time(x)
        else:  # each sequence mirrored within its own length, padding in place (an involution)
            t = op.Unsqueeze(steps, axes(1))
            mirrored = op.Sub(op.Sub(op.Unsqueeze(lengths, axes(0)), op.Constant(value_int=1)), t)
            order = op.Expand(op.Unsqueeze(op.Where(valid, mirrored, t), axes(2)), op.Shape(f))
            f, x = op.GatherElements(f, order, axis=0), op.GatherElements(x, order, axis=0)
    if valid is not None:  # f = 0 past the end: the state holds still, so the last one is c_n
        f = op.Where(op.Unsqueeze(valid, axes(2)), f, op.Cast(op.Constant(value_float=0.0), to=code))
    h_last, h_all = forget_mult_scan(f, x, h0)
    if reverse:
        h_all = flip_time(h_all) if order is None else op.GatherElements(h_all, order, axis=0)
    if valid is not None:
        h_all = op.Where(op.Unsqueeze(valid, axes(2)), h_all, op.Cast(op.Constant(value_float=0.0), to=code))
    return h_all, h_last


def forget_mult(f, x, h0=None, batch_first: bool = False):
    """ONNX translation of ``qrnn::forget_mult``: every state h."""
    data_code = dtype_code(f)
    code = state_code(data_code)
    f32 = op.Cast(time_major(f, batch_first), to=code)
    x32 = op.Cast(time_major(x, batch_first), to=code)
    h_all, _ = recurrence(f32, x32, initial_state(h0, f32, code), code, None, False)
    return time_major(op.Cast(h_all, to=data_code), batch_first)


# {op name: translation} of the family's forward op (its backward is never translated).
TRANSLATIONS = {"forget_mult": forget_mult}
