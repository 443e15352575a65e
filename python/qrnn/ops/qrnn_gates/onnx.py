"""The fused gates' ONNX translation: activations, mask and scale in plain ONNX ops around
ForgetMult's recurrence. Loaded by :mod:`qrnn.onnx`."""

from ..core.onnx import axes, dtype_code, op, state_code, time_major
from ..forget_mult.onnx import recurrence

__all__ = ["TRANSLATIONS", "qrnn_gates"]


def qrnn_gates(gates, c0=None, forget_mask=None, lengths=None, forget_scale: float = 1.0,
               output_gate: bool = True, batch_first: bool = False, reverse: bool = False, cu_seqlens=None):
    """ONNX translation of ``qrnn::qrnn_gates``: (output, c_n, states)."""
    data_code = dtype_code(gates)
    code = state_code(data_code)
    g = op.Cast(time_major(gates, batch_first), to=code)
    parts = op.Split(g, axis=2, num_outputs=3 if output_gate else 2)
    z, f = op.Tanh(parts[0]), op.Sigmoid(parts[1])
    if forget_mask is not None:
        f = op.Mul(f, op.Cast(time_major(forget_mask, batch_first), to=code))
    if forget_scale != 1.0:
        f = op.Mul(f, op.Cast(op.Constant(value_float=float(forget_scale)), to=code))
    c0 = None if c0 is None else op.Cast(c0, to=code)
    c_all, c_n = recurrence(f, z, c0, code, lengths, reverse, cu_seqlens)
    output = op.Mul(op.Sigmoid(parts[2]), c_all) if output_gate else c_all
    output = time_major(op.Cast(output, to=data_code), batch_first)
    if output_gate:
        states = time_major(op.Cast(c_all, to=data_code), batch_first)
    else:  # the op returns an empty tensor here (the output is the state itself)
        states = op.Cast(op.ConstantOfShape(axes(0)), to=data_code)
    return output, c_n, states


TRANSLATIONS = {"qrnn_gates": qrnn_gates}
