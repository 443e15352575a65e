"""Vector widths of the CUDA kernels, run on the CPU by emulation (see
test_forget_mult_cuda_emulated.py): each array gets its own access, so a broadcast
(stride 0) or strided array no longer drops the others to scalar accesses, and the
emulator checks that every vector access is aligned to its size, as a GPU requires.

Needs a CUDA build of qrnn (for the plans), the CUDA headers and a C++ compiler.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close_to_reference
from cuda_cases import make_inputs, poisoned_like
from qrnn import ops, ops_cuda
from test_forget_mult_cuda_emulated import run_and_check
from test_qrnn_gates import make_inputs as gates_inputs
from test_qrnn_gates_cuda_emulated import float64_reference, run_emulated

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
HALF = (torch.float16, torch.bfloat16)

pytestmark = pytest.mark.skipif(not ops_cuda.AVAILABLE, reason="qrnn was built without its CUDA kernels")


def _id(dtype):
    return str(dtype)[6:]


def _widest(dtype, pack_bytes=16):
    return max(1, pack_bytes // torch.empty(0, dtype=dtype).element_size())


# ---- Alignment of every vector access -------------------------------------------------


def test_misaligned_vector_load_fails(emulator, capfd):
    """A plan of 16-byte packs forced onto inputs one element off alignment: x86 would
    read them happily, a GPU faults, and so does the emulator."""
    f, x, h0 = make_inputs(9, 2, 40, torch.float16, layout="offset")
    h = poisoned_like(f)[0]
    args = ops._forward_args(h, f, x, h0, False)
    assert emulator.status("forget_mult_forward", args, 8, 1) == 1
    assert "misaligned 16-byte vector load" in capfd.readouterr().err


def test_misaligned_vector_store_fails(emulator, capfd):
    f, x, h0 = make_inputs(9, 2, 40, torch.float16)
    h = torch.full((9, 2, 41), float("nan"), dtype=torch.float16)[..., 1:]
    args = ops._forward_args(h, f, x, h0, False)
    assert emulator.status("forget_mult_forward", args, 8, 1) == 1
    assert "misaligned 16-byte vector store" in capfd.readouterr().err
    # The same arrays at the width the build picks are fine.
    emulator.forward(h, f, x, h0, False, ops_cuda.forward_plan(h, f, x, h0))


def test_misaligned_gate_pack_fails(emulator, capfd):
    gates, c0, _, _ = gates_inputs(5, 3, 40, torch.float16, c0=True)
    gates = torch.cat([gates.new_zeros(5, 3, 1), gates], dim=2)[..., 1:]  # one element off
    out = poisoned_like(gates.new_empty(5, 3, 40))[0]
    c_n = torch.empty(3, 40)
    args = ops._gates_forward_args(out, None, c_n, gates, c0, None, None, 1.0, True, False, False)
    assert ops_cuda.gates_forward_width(args) == 1
    assert emulator.status("qrnn_gates_forward", args, 4) == 1
    assert "misaligned 8-byte vector load" in capfd.readouterr().err


# ---- Each array its own width -------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_broadcast_grad_h_keeps_the_others_vectorised(emulator, dtype, schedule):
    """h.sum().backward(): grad_h expanded with all strides 0 is read one element per pack,
    while f, x, h, grad_f and grad_x keep their packs."""
    f, x, h0 = make_inputs(45, 3, 40, dtype, h0_dtype=dtype)
    grad_h = torch.ones((), dtype=dtype).expand(f.shape)
    _, bplan = run_and_check(emulator, f, x, h0, False, schedule, grad_h=grad_h)
    want = _widest(dtype) if schedule == "serial" else _widest(dtype, 4)
    assert bplan[0] == want


@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
@pytest.mark.parametrize("hidden", [40, 43])
def test_mixed_layouts(emulator, dtype, schedule, hidden):
    """f contiguous, x broadcast along hidden (stride 0), grad_h with hidden stride 3, h0
    transposed, outputs NaN-poisoned views: every array on its own path, with a partial
    last pack when hidden = 43."""
    T, B, H = 37, 3, hidden
    f, _, _ = make_inputs(T, B, H, dtype)
    x = torch.randn(T, B, 1, dtype=torch.float64).to(dtype).expand(T, B, H)
    h0 = torch.randn(H, B, dtype=torch.float64).to(dtype).t()
    grad_h = torch.randn(T, B, 3 * H, dtype=torch.float64).to(dtype)[..., ::3]
    fplan, bplan = run_and_check(emulator, f, x, h0, False, schedule, grad_h=grad_h)
    if hidden == 40:
        want = _widest(dtype) if schedule == "serial" else _widest(dtype, 4)
        assert fplan[0] == want and bplan[0] == want


@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
def test_strided_inputs_into_aligned_outputs(emulator, dtype):
    f, x, h0 = make_inputs(29, 2, 40, dtype, h0_dtype=dtype, layout="strided_h")
    fplan, bplan = run_and_check(emulator, f, x, h0, False, "serial")
    assert fplan[0] == bplan[0] == _widest(dtype)


def test_only_unit_stride_arrays_set_the_width():
    """Non-unit-stride arrays set no alignment condition; a misaligned unit-stride one
    still limits every array; with no unit-stride array there is nothing to vectorise."""
    f, x, h0 = make_inputs(20, 3, 40, torch.float16, layout="strided_h")
    h = poisoned_like(f)[0]
    assert ops_cuda.forward_plan(h, f, x, h0, schedule="serial") == (8, 1)
    misaligned = torch.empty(20, 3, 41, dtype=torch.float16)[..., 1:]
    assert ops_cuda.forward_plan(misaligned, f, x, h0, schedule="serial") == (1, 1)
    strided_out = torch.empty(20, 3, 80, dtype=torch.float16)[..., ::2]
    assert ops_cuda.forward_plan(strided_out, f, x, h0, schedule="serial") == (1, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
def test_gates_broadcast_grad_output_keeps_the_others_vectorised(emulator, dtype):
    """output.sum().backward() on the fused gates: grad_output all strides 0."""
    T, B, H = 7, 3, 40
    gates, c0, mask, lens = gates_inputs(T, B, H, dtype, mask=True, c0=True, lengths=True)
    grad_out = torch.ones((), dtype=dtype).expand(T, B, H)
    grad_cn = torch.randn(B, H).to(ops._state_dtype(dtype))
    got = run_emulated(emulator, gates, c0, mask, lens, grad_out, grad_cn)
    assert got[4][1] == _widest(dtype, 8)
    want = float64_reference(gates, c0, mask, lens, grad_out, grad_cn, forget_scale=0.85)
    for name, g, w in zip(("output", "c_n", "grad_gates", "grad_c0"), got[:4], want):
        assert_close_to_reference(g, w, dtype, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=_id)
def test_gates_strided_mask(emulator, dtype):
    """A forget mask with hidden stride 2 next to aligned gates and outputs."""
    T, B, H = 9, 2, 40
    gates, c0, _, _ = gates_inputs(T, B, H, dtype, c0=True)
    mask = (torch.rand(T, B, 2 * H) > 0.3).to(dtype)[..., ::2]
    grad_out = torch.randn(T, B, H).to(dtype)
    grad_cn = torch.randn(B, H).to(ops._state_dtype(dtype))
    got = run_emulated(emulator, gates, c0, mask, None, grad_out, grad_cn)
    assert got[4] == (_widest(dtype, 8), _widest(dtype, 8))
    want = float64_reference(gates, c0, mask, None, grad_out, grad_cn, forget_scale=0.85)
    for name, g, w in zip(("output", "c_n", "grad_gates", "grad_c0"), got[:4], want):
        assert_close_to_reference(g, w, dtype, name)
