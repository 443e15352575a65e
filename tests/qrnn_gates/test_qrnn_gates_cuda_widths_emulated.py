"""Vector widths of the CUDA fused gate kernels, emulated on the CPU as in
test_qrnn_gates_cuda_emulated.py: each array (gates, mask, outputs, gradients) gets its own
access width, and a misaligned pack faults as it would on a GPU."""

from __future__ import annotations

import pytest
import torch
from test_qrnn_gates_cuda_emulated import float64_reference, run_emulated

from conftest import CPU_DTYPES, assert_close_to_reference, dtype_id, needs_cuda_build
from cuda_cases import poisoned_like, widest_pack
from qrnn.ops.core import kernel_args
from qrnn.ops.qrnn_gates import kernels as gate_kernels
from qrnn_gates_cases import make_inputs as gates_inputs

pytestmark = needs_cuda_build


def test_misaligned_gate_pack_fails(emulator, capfd):
    gates, c0, _, _ = gates_inputs(5, 3, 40, torch.float16, c0=True)
    gates = torch.cat([gates.new_zeros(5, 3, 1), gates], dim=2)[..., 1:]  # one element off
    out = poisoned_like(gates.new_empty(5, 3, 40))[0]
    c_n = torch.empty(3, 40)
    args = gate_kernels.forward_args(out, None, c_n, gates, c0, None, None, 1.0, True, False, False)
    assert gate_kernels.forward_width(args) == 1
    assert emulator.status("qrnn_gates_forward", args, 4) == 1
    assert "misaligned 8-byte vector load" in capfd.readouterr().err


# ---- Each array its own width -------------------------------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
def test_gates_broadcast_grad_output_keeps_the_others_vectorised(emulator, dtype):
    """output.sum().backward() on the fused gates: grad_output all strides 0."""
    T, B, H = 7, 3, 40
    gates, c0, mask, lens = gates_inputs(T, B, H, dtype, mask=True, c0=True, lengths=True)
    grad_out = torch.ones((), dtype=dtype).expand(T, B, H)
    grad_cn = torch.randn(B, H).to(kernel_args.state_dtype(dtype))
    got = run_emulated(emulator, gates, c0, mask, lens, grad_out, grad_cn)
    assert got[4][1] == widest_pack(dtype, 8)
    want = float64_reference(gates, c0, mask, lens, grad_out, grad_cn, forget_scale=0.85)
    for name, g, w in zip(("output", "c_n", "grad_gates", "grad_c0"), got[:4], want):
        assert_close_to_reference(g, w, dtype, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
def test_gates_strided_mask(emulator, dtype):
    """A forget mask with hidden stride 2 next to aligned gates and outputs."""
    T, B, H = 9, 2, 40
    gates, c0, _, _ = gates_inputs(T, B, H, dtype, c0=True)
    mask = (torch.rand(T, B, 2 * H) > 0.3).to(dtype)[..., ::2]
    grad_out = torch.randn(T, B, H).to(dtype)
    grad_cn = torch.randn(B, H).to(kernel_args.state_dtype(dtype))
    got = run_emulated(emulator, gates, c0, mask, None, grad_out, grad_cn)
    assert got[4] == (widest_pack(dtype, 8), widest_pack(dtype, 8))
    want = float64_reference(gates, c0, mask, None, grad_out, grad_cn, forget_scale=0.85)
    for name, g, w in zip(("output", "c_n", "grad_gates", "grad_c0"), got[:4], want):
        assert_close_to_reference(g, w, dtype, name)
