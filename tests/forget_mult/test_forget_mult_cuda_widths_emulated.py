"""Vector widths of the CUDA ForgetMult kernels, run on the CPU by emulation (see
test_forget_mult_cuda_emulated.py): each array gets its own access width, so a broadcast
(stride 0) or strided array is read element by element while the others keep their vector
accesses, and every vector access must be aligned to its size, as a
GPU requires (the emulator checks). Needs a CUDA build of qrnn (for the plans), the CUDA
headers and a C++ compiler.
"""

from __future__ import annotations

import pytest
import torch
from test_forget_mult_cuda_emulated import run_and_check

from conftest import CPU_DTYPES, dtype_id, needs_cuda_build
from cuda_cases import make_inputs, poisoned_like, widest_pack
from qrnn.ops.forget_mult import kernels as forget_mult_kernels

pytestmark = needs_cuda_build


# ---- Alignment of every vector access -------------------------------------------------


def test_misaligned_vector_load_fails(emulator, capfd):
    """A plan of 16-byte packs forced onto inputs one element off alignment: x86 would
    read them happily, a GPU faults, and so does the emulator."""
    f, x, h0 = make_inputs(9, 2, 40, torch.float16, layout="offset")
    h = poisoned_like(f)[0]
    args = forget_mult_kernels.forward_args(h, f, x, h0, False)
    assert emulator.status("forget_mult_forward", args, 8, 1) == 1
    assert "misaligned 16-byte vector load" in capfd.readouterr().err


def test_misaligned_vector_store_fails(emulator, capfd):
    f, x, h0 = make_inputs(9, 2, 40, torch.float16)
    h = torch.full((9, 2, 41), float("nan"), dtype=torch.float16)[..., 1:]
    args = forget_mult_kernels.forward_args(h, f, x, h0, False)
    assert emulator.status("forget_mult_forward", args, 8, 1) == 1
    assert "misaligned 16-byte vector store" in capfd.readouterr().err
    # The same arrays at the width the build picks are fine.
    emulator.forward(h, f, x, h0, False, forget_mult_kernels.forward_plan(h, f, x, h0))


# ---- Each array its own width -------------------------------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_broadcast_grad_h_keeps_the_others_vectorised(emulator, dtype, schedule):
    """h.sum().backward(): grad_h expanded with all strides 0 is read one element per pack,
    while f, x, h, grad_f and grad_x keep their packs."""
    f, x, h0 = make_inputs(45, 3, 40, dtype, h0_dtype=dtype)
    grad_h = torch.ones((), dtype=dtype).expand(f.shape)
    _, bplan = run_and_check(emulator, f, x, h0, False, schedule, grad_h=grad_h)
    want = widest_pack(dtype) if schedule == "serial" else widest_pack(dtype, 4)
    assert bplan[0] == want


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
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
        want = widest_pack(dtype) if schedule == "serial" else widest_pack(dtype, 4)
        assert fplan[0] == want and bplan[0] == want


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
def test_strided_inputs_into_aligned_outputs(emulator, dtype):
    f, x, h0 = make_inputs(29, 2, 40, dtype, h0_dtype=dtype, layout="strided_h")
    fplan, bplan = run_and_check(emulator, f, x, h0, False, "serial")
    assert fplan[0] == bplan[0] == widest_pack(dtype)


def test_only_unit_stride_arrays_set_the_width():
    """Non-unit-stride arrays set no alignment condition; a misaligned unit-stride one
    still limits every array; with no unit-stride array there is nothing to vectorise."""
    f, x, h0 = make_inputs(20, 3, 40, torch.float16, layout="strided_h")
    h = poisoned_like(f)[0]
    assert forget_mult_kernels.forward_plan(h, f, x, h0, schedule="serial") == (8, 1)
    misaligned = torch.empty(20, 3, 41, dtype=torch.float16)[..., 1:]
    assert forget_mult_kernels.forward_plan(misaligned, f, x, h0, schedule="serial") == (1, 1)
    strided_out = torch.empty(20, 3, 80, dtype=torch.float16)[..., ::2]
    assert forget_mult_kernels.forward_plan(strided_out, f, x, h0, schedule="serial") == (1, 1)
