"""The CUDA linear_scan kernels (h[t] = a[t] h[t-1] + b[t]), run on the CPU by emulation: no
GPU needed.

tests/cuda_emulation/emulate_kernels.cpp (built by the ``emulator`` fixture of conftest.py)
compiles cuda/linear_scan/kernels.cuh (the family's policy on the shared schedules of
cuda/common/scan.cuh) with the host C++ compiler and runs a grid block by block. These tests
drive it with the launch plans the real build picks (``_C.cuda_linear_scan_forward_plan`` /
``_backward_plan``) and with every plan the kernels have, on strided, unaligned, odd-sized
and reversed (negative time stride) views, NaN-poisoned outputs inside wider buffers, and
compare with a float64 loop.

The argument numbers are built here from ``_C.kernel_fields()`` (the manifest's field lists).
Needs a CUDA build of qrnn (for the plans), the CUDA headers and a C++20 compiler; skipped
otherwise.
"""

from __future__ import annotations

import pytest
import torch

from conftest import CPU_DTYPES, dtype_id
from cuda_cases import (
    EXPECTED_WIDTHS,
    HALF,
    assert_schedule_taken,
    assert_untouched_outside,
    assert_written,
    compiled_widths,
    expanded,
    h0_cases,
    make_inputs,
    poisoned_grads,
    poisoned_like,
    random_grad,
    widest_pack,
)
from qrnn import _C

pytestmark = pytest.mark.skipif(not hasattr(_C, "cuda_linear_scan_forward_plan"),
                                reason="qrnn was built without its CUDA kernels")

FIELDS = _C.kernel_fields()
DTYPE_CODES = {getattr(torch, name): code for name, code in _C.dtype_codes().items()}
SCHEDULES = _C.cuda_schedules() if hasattr(_C, "cuda_schedules") else {}
_WIDTHS = {"dtype": 1, "integer": 1, "flag": 1, "lengths": 1, "cview3": 4, "view3": 4, "cview2": 3, "view2": 3}


# ---- The kernels' argument numbers ------------------------------------------------------------


def view3(t, reverse=False):
    """(address, stride_t, stride_b, stride_h) of a (time, batch, hidden) tensor; `reverse`
    walks it from its last step (address of step T - 1, time stride negated), which is how a
    reversed scan reaches the kernels: no copy, no flag."""
    if t is None or t.numel() == 0:
        return (0, 0, 0, 0)
    st, sb, sh = t.stride()
    if reverse:
        return (t.data_ptr() + (t.shape[0] - 1) * st * t.element_size(), -st, sb, sh)
    return (t.data_ptr(), st, sb, sh)


def view2(t):
    return (0, 0, 0) if t is None else (t.data_ptr(), *t.stride())


# Whole rows: no lengths or packed sequences (the CUDA schedules refuse them).
WHOLE_ROWS = {"lengths": 0, "lengths_stride": 1, "cu_seqlens": 0, "reverse": 0}


def numbers(kernel, **values) -> tuple:
    """The numbers of `kernel` in _C.kernel_fields() order, each field's count checked."""
    out = []
    values = {**WHOLE_ROWS, **values}
    assert sorted(values) == sorted(name for _, name in FIELDS[kernel]), f"{kernel}: fields differ"
    for kind, name in FIELDS[kernel]:
        v = values[name]
        v = tuple(v) if isinstance(v, tuple) else (v,)
        assert len(v) == _WIDTHS[kind], f"{kernel}.{name} ({kind}): {v}"
        out += v
    return tuple(out)


def state_dtype(dtype):
    return torch.float32 if dtype in HALF else dtype


def forward_args(h, a, b, h0, reverse=False):
    T, B, H = a.shape
    return numbers("linear_scan_forward", dtype=DTYPE_CODES[a.dtype], seq_len=T, batch=B, hidden=H,
                   a=view3(a, reverse), b=view3(b, reverse), h0=view2(h0),
                   h0_dtype=DTYPE_CODES[a.dtype if h0 is None else h0.dtype], h=view3(h, reverse))


def backward_args(grad_a, grad_b, grad_h0, grad_h, a, h, h0, reverse=False):
    T, B, H = a.shape
    state = h0 if h0 is not None else grad_h0
    return numbers("linear_scan_backward", dtype=DTYPE_CODES[a.dtype], seq_len=T, batch=B, hidden=H,
                   a=view3(a, reverse), h=view3(h, reverse), h0=view2(h0),
                   h0_dtype=DTYPE_CODES[a.dtype if state is None else state.dtype], grad_h=view3(grad_h, reverse),
                   grad_a=view3(grad_a, reverse), grad_b=view3(grad_b, reverse), grad_h0=view2(grad_h0))


def forward_plan(args, schedule="auto"):
    return _C.cuda_linear_scan_forward_plan(*args, SCHEDULES[schedule])


def backward_plan(args, schedule="auto"):
    return _C.cuda_linear_scan_backward_plan(*args, SCHEDULES[schedule])


# ---- float64 references ------------------------------------------------------------------------


def _flip(t):
    return None if t is None else t.flip(0)


def reference(a, b, h0, reverse=False):
    """h[t] = a[t] h[t-1] + b[t] in float64 (from the last step when `reverse`)."""
    if reverse:
        return reference(_flip(a), _flip(b), h0).flip(0)
    a, b = a.double(), b.double()
    h = torch.zeros(a.shape[1:], dtype=torch.float64) if h0 is None else h0.double()
    out = torch.empty(a.shape, dtype=torch.float64)
    for t in range(a.shape[0]):
        h = a[t] * h + b[t]
        out[t] = h
    return out


def reference_grads(grad_h, a, h, h0, reverse=False):
    """float64 (grad_a, grad_b, grad_h0) given the stored forward output h (what the kernel
    reads for h[t-1]): g += grad_h[t]; grad_b[t] = g; grad_a[t] = h[t-1] g; g *= a[t]."""
    if reverse:
        ga, gb, gh0 = reference_grads(_flip(grad_h), _flip(a), _flip(h), h0)
        return ga.flip(0), gb.flip(0), gh0
    grad_h, a, h = grad_h.double(), a.double(), h.double()
    T = a.shape[0]
    g = torch.zeros(a.shape[1:], dtype=torch.float64)
    grad_a, grad_b = torch.empty(a.shape, dtype=torch.float64), torch.empty(a.shape, dtype=torch.float64)
    for t in range(T - 1, -1, -1):
        g = g + grad_h[t]
        grad_b[t] = g
        prev = h[t - 1] if t >= 1 else (torch.zeros_like(g) if h0 is None else h0.double())
        grad_a[t] = prev * g
        g = a[t] * g
    return grad_a, grad_b, g


# ---- Inputs --------------------------------------------------------------------------------------


def scan_inputs(T, B, H, dtype, h0_dtype=None, layout="contiguous"):
    """a in (0.01, 0.99) (decays), b normal, h0 normal in h0_dtype; layouts as
    cuda_cases.make_inputs, plus `batch_first`: time-major views of (batch, time, hidden)
    tensors."""
    if layout == "batch_first":
        a, b, h0 = make_inputs(T, B, H, dtype, batch_first=True, h0_dtype=h0_dtype)
        return a.transpose(0, 1), b.transpose(0, 1), h0
    return make_inputs(T, B, H, dtype, h0_dtype=h0_dtype, layout=layout)


def run_and_check(emulator, a, b, h0, schedule="auto", plan=None, reverse=False, grad_h=None, grad_h0_dtype=None):
    """Forward then backward through the emulated kernels into NaN-poisoned views of wider
    buffers; compare with float64 and check nothing outside the views was written.
    grad_h0 is requested when h0 is given, or in `grad_h0_dtype` without h0."""
    dtype = a.dtype
    h, h_buffer = poisoned_like(a)
    fargs = forward_args(h, a, b, h0, reverse)
    fplan = plan or forward_plan(fargs, schedule)
    emulator.run("linear_scan_forward", fargs, *fplan)
    assert_written(h, h_buffer, reference(a, b, h0, reverse), dtype, f"forward {fplan} reverse={reverse}")

    grad_h = random_grad(a) if grad_h is None else grad_h
    state = h0 if h0 is not None else (None if grad_h0_dtype is None else torch.empty(a.shape[1:], dtype=grad_h0_dtype))
    (grad_a, ga_buffer), (grad_b, gb_buffer), (grad_h0, gh0_buffer) = poisoned_grads(a, state)
    bargs = backward_args(grad_a, grad_b, grad_h0, grad_h, a, h, h0, reverse)
    bplan = plan or backward_plan(bargs, schedule)
    emulator.run("linear_scan_backward", bargs, *bplan)
    ref_a, ref_b, ref_h0 = reference_grads(grad_h, a, h, h0, reverse)
    assert_written(grad_a, ga_buffer, ref_a, dtype, f"grad_a {bplan} reverse={reverse}")
    assert_written(grad_b, gb_buffer, ref_b, dtype, f"grad_b {bplan} reverse={reverse}")
    if grad_h0 is not None:
        assert_written(grad_h0, gh0_buffer, ref_h0, dtype, f"grad_h0 {bplan} reverse={reverse}")
    return fplan, bplan


# ---- Tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,h0_dtype", list(h0_cases()))
@pytest.mark.parametrize("schedule", ["auto", "serial", "chunked"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward_time", "reversed"])
def test_matches_float64_reference(emulator, dtype, h0_dtype, schedule, reverse):
    a, b, h0 = scan_inputs(45, 3, 40, dtype, h0_dtype=h0_dtype)
    assert_schedule_taken(schedule, *run_and_check(emulator, a, b, h0, schedule, reverse=reverse))


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_grad_h0_without_h0(emulator, dtype, schedule):
    """The gradient of a zero initial state: h[-1] = 0, grad_h0 still the carried gradient."""
    a, b, _ = scan_inputs(33, 2, 24, dtype)
    run_and_check(emulator, a, b, None, schedule, grad_h0_dtype=state_dtype(dtype))


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("layout", ["contiguous", "offset", "tail", "strided_h", "strided_t", "expanded",
                                    "batch_first"])
@pytest.mark.parametrize("hidden", [37, 38])
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward_time", "reversed"])
def test_layouts_and_odd_sizes(emulator, dtype, layout, hidden, schedule, reverse):
    a, b, h0 = scan_inputs(29, 2, hidden, dtype, h0_dtype=state_dtype(dtype), layout=layout)
    run_and_check(emulator, a, b, h0, schedule, reverse=reverse)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_mixed_layouts(emulator, dtype, schedule):
    """a contiguous, b broadcast along hidden (stride 0), grad_h with hidden stride 3, h0
    transposed, a partial last pack (hidden 43), reversed: every array on its own path."""
    T, B, H = 37, 3, 43
    a, _, _ = make_inputs(T, B, H, dtype)
    b = torch.randn(T, B, 1, dtype=torch.float64).to(dtype).expand(T, B, H)
    h0 = torch.randn(H, B, dtype=torch.float64).to(dtype).t()
    grad_h = torch.randn(T, B, 3 * H, dtype=torch.float64).to(dtype)[..., ::3]
    for reverse in (False, True):
        run_and_check(emulator, a, b, h0, schedule, reverse=reverse, grad_h=grad_h)


@pytest.mark.parametrize("dtype,layout,hidden,width", EXPECTED_WIDTHS)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward_time", "reversed"])
def test_plan_vector_width(dtype, layout, hidden, width, reverse):
    a, b, h0 = scan_inputs(20, 3, hidden, dtype, layout=layout)
    h = poisoned_like(a)[0]  # aligned: the inputs decide
    assert forward_plan(forward_args(h, a, b, h0, reverse), "serial") == (width, 1)
    grads = [poisoned_like(a)[0] for _ in range(3)]
    bargs = backward_args(grads[0], grads[1], None, grads[2], a, h, h0, reverse)
    assert backward_plan(bargs, "serial") == (width, 1)
    # A chunk lives in registers: at most 4 bytes per pack.
    chunked_width = min(width, max(1, 4 // a.element_size()))
    assert forward_plan(forward_args(h, a, b, h0, reverse), "chunked")[0] == chunked_width
    # A misaligned output limits everything to scalar accesses.
    misaligned = torch.empty(a.shape[:-1] + (hidden + 1,), dtype=dtype)[..., 1:]
    assert forward_plan(forward_args(misaligned, a, b, h0, reverse), "serial") == (1, 1)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
def test_size_rule(dtype):
    """ForgetMult's rule: serial when the columns keep enough loads in flight or the sequence
    is short; chunked (up to 16 chunks) for long sequences with few columns."""
    big = expanded(512, 64, 4096, dtype)
    assert forward_plan(forward_args(big, big, big, None))[1] == 1
    assert backward_plan(backward_args(big, big, None, big, big, big, None))[1] == 1
    short = expanded(8, 1, 256, dtype)
    assert forward_plan(forward_args(short, short, short, None))[1] == 1
    long_narrow = expanded(4096, 1, 256, dtype)
    assert forward_plan(forward_args(long_narrow, long_narrow, long_narrow, None))[1] == 16
    assert backward_plan(backward_args(*[long_narrow] * 2, None, *[long_narrow] * 3, None))[1] == 16


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("chunks", [1, 3, 16])
def test_every_compiled_kernel(emulator, dtype, chunks):
    """Each vector width the build compiles (the 16-bit pairs included), serial and chunked
    (widths of at most 4 bytes), on contiguous aligned inputs, in both time directions."""
    for width in compiled_widths(dtype):
        if chunks > 1 and width > widest_pack(dtype, 4):
            continue
        a, b, h0 = scan_inputs(70, 5, 64, dtype, h0_dtype=dtype)
        for reverse in (False, True):
            run_and_check(emulator, a, b, h0, plan=(width, chunks), reverse=reverse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("seq_len", [1, 2, 7, 8, 9, 16, 17, 129])
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_sequence_lengths(emulator, dtype, seq_len, schedule):
    a, b, h0 = scan_inputs(seq_len, 2, 24, dtype, h0_dtype=dtype)
    run_and_check(emulator, a, b, h0, schedule)
    run_and_check(emulator, a, b, h0, schedule, reverse=True)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
def test_empty_sequence(emulator, dtype):
    """T = 0: the forward has nothing to write; the backward still owes grad_h0 = 0."""
    a, b, h0 = scan_inputs(0, 3, 24, dtype, h0_dtype=state_dtype(dtype))
    assert forward_plan(forward_args(a, a, b, h0))[1] == 1
    grad_h0, buffer = poisoned_like(h0)
    empty = [torch.empty(a.shape, dtype=dtype) for _ in range(4)]
    args = backward_args(empty[0], empty[1], grad_h0, empty[2], a, empty[3], h0)
    plan = backward_plan(args)
    assert plan[1] == 1
    emulator.run("linear_scan_backward", args, *plan)
    assert (grad_h0 == 0).all()
    assert_untouched_outside(grad_h0, buffer)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_broadcast_grad_h(emulator, dtype, schedule):
    """h.sum().backward() hands the backward a grad_h with all strides 0; the other arrays
    keep their packs."""
    a, b, h0 = scan_inputs(40, 3, 16, dtype, h0_dtype=dtype)
    grad_h = torch.ones((), dtype=dtype).expand(a.shape)
    _, bplan = run_and_check(emulator, a, b, h0, schedule, grad_h=grad_h)
    assert bplan[0] == (widest_pack(dtype) if schedule == "serial" else widest_pack(dtype, 4))


def test_misaligned_vector_load_fails(emulator, capfd):
    """A plan of 16-byte packs forced onto inputs one element off alignment faults on a GPU,
    and in the emulator."""
    a, b, h0 = scan_inputs(9, 2, 40, torch.float16, layout="offset")
    h = poisoned_like(a)[0]
    assert emulator.status("linear_scan_forward", forward_args(h, a, b, h0), 8, 1) == 1
    assert "misaligned 16-byte vector load" in capfd.readouterr().err


def test_launcher_calling_convention():
    """cuda_linear_scan_forward/backward take the kernel's field numbers, then stream,
    schedule and device (as cuda_forget_mult_*); arguments are checked before any device is
    touched."""
    a, b, h0 = scan_inputs(5, 2, 8, torch.float32, h0_dtype=torch.float32)
    h = torch.empty_like(a)
    args = forward_args(h, a, b, h0)
    with pytest.raises(TypeError, match=r"kernel_fields\(\)\['linear_scan_forward'\] and 3 more"):
        _C.cuda_linear_scan_forward(*args, 0, 0)
    with pytest.raises(ValueError, match="schedule"):
        _C.cuda_linear_scan_forward(*args, 0, 7, -1)
    no_b = forward_args(h, a, b, h0)[:8] + (0,) + forward_args(h, a, b, h0)[9:]  # b's address
    assert FIELDS["linear_scan_forward"][5][1] == "b"
    with pytest.raises(ValueError, match="b is a null pointer"):
        _C.cuda_linear_scan_forward(*no_b, 0, 0, -1)
    grads = [torch.empty_like(a) for _ in range(2)]
    bargs = backward_args(grads[0], grads[1], None, a, a, h, h0)
    with pytest.raises(TypeError, match=r"kernel_fields\(\)\['linear_scan_backward'\] and 3 more"):
        _C.cuda_linear_scan_backward(*bargs)
    with pytest.raises(ValueError, match="schedule"):
        _C.cuda_linear_scan_backward_plan(*bargs, 3)


@pytest.mark.parametrize("field", ["lengths", "cu_seqlens", "reverse"])
def test_cuda_entry_refuses_sequences(field):
    """The CUDA schedules walk whole rows: a C++ caller passing sequences gets a clear error
    (qrnn's Python layer runs such calls there as dense rows)."""
    a = torch.rand(4, 2, 8)
    offsets = torch.tensor([0, 4, 4])
    value = {"lengths": offsets.data_ptr(), "cu_seqlens": offsets.data_ptr(), "reverse": 1}[field]
    h = torch.empty_like(a)  # held: the argument tuple holds addresses, not tensors
    args = list(forward_args(h, a, a, None))
    names = [name for _, name in FIELDS["linear_scan_forward"]]
    position = sum(_WIDTHS[kind] for kind, _ in FIELDS["linear_scan_forward"][:names.index(field)])
    args[position] = value
    with pytest.raises(ValueError, match="run on the CPU kernels only"):
        forward_plan(tuple(args))
