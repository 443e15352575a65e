"""The CUDA ForgetMult kernels, run on the CPU by emulation: no GPU needed.

tests/cuda_emulation/emulate_kernels.cpp (built by the ``emulator`` fixture of conftest.py)
compiles cuda/forget_mult/kernels.cuh with the host C++ compiler against the CUDA headers and
runs a grid block by block (each thread of a chunked block a fiber, __syncthreads a
barrier). These tests drive it with the launch plans the real build picks
(qrnn.ops.forget_mult.kernels.forward_plan / backward_plan) and with every plan the kernels have, on
strided, unaligned and odd-sized inputs, NaN-poisoned outputs inside wider buffers, and
compare with the float64 reference. The GPU tests (test_forget_mult_cuda.py) run the same
kernels for real.

Needs a CUDA build of qrnn (for the plans), the CUDA headers (CUDA_HOME, or nvcc on PATH)
and a C++20 compiler; skipped otherwise.
"""

from __future__ import annotations

import pytest
import torch

from conftest import reference_grads
from cuda_cases import (
    EXPECTED_WIDTHS,
    HALF,
    assert_schedule_taken,
    assert_untouched_outside,
    assert_written,
    compiled_widths,
    expanded,
    forward_reference,
    h0_cases,
    make_inputs,
    poisoned_grads,
    poisoned_like,
    random_grad,
)
from qrnn.ops.core import cuda as cuda_backend
from qrnn.ops.forget_mult import kernels as forget_mult_kernels

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]

pytestmark = pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels")


def run_and_check(emulator, f, x, h0, batch_first, schedule="auto", plan=None, check_backward=True,
                  grad_h=None):
    """Forward then backward through the emulated kernels into NaN-poisoned views of wider
    buffers; compare with float64 and check nothing outside the views was written."""
    dtype = f.dtype
    h, h_buffer = poisoned_like(f)
    fplan = plan or forget_mult_kernels.forward_plan(h, f, x, h0, batch_first=batch_first, schedule=schedule)
    emulator.forward(h, f, x, h0, batch_first, fplan)
    assert_written(h, h_buffer, forward_reference(f, x, h0, batch_first), dtype, f"forward {fplan}")
    if not check_backward:
        return fplan, None
    grad_h = random_grad(f) if grad_h is None else grad_h
    (grad_f, gf_buffer), (grad_x, gx_buffer), (grad_h0, gh0_buffer) = poisoned_grads(f, h0)
    bplan = plan or forget_mult_kernels.backward_plan(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0,
                                               batch_first=batch_first, schedule=schedule)
    emulator.backward(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first, bplan)
    ref_f, ref_x, ref_h0 = reference_grads(grad_h, f, x, h, h0, batch_first)
    assert_written(grad_f, gf_buffer, ref_f, dtype, f"grad_f {bplan}")
    assert_written(grad_x, gx_buffer, ref_x, dtype, f"grad_x {bplan}")
    if h0 is not None:
        assert_written(grad_h0, gh0_buffer, ref_h0, h0.dtype if h0.dtype != torch.float32 else dtype,
                       f"grad_h0 {bplan}")
    return fplan, bplan


@pytest.mark.parametrize("dtype,h0_dtype", list(h0_cases()))
@pytest.mark.parametrize("schedule", ["auto", "serial", "chunked"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
def test_matches_float64_reference(emulator, dtype, h0_dtype, schedule, batch_first):
    f, x, h0 = make_inputs(45, 3, 40, dtype, batch_first=batch_first, h0_dtype=h0_dtype)
    assert_schedule_taken(schedule, *run_and_check(emulator, f, x, h0, batch_first, schedule))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("layout", ["contiguous", "offset", "tail", "strided_h", "strided_t", "expanded"])
@pytest.mark.parametrize("hidden", [37, 38])
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_layouts_and_odd_sizes(emulator, dtype, layout, hidden, schedule):
    f, x, h0 = make_inputs(29, 2, hidden, dtype, h0_dtype=torch.float32 if dtype in HALF else dtype, layout=layout)
    run_and_check(emulator, f, x, h0, False, schedule)


@pytest.mark.parametrize("dtype,layout,hidden,width", EXPECTED_WIDTHS)
def test_plan_vector_width(dtype, layout, hidden, width):
    f, x, h0 = make_inputs(20, 3, hidden, dtype, layout=layout)
    h = poisoned_like(f)[0]  # aligned: the inputs decide
    assert forget_mult_kernels.forward_plan(h, f, x, h0, schedule="serial") == (width, 1)
    grads = [poisoned_like(f)[0] for _ in range(3)]
    plan = forget_mult_kernels.backward_plan(grads[0], grads[1], None, grads[2], f, x, h, h0, schedule="serial")
    assert plan == (width, 1)
    # A chunk lives in registers: at most 4 bytes per pack.
    chunked_width = min(width, max(1, 4 // f.element_size()))
    assert forget_mult_kernels.forward_plan(h, f, x, h0, schedule="chunked")[0] == chunked_width
    # A misaligned output limits everything to scalar accesses.
    assert forget_mult_kernels.forward_plan(torch.empty(f.shape[:-1] + (hidden + 1,), dtype=dtype)[..., 1:], f, x, h0,
                                     schedule="serial") == (1, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_size_rule(dtype):
    """Serial when the columns alone keep enough loads in flight or the sequence is short;
    chunked (up to 16 chunks) for long sequences with few columns."""
    big = expanded(512, 64, 4096, dtype)  # the bandwidth benchmark shape (expanded: no memory)
    assert forget_mult_kernels.forward_plan(big, big, big)[1] == 1
    assert forget_mult_kernels.backward_plan(big, big, None, big, big, big, big)[1] == 1
    short = expanded(8, 1, 256, dtype)
    assert forget_mult_kernels.forward_plan(short, short, short)[1] == 1
    long_narrow = expanded(4096, 1, 256, dtype)
    assert forget_mult_kernels.forward_plan(long_narrow, long_narrow, long_narrow)[1] == 16
    assert forget_mult_kernels.backward_plan(*[long_narrow] * 2, None, *[long_narrow] * 4)[1] == 16


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("chunks", [1, 3, 16])
def test_every_compiled_kernel(emulator, dtype, chunks):
    """Each vector width the build compiles, serial and chunked (widths of at most 4 bytes),
    on contiguous aligned inputs where every width is legal."""
    elem = torch.empty(0, dtype=dtype).element_size()
    for width in compiled_widths(dtype):
        if chunks > 1 and width > max(1, 4 // elem):
            continue
        f, x, h0 = make_inputs(70, 5, 64, dtype, h0_dtype=dtype)
        run_and_check(emulator, f, x, h0, False, plan=(width, chunks))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("seq_len", [1, 7, 8, 9, 16, 17, 129])
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_sequence_lengths(emulator, dtype, seq_len, schedule):
    f, x, h0 = make_inputs(seq_len, 2, 24, dtype, h0_dtype=dtype)
    run_and_check(emulator, f, x, h0, False, schedule)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
def test_empty_sequence_writes_zero_grad_h0(emulator, dtype):
    f, x, h0 = make_inputs(0, 3, 24, dtype, h0_dtype=dtype)
    grad_h0, buffer = poisoned_like(h0)
    empty = [torch.empty(f.shape, dtype=dtype) for _ in range(4)]
    plan = forget_mult_kernels.backward_plan(empty[0], empty[1], grad_h0, empty[2], f, x, empty[3], h0)
    emulator.backward(empty[0], empty[1], grad_h0, empty[2], f, x, empty[3], h0, False, plan)
    assert (grad_h0 == 0).all()
    assert_untouched_outside(grad_h0, buffer)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_broadcast_grad_h(emulator, dtype, schedule):
    """h.sum().backward() hands the backward a grad_h with all strides 0."""
    f, x, h0 = make_inputs(40, 3, 16, dtype, h0_dtype=dtype)
    grad_h = torch.ones((), dtype=dtype).expand(f.shape)
    run_and_check(emulator, f, x, h0, False, schedule, grad_h=grad_h)
