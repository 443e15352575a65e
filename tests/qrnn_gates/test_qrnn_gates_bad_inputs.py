"""Bad-input sweep of qrnn.qrnn_gates and its ops: wrong types, shapes, dtypes, devices, meta
tensors, negative-bit views, NaN/Inf values and empty tensors. Each call must raise a
TypeError or ValueError naming the argument, or propagate the values correctly; never
crash or hang.
"""

import pytest
import torch

from qrnn import qrnn_gates
from qrnn.ops.qrnn_gates.reference import qrnn_gates_reference

G_T, G_B, G_H = 3, 2, 4


def gate_inputs(dtype=torch.float32):
    return torch.randn(G_T, G_B, 3 * G_H, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("call, error, match", [
    (lambda: qrnn_gates([1.0]), TypeError, "gates must be a torch.Tensor"),
    (lambda: qrnn_gates(torch.ones(G_T, G_B, 3 * G_H, dtype=torch.int32)), TypeError, "int32"),
    (lambda: qrnn_gates(torch.ones(G_T, G_B, 3 * G_H, dtype=torch.complex64)), TypeError, "complex64"),
    (lambda: qrnn_gates(torch.ones(G_T, G_B, 3 * G_H, dtype=torch.bool)), TypeError, "bool"),
    (lambda: qrnn_gates(torch.rand(G_T, 3 * G_H)), ValueError, "3-D"),
    (lambda: qrnn_gates(torch.rand(G_T, G_B, 3 * G_H + 1)), ValueError, "multiple of 3"),
    (lambda: qrnn_gates(torch.rand(G_T, G_B, 2 * G_H + 1), output_gate=False), ValueError, "multiple of 2"),
    (lambda: qrnn_gates(gate_inputs().to_sparse()), TypeError, "dense"),
    (lambda: qrnn_gates(gate_inputs(), "c0"), TypeError, "c0 must be"),
    (lambda: qrnn_gates(gate_inputs(), torch.rand(G_B, G_H + 1)), ValueError, "c0 must have shape"),
    (lambda: qrnn_gates(gate_inputs(), torch.rand(G_B, G_H, dtype=torch.float64)), TypeError, "c0 must have dtype"),
    (lambda: qrnn_gates(gate_inputs(), torch.rand(G_B, G_H, device="meta")), ValueError, "device"),
    (lambda: qrnn_gates(gate_inputs(), forget_mask=torch.ones(G_T, G_B, G_H + 1)), ValueError, "forget_mask"),
    (lambda: qrnn_gates(gate_inputs(), forget_mask=torch.ones(G_T, G_B, G_H, dtype=torch.int64)), TypeError,
     "forget_mask"),
    (lambda: qrnn_gates(gate_inputs(), forget_scale=float("nan")), ValueError, "forget_scale"),
    (lambda: qrnn_gates(gate_inputs(), forget_scale=1.5), ValueError, "forget_scale"),
    (lambda: qrnn_gates(gate_inputs(), forget_scale=torch.tensor(0.5)), ValueError, "forget_scale"),
    (lambda: qrnn_gates(gate_inputs(), lengths=[1, 1]), TypeError, "lengths must be a torch.Tensor"),
    (lambda: qrnn_gates(gate_inputs(), lengths=torch.tensor([1.0, 1.0])), TypeError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), lengths=torch.tensor([G_T + 1, 1])), ValueError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), lengths=torch.tensor([-1, 1])), ValueError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), lengths=torch.tensor([1, 1, 1])), ValueError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), batch_first="yes"), TypeError, "batch_first"),
    (lambda: qrnn_gates(gate_inputs(), output_gate=1), TypeError, "output_gate"),
    (lambda: qrnn_gates(gate_inputs(), reverse=None), TypeError, "reverse"),
    # The registered ops check on their own: a smaller c0 / mask / gradient is never read out of bounds.
    (lambda: torch.ops.qrnn.qrnn_gates(torch.rand(30, 30, 90), torch.rand(1, 1), None, None, 1.0, True, False,
                                       False), ValueError, "c0"),
    (lambda: torch.ops.qrnn.qrnn_gates(torch.rand(30, 30, 90), None, torch.rand(1, 1, 1), None, 1.0, True, False,
                                       False), ValueError, "forget_mask"),
    (lambda: torch.ops.qrnn.qrnn_gates_backward(torch.rand(1, 1, 1), None, torch.rand(30, 30, 90),
                                                torch.rand(30, 30, 30), None, None, None, 1.0, True, False, False),
     ValueError, "grad_output"),
    (lambda: torch.ops.qrnn.qrnn_gates_backward(torch.rand(30, 30, 30), None, torch.rand(30, 30, 90),
                                                torch.rand(1, 1, 1), None, None, None, 1.0, True, False, False),
     ValueError, "states"),
    (lambda: torch.ops.qrnn.qrnn_gates_backward(None, torch.rand(1, 1), torch.rand(30, 30, 90),
                                                torch.rand(30, 30, 30), None, None, None, 1.0, True, False, False),
     ValueError, "grad_c_n"),
], ids=lambda v: None)
def test_qrnn_gates_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_qrnn_gates_meta_negative_bit_nan_and_empty():
    # meta: shape propagation, with and without autograd
    for requires_grad in (False, True):
        out, c_n = qrnn_gates(torch.empty(G_T, G_B, 3 * G_H, device="meta", requires_grad=requires_grad))
        assert out.device.type == "meta" and out.shape == (G_T, G_B, G_H) and c_n.shape == (G_B, G_H)
    # a negative-bit view is read as its values
    gates = torch.randn(G_T, G_B, 3 * G_H, dtype=torch.complex128).conj().imag
    assert gates.is_neg()
    torch.testing.assert_close(qrnn_gates(gates)[0], qrnn_gates_reference(gates.resolve_neg())[0])
    # NaN and Inf propagate as in the reference
    gates = gate_inputs(torch.float64)
    gates[0, 0, 0], gates[1, 1, G_H] = float("nan"), float("inf")
    out, c_n = qrnn_gates(gates)
    ref_out, ref_cn = qrnn_gates_reference(gates)
    torch.testing.assert_close(out, ref_out, equal_nan=True)
    torch.testing.assert_close(c_n, ref_cn, equal_nan=True)
    assert out[:, 0, 0].isnan().all()
    # empty: zero steps keep c0, zero batch or hidden give empty results
    c0 = torch.randn(G_B, G_H)
    out, c_n = qrnn_gates(torch.rand(0, G_B, 3 * G_H), c0)
    assert out.shape == (0, G_B, G_H) and torch.equal(c_n, c0)
    for shape in ((G_T, 0, 3 * G_H), (G_T, G_B, 0)):
        gates = torch.rand(shape, requires_grad=True)
        out, c_n = qrnn_gates(gates)
        (out.sum() + c_n.sum()).backward()
        assert gates.grad.shape == shape
