"""The CUDA ForgetMult kernels on a real GPU (every test is marked ``cuda``: skipped, never
failed, on machines without one). The same kernels also run on the CPU by emulation in
test_forget_mult_cuda_emulated.py; these tests add what only a GPU shows: the actual
device code of every dtype, streams, CUDA graphs, torch.compile, several GPUs, 64-bit
offsets on tensors of more than 2**31 elements.
"""

from __future__ import annotations

import pytest
import torch

import qrnn
from conftest import TOLERANCES, assert_close_to_reference, assert_forget_mult_grads, reference_grads
from cuda_cases import assert_untouched_outside, forward_reference, make_inputs, poisoned_like
from qrnn import ops
from qrnn.ops.core import cuda as cuda_backend
from qrnn.ops.forget_mult import kernels as forget_mult_kernels
from qrnn.ops.forget_mult.reference import forget_mult_reference

pytestmark = pytest.mark.cuda

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
HALF = (torch.float16, torch.bfloat16)
SCHEDULES = ["auto", "serial", "chunked"]
needs_kernels = pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels")


def _id(dtype):
    return str(dtype).replace("torch.", "")


def _h0_cases():
    for dtype in DTYPES:
        for h0 in ("none", "same") + (("float32",) if dtype in HALF else ()):
            yield pytest.param(dtype, h0, id=f"{_id(dtype)}-h0_{h0}")


def _leaves(*tensors):
    return [None if t is None else t.detach().clone().requires_grad_() for t in tensors]


def _check_op(f, x, h0, batch_first, what=""):
    """Forward and backward through the public op (autograd) against float64."""
    dtype = f.dtype
    f, x, h0 = _leaves(f, x, h0)
    h = qrnn.forget_mult(f, x, h0, batch_first=batch_first)
    assert h.dtype == dtype and h.device == f.device and h.shape == f.shape
    assert_close_to_reference(h, forward_reference(f.detach(), x.detach(), h0, batch_first), dtype, f"h {what}")
    grad_h = torch.randn(f.shape, dtype=torch.float64, device=f.device).to(dtype)
    assert_forget_mult_grads(h, grad_h, f, x, h0, batch_first, dtype, what)


# ---- Correctness of every dtype, schedule, h0 kind and layout ----------------------------

@needs_kernels
@pytest.mark.parametrize("dtype,h0_kind", list(_h0_cases()))
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
def test_matches_float64_reference(dtype, h0_kind, schedule, batch_first):
    h0_dtype = {"none": None, "same": dtype, "float32": torch.float32}[h0_kind]
    f, x, h0 = make_inputs(150, 3, 72, dtype, "cuda", batch_first=batch_first, h0_dtype=h0_dtype)
    with cuda_backend.schedule(schedule):
        _check_op(f, x, h0, batch_first, schedule)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
@pytest.mark.parametrize("layout", ["contiguous", "offset", "tail", "strided_h", "strided_t", "expanded"])
@pytest.mark.parametrize("hidden", [1, 37, 38, 1550])
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_layouts_odd_sizes_and_poisoned_outputs(dtype, layout, hidden, schedule):
    """Unaligned, strided and odd-sized inputs; outputs are NaN-filled views inside wider
    NaN buffers: every element of a view must be written and nothing outside it."""
    h0_dtype = torch.float32 if dtype in HALF else dtype
    f, x, h0 = make_inputs(41, 3, hidden, dtype, "cuda", h0_dtype=h0_dtype, layout=layout)
    with cuda_backend.schedule(schedule):
        h, h_buffer = poisoned_like(f)
        forget_mult_kernels.forward_into(h, f, x, h0)
        torch.cuda.synchronize()
        assert_close_to_reference(h, forward_reference(f, x, h0), dtype, f"h {layout}")
        assert_untouched_outside(h, h_buffer)

        grad_h = torch.randn(f.shape, dtype=torch.float64, device="cuda").to(dtype)
        (grad_f, gf_buffer), (grad_x, gx_buffer) = poisoned_like(f), poisoned_like(f)
        grad_h0, gh0_buffer = poisoned_like(h0)
        forget_mult_kernels.backward_into(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0)
        torch.cuda.synchronize()
    ref_f, ref_x, ref_h0 = reference_grads(grad_h, f, x, h, h0)
    assert_close_to_reference(grad_f, ref_f, dtype, f"grad_f {layout}")
    assert_close_to_reference(grad_x, ref_x, dtype, f"grad_x {layout}")
    assert_close_to_reference(grad_h0, ref_h0, dtype, f"grad_h0 {layout}")
    for view, buffer in ((grad_f, gf_buffer), (grad_x, gx_buffer), (grad_h0, gh0_buffer)):
        assert_untouched_outside(view, buffer)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
def test_op_output_from_poisoned_allocator_memory(dtype):
    """The op's own output comes from torch's caching allocator: hand it a block we filled
    with NaN just before, so an element the kernel skipped would show."""
    f, x, h0 = make_inputs(33, 4, 50, dtype, "cuda")
    poison = torch.full(f.shape, float("nan"), dtype=dtype, device="cuda")
    address = poison.data_ptr()
    del poison
    with torch.no_grad():
        h = qrnn.forget_mult(f, x)
    if h.data_ptr() != address:
        pytest.skip("the caching allocator did not hand back the poisoned block")
    assert_close_to_reference(h, forward_reference(f, x, None), dtype, "h")


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
@pytest.mark.parametrize("seq_len", [0, 1, 15, 16, 17, 300])
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_sequence_lengths(dtype, seq_len, schedule):
    f, x, h0 = make_inputs(seq_len, 2, 24, dtype, "cuda", h0_dtype=dtype)
    with cuda_backend.schedule(schedule):
        _check_op(f, x, h0, False, f"T={seq_len}")


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
def test_sum_backward_broadcast_grad(dtype):
    """h.sum().backward() hands the backward a grad_h with all strides 0."""
    f, x, h0 = _leaves(*make_inputs(40, 3, 16, dtype, "cuda", h0_dtype=dtype))
    qrnn.forget_mult(f, x, h0).sum().backward()
    h = qrnn.forget_mult(f.detach(), x.detach(), h0.detach())
    ref_f, ref_x, ref_h0 = reference_grads(torch.ones_like(h), f, x, h, h0)
    assert_close_to_reference(f.grad, ref_f, dtype, "grad_f")
    assert_close_to_reference(x.grad, ref_x, dtype, "grad_x")
    assert_close_to_reference(h0.grad, ref_h0, dtype, "grad_h0")


@needs_kernels
@pytest.mark.parametrize("dtype", HALF, ids=_id)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_16bit_error_at_most_twice_a_float32_state_loop(dtype, schedule):
    """16-bit storage, float32 state: the error against float64 is no worse than 2x that of
    a PyTorch loop carrying a float32 state and storing each step in the same dtype."""

    def float32_state_loop(f, x, h0):  # each step's state rounded to f's dtype only when stored
        return forget_mult_reference(f.float(), x.float(), h0.float()).to(f.dtype)

    def rel_err(a, ref):
        return ((a.double() - ref).norm() / ref.norm()).item()

    f, x, h0 = make_inputs(200, 8, 256, dtype, "cuda", h0_dtype=torch.float32)
    grad_h = torch.randn(f.shape, device="cuda").to(dtype)
    f64, x64, h064 = (t.double().requires_grad_() for t in (f, x, h0))
    ref = forward_reference(f64, x64, h064)
    ref.backward(grad_h.double())
    errors = {}
    for name, fn in (("qrnn", qrnn.forget_mult), ("loop", float32_state_loop)):
        fl, xl, h0l = _leaves(f, x, h0)
        with cuda_backend.schedule(schedule):
            h = fn(fl, xl, h0l)
            h.backward(grad_h)
        errors[name] = [rel_err(h, ref.detach()), rel_err(fl.grad, f64.grad), rel_err(xl.grad, x64.grad),
                        rel_err(h0l.grad, h064.grad)]
    for what, ours, loop in zip(("h", "grad_f", "grad_x", "grad_h0"), errors["qrnn"], errors["loop"]):
        assert ours <= 2 * loop + 1e-7, f"{what}: qrnn error {ours:.3g} vs float32-state loop {loop:.3g}"


@needs_kernels
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
def test_gradcheck_float64(schedule, batch_first):
    f, x, h0 = make_inputs(19, 2, 5, torch.float64, "cuda", batch_first=batch_first, h0_dtype=torch.float64)
    f, x, h0 = _leaves(f, x, h0)
    with cuda_backend.schedule(schedule):
        assert torch.autograd.gradcheck(lambda a, b, c: qrnn.forget_mult(a, b, c, batch_first=batch_first),
                                        (f, x, h0), eps=1e-6, atol=1e-8, rtol=1e-6)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
def test_opcheck(dtype):
    f, x, h0 = make_inputs(12, 3, 16, dtype, "cuda", h0_dtype=dtype)
    f, x, h0 = _leaves(f, x, h0)
    torch.library.opcheck(ops.forget_mult_op, (f, x, h0, False))
    torch.library.opcheck(ops.forget_mult_op, (f, x, None, True))
    h = ops.forget_mult_op(f, x, h0, False).detach()
    torch.library.opcheck(ops.forget_mult_backward_op, (torch.randn_like(h), f.detach(), x.detach(), h,
                                                         h0.detach(), False))


# ---- Streams, graphs, compile, devices ---------------------------------------------------

@needs_kernels
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_runs_on_the_current_stream(schedule):
    """Inputs become ready late on a side stream (behind a ~20 ms sleep); run there, the
    kernels see them; run on any other stream, they would read the NaN placeholders."""
    f_src, x_src, h0 = make_inputs(64, 4, 96, torch.float32, "cuda", h0_dtype=torch.float32)
    grad_src = torch.randn(f_src.shape, device="cuda")
    f = torch.full_like(f_src, float("nan")).requires_grad_()
    x = torch.full_like(x_src, float("nan"))
    grad_h = torch.full_like(grad_src, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with cuda_backend.schedule(schedule), torch.cuda.stream(side):
        torch.cuda._sleep(40_000_000)
        with torch.no_grad():
            f.copy_(f_src)
            x.copy_(x_src)
        h = qrnn.forget_mult(f, x, h0)
        torch.cuda._sleep(40_000_000)
        grad_h.copy_(grad_src)
        h.backward(grad_h)
    side.synchronize()
    assert_close_to_reference(h, forward_reference(f_src, x_src, h0), torch.float32, "h on a side stream")
    ref_f, _, _ = reference_grads(grad_src, f_src, x_src, h.detach(), h0)
    assert_close_to_reference(f.grad, ref_f, torch.float32, "grad_f on a side stream")


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=_id)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
def test_cuda_graph_capture_and_replay(dtype, schedule):
    T, B, H = 96, 4, 64
    f, x, h0 = make_inputs(T, B, H, dtype, "cuda", h0_dtype=torch.float32 if dtype in HALF else dtype)
    grad_h = torch.randn(f.shape, device="cuda").to(dtype)
    with cuda_backend.schedule(schedule):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture
            for _ in range(2):
                h = ops.forget_mult_op(f, x, h0, False)
                ops.forget_mult_backward_op(grad_h, f, x, h, h0, False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            h = ops.forget_mult_op(f, x, h0, False)
            grad_f, grad_x, grad_h0 = ops.forget_mult_backward_op(grad_h, f, x, h, h0, False)
            with torch.no_grad():
                h_eager_path = qrnn.forget_mult(f, x, h0)  # the eager fast path captures too
    for _ in range(3):  # new values in the captured buffers, then replay
        nf, nx, nh0 = make_inputs(T, B, H, dtype, "cuda", h0_dtype=h0.dtype)
        f.copy_(nf)
        x.copy_(nx)
        h0.copy_(nh0)
        grad_h.copy_(torch.randn_like(grad_h))
        graph.replay()
        torch.cuda.synchronize()
        assert_close_to_reference(h, forward_reference(nf, nx, nh0), dtype, "replayed h")
        assert torch.equal(h, h_eager_path)
        ref_f, ref_x, ref_h0 = reference_grads(grad_h, nf, nx, h, nh0)
        assert_close_to_reference(grad_f, ref_f, dtype, "replayed grad_f")
        assert_close_to_reference(grad_x, ref_x, dtype, "replayed grad_x")
        assert_close_to_reference(grad_h0, ref_h0, dtype, "replayed grad_h0")


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_id)
def test_torch_compile_reduce_overhead_fullgraph(dtype):
    torch._dynamo.reset()

    def step(f, x, h0):
        return qrnn.forget_mult(torch.sigmoid(f), x, h0) * 2

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for _ in range(4):  # several calls: recording, then CUDA-graph replays
        f, x, h0 = make_inputs(48, 3, 40, dtype, "cuda", h0_dtype=dtype)
        grad = torch.randn(f.shape, device="cuda").to(dtype)
        fc, xc, h0c = _leaves(f, x, h0)
        out = compiled(fc, xc, h0c)
        out.backward(grad)
        fe, xe, h0e = _leaves(f.double(), x.double(), h0.double())
        ref = forward_reference(torch.sigmoid(fe), xe, h0e) * 2
        ref.backward(grad.double())
        assert_close_to_reference(out, ref, dtype, "compiled output")
        for got, want, name in ((fc.grad, fe.grad, "f"), (xc.grad, xe.grad, "x"), (h0c.grad, h0e.grad, "h0")):
            assert_close_to_reference(got, want, dtype, f"compiled grad_{name}")


@needs_kernels
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_runs_on_the_tensors_device():
    """Tensors on cuda:1 while cuda:0 is current: the kernels must run on cuda:1 (on its
    current stream) and leave cuda:0 current."""
    torch.cuda.set_device(0)
    f, x, h0 = make_inputs(40, 3, 64, torch.float16, "cuda:1", h0_dtype=torch.float32)
    _check_op(f, x, h0, False, "on cuda:1, cuda:0 current")
    assert torch.cuda.current_device() == 0, "the call must leave the current device as it was"
    side = torch.cuda.Stream(device=1)
    with torch.cuda.stream(side):  # makes cuda:1 current, with a side stream
        _check_op(f, x, h0, False, "on a side stream of cuda:1")
    assert torch.cuda.current_device() == 0


@needs_kernels
@pytest.mark.parametrize("hidden", [1024, 1023], ids=["vector", "scalar"])
def test_64_bit_offsets(hidden):
    """An output of more than 2**31 elements: offsets past 2**31 must not wrap. Inputs are
    broadcast along batch (no memory), so every batch row of h must be the same."""
    T = 64
    B = 2**31 // (T * hidden) + 2
    need = 3 * T * B * hidden * 2 + (1 << 30)
    if torch.cuda.get_device_properties(0).total_memory < need:
        pytest.skip("not enough GPU memory")
    f1, x1, _ = make_inputs(T, 1, hidden, torch.float16, "cuda")
    f, x = f1.expand(T, B, hidden), x1.expand(T, B, hidden)
    h = torch.full((T, B, hidden), float("nan"), dtype=torch.float16, device="cuda")
    forget_mult_kernels.forward_into(h, f, x)
    ref = forward_reference(f1, x1, None)
    for b in (0, B // 2, B - 1):
        assert_close_to_reference(h[:, b:b + 1], ref, torch.float16, f"h batch row {b}")
    grad1 = torch.randn(T, 1, hidden, device="cuda").half()
    grad_f, grad_x = torch.empty_like(h), torch.empty_like(h)
    forget_mult_kernels.backward_into(grad_f, grad_x, None, grad1.expand(T, B, hidden), f, x, h)
    ref_f, ref_x, _ = reference_grads(grad1, f1, x1, h[:, :1], None)
    for b in (0, B - 1):
        assert_close_to_reference(grad_f[:, b:b + 1], ref_f, torch.float16, f"grad_f batch row {b}")
        assert_close_to_reference(grad_x[:, b:b + 1], ref_x, torch.float16, f"grad_x batch row {b}")


def test_build_reports_cuda_and_architectures():
    info = qrnn.build_info()
    if not cuda_backend.AVAILABLE:
        pytest.skip("built without CUDA")
    assert info["cuda"] is True and info["cuda_architectures"]


@pytest.mark.skipif(cuda_backend.AVAILABLE, reason="this build has CUDA kernels")
def test_cuda_tensor_without_cuda_build_says_how_to_rebuild():
    f = torch.rand(3, 2, 4, device="cuda")
    with pytest.raises(RuntimeError, match="QRNN_CUDA=ON"):
        qrnn.forget_mult(f, f)


def test_tolerances_cover_every_dtype():
    assert set(DTYPES) <= set(TOLERANCES)
