"""The fused QRNN gate op (qrnn.qrnn_gates / qrnn::qrnn_gates): against the float64
per-step reference and the unfused PyTorch path, every option, every dtype, gradients,
poisoned outputs, strides, each instruction set, bad arguments, opcheck and compile."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import qrnn
from conftest import CPU_DTYPES, HAS_CUDA, assert_close_to_reference
from qrnn import _C, ops
from qrnn.ops.core import cuda as cuda_backend
from qrnn.ops.core import kernel_args
from qrnn.ops.qrnn_gates import kernels as gate_kernels
from qrnn.ops.qrnn_gates.kernels import outputs as qrnn_gates_outputs
from qrnn.ops.qrnn_gates.op import KERNELS as GATE_KERNELS
from qrnn.ops.qrnn_gates.reference import qrnn_gates_reference
from qrnn_gates_cases import OPTION_IDS, OPTION_SETS, make_inputs


def run_with_grads(fn, gates, c0, kwargs, grad_out, grad_cn):
    output, c_n = fn(gates, c0, **kwargs)
    loss = (output.double() * grad_out).sum() + (c_n.double() * grad_cn).sum()
    inputs = [gates] + ([c0] if c0 is not None else [])
    grads = torch.autograd.grad(loss, inputs)
    return output, c_n, grads


@pytest.mark.parametrize("options", OPTION_SETS, ids=OPTION_IDS)
@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_fused_and_unfused_match_float64_reference(dtype, options):
    output_gate, lengths, reverse, batch_first, mask, c0 = options
    T, B, H = 9, 4, 37
    gates, c0, forget_mask, lens = make_inputs(T, B, H, dtype, output_gate, lengths, batch_first, mask, c0,
                                               requires_grad=True)
    kwargs = dict(output_gate=output_gate, forget_mask=forget_mask, forget_scale=0.85, lengths=lens,
                  batch_first=batch_first, reverse=reverse)
    grad_out = torch.randn(gates.shape[:-1] + (H,), dtype=torch.float64)
    grad_cn = torch.randn(B, H, dtype=torch.float64)

    ref_gates = gates.detach().double().requires_grad_()
    ref_c0 = None if c0 is None else c0.detach().double().requires_grad_()
    ref_kwargs = dict(kwargs, forget_mask=None if forget_mask is None else forget_mask.double())
    expected = run_with_grads(qrnn_gates_reference, ref_gates, ref_c0, ref_kwargs, grad_out, grad_cn)

    for name, fn in (("fused", qrnn.qrnn_gates), ("unfused", ops.qrnn_gates_unfused)):
        output, c_n, grads = run_with_grads(fn, gates, c0, kwargs, grad_out, grad_cn)
        assert output.dtype == dtype and output.shape == expected[0].shape
        state_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        assert c_n.dtype == state_dtype
        assert_close_to_reference(output, expected[0], dtype, f"{name} output")
        assert_close_to_reference(c_n, expected[1], dtype, f"{name} c_n")
        for got, want, inp, what in zip(grads, expected[2], (gates, c0), ("grad gates", "grad c0")):
            assert got.dtype == inp.dtype
            assert_close_to_reference(got, want, dtype, f"{name} {what}")
    if lens is not None:  # padding steps are exactly zero
        out = qrnn.qrnn_gates(gates.detach(), None if c0 is None else c0.detach(), **kwargs)[0]
        out_tm = out.transpose(0, 1) if batch_first else out
        for b in range(B):
            assert (out_tm[int(lens[b]):, b] == 0).all()


def test_several_chunks_and_blocks_single_thread():
    """Hidden over one block and more items than one thread chunk walks at once."""
    T, B, H = 5, 64, 600
    gates, c0, mask, lens = make_inputs(T, B, H, torch.float32, lengths=True, mask=True, c0=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for reverse in (False, True):
            out, c_n = qrnn.qrnn_gates(gates, c0, forget_mask=mask, lengths=lens, reverse=reverse)
            ref = qrnn_gates_reference(gates.double(), c0.double(), forget_mask=mask.double(), lengths=lens,
                                       reverse=reverse)
            assert_close_to_reference(out, ref[0], torch.float32, "output")
            assert_close_to_reference(c_n, ref[1], torch.float32, "c_n")
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("output_gate", [True, False])
def test_gradcheck_float64(output_gate):
    T, B, H = 5, 3, 4
    gates, c0, mask, lens = make_inputs(T, B, H, torch.float64, output_gate, lengths=True, mask=True, c0=True,
                                        requires_grad=True)
    for reverse, batch_first in ((False, False), (True, False)):
        def fn(g, h, reverse=reverse, batch_first=batch_first):
            return qrnn.qrnn_gates(g, h, output_gate=output_gate, forget_mask=mask, forget_scale=0.9, lengths=lens,
                                   reverse=reverse, batch_first=batch_first)
        assert torch.autograd.gradcheck(fn, (gates, c0), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_unused_outputs_get_no_gradient_pass():
    """Only c_n used: the output's gradient stays None (no zeros materialised) and is right."""
    gates, c0, _, _ = make_inputs(6, 2, 5, torch.float64, c0=True, requires_grad=True)
    _, c_n = qrnn.qrnn_gates(gates, c0)
    grads = torch.autograd.grad(c_n.sum(), (gates, c0))
    ref_g, ref_c0 = gates.detach().requires_grad_(), c0.detach().requires_grad_()
    ref = torch.autograd.grad(qrnn_gates_reference(ref_g, ref_c0)[1].sum(), (ref_g, ref_c0))
    for got, want in zip(grads, ref):
        assert_close_to_reference(got, want, torch.float64)


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_every_output_element_is_written(dtype):
    """Outputs poisoned with NaN beforehand: the kernels overwrite every element
    (padding steps with zeros), forward and backward."""
    T, B, H = 6, 5, 21
    gates, c0, mask, lens = make_inputs(T, B, H, dtype, lengths=True, mask=True, c0=True)
    lens[1] = 0
    code = kernel_args.DTYPE_CODES[dtype]
    state_dtype = c0.dtype
    sc = kernel_args.DTYPE_CODES[state_dtype]

    def view3(t):
        return (t.data_ptr(), *t.stride())

    def view2(t):
        return (t.data_ptr(), *t.stride())

    for reverse in (False, True):
        common = (code, T, B, H, 1, *view3(gates), H, *view3(mask), *view2(c0), sc, lens.data_ptr(), 1, 0, int(reverse))
        output = torch.full((T, B, H), float("nan"), dtype=dtype)
        states = torch.full((T, B, H), float("nan"), dtype=dtype)
        c_n = torch.full((B, H), float("nan"), dtype=state_dtype)
        _C.qrnn_gates_forward(1.0, *common, *view3(output), *view3(states), *view2(c_n), sc, 2)
        assert not output.isnan().any() and not states.isnan().any() and not c_n.isnan().any()
        grad_out = torch.randn(T, B, H).to(dtype)
        grad_gates = torch.full(gates.shape, float("nan"), dtype=dtype)
        grad_c0 = torch.full((B, H), float("nan"), dtype=state_dtype)
        _C.qrnn_gates_backward(1.0, *common, *view3(states), *view3(grad_out), 0, 0, 0, sc, *view3(grad_gates), H,
                               *view2(grad_c0), 2)
        assert not grad_gates.isnan().any() and not grad_c0.isnan().any()
        assert (grad_gates[:, 1] == 0).all()  # a zero-length sequence gets no gradient
        assert torch.equal(grad_c0[1], torch.zeros(H, dtype=state_dtype))


def test_strided_inputs_read_in_place():
    """Gates as a view with a row stride other than 3H, and with a hidden stride of 2."""
    T, B, H = 7, 3, 10
    big = 3 * torch.randn(T, B, 6 * H + 5, dtype=torch.float64)
    c0 = torch.randn(B, H, dtype=torch.float64)
    for gates in (big[..., 7:7 + 3 * H], big[..., 1::2][..., :3 * H]):
        for batch_first in (False, True):
            g = gates.transpose(0, 1) if batch_first else gates
            out, c_n = qrnn.qrnn_gates(g, c0, batch_first=batch_first)
            ref = qrnn_gates_reference(g.contiguous(), c0, batch_first=batch_first)
            assert_close_to_reference(out, ref[0], torch.float64)
            assert_close_to_reference(c_n, ref[1], torch.float64)
            g = g.detach().requires_grad_()
            grad = torch.autograd.grad(qrnn.qrnn_gates(g, c0, batch_first=batch_first)[0].sum(), g)[0]
            g2 = g.detach().contiguous().requires_grad_()
            want = torch.autograd.grad(qrnn_gates_reference(g2, c0, batch_first=batch_first)[0].sum(), g2)[0]
            assert_close_to_reference(grad, want, torch.float64)


def test_each_instruction_set():
    """QRNN_SIMD caps the instruction set: the other kernel copies give the same results
    (the selection is made once per process, so each set runs in its own, concurrently), and
    build_info names the rows each family runs there."""
    simd = qrnn.build_info()["simd"]
    # The default set runs every other test; avx512 is a fallback only where avx512_bf16 leads.
    isas = {"avx512_bf16": ["generic", "avx2", "avx512"], "avx512": ["generic", "avx2"], "avx2": ["generic", "avx2"],
            "neon": ["generic", "neon"]}.get(simd, ["generic"])
    code = textwrap.dedent("""
        import torch, qrnn
        from qrnn.ops.qrnn_gates.reference import qrnn_gates_reference
        torch.manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for og in (True, False):
                g = (3 * torch.randn(6, 3, (3 if og else 2) * 40)).to(dtype).requires_grad_()
                c0 = torch.randn(3, 40)
                out, c_n = qrnn.qrnn_gates(g, c0, output_gate=og, lengths=torch.tensor([6, 2, 0]), reverse=og)
                ref_g = g.detach().double().requires_grad_()
                ref = qrnn_gates_reference(ref_g, c0.double(), output_gate=og, lengths=torch.tensor([6, 2, 0]),
                                           reverse=og)
                tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=2e-2)
                torch.testing.assert_close(out.double(), ref[0], **tol)
                torch.testing.assert_close(c_n.double(), ref[1], **tol)
                grad = torch.autograd.grad(out.float().sum(), g)[0]
                want = torch.autograd.grad(ref[0].sum(), ref_g)[0]
                torch.testing.assert_close(grad.double(), want, **tol)
        info = qrnn.build_info()
        print(info["simd"], *sorted(set(info["simd_rows"].values())))
    """)
    runs = {isa: subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, QRNN_SIMD=isa),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for isa in isas}
    for isa, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{isa}: {err}"
        # Every family's contiguous rows on the level's own vector layer (avx512_bf16 is avx512's).
        assert out.split() == [isa, {"avx512_bf16": "avx512"}.get(isa, isa)]


@pytest.mark.skipif(qrnn.build_info()["simd"] != "avx512_bf16", reason="this CPU or build has no avx512_bf16 kernels")
def test_native_bfloat16_stores_round_like_the_fallback(tmp_path):
    """The avx512_bf16 kernels store bfloat16 with the CPU's conversion instruction; the
    avx512 ones round in integer code. Same math, so every bfloat16 output and gradient
    (rounding ties, NaN, saturated gates included) must be bit for bit the same."""
    code = textwrap.dedent("""
        import sys, torch, qrnn
        torch.manual_seed(0)
        g = 3 * torch.randn(9, 4, 3 * 37)
        g[0, 0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e-30, 0.0])
        g = g.to(torch.bfloat16).requires_grad_()
        c0 = torch.randn(4, 37)
        out, c_n = qrnn.qrnn_gates(g, c0, forget_mask=(torch.rand(9, 4, 37) > 0.3).to(torch.bfloat16))
        grad = torch.autograd.grad((out.float() * torch.randn(9, 4, 37)).sum(), g)[0]
        torch.save({"simd": qrnn.build_info()["simd"], "out": out.view(torch.int16), "c_n": c_n.view(torch.int32),
                    "grad": grad.view(torch.int16)}, sys.argv[1])
    """)
    results = {}
    for isa in ("avx512_bf16", "avx512"):
        path = tmp_path / f"{isa}.pt"
        subprocess.run([sys.executable, "-c", code, str(path)], env=dict(os.environ, QRNN_SIMD=isa), check=True)
        results[isa] = torch.load(path)
        assert results[isa]["simd"] == isa
    native, fallback = results["avx512_bf16"], results["avx512"]
    for key in ("out", "c_n", "grad"):
        assert torch.equal(native[key], fallback[key]), key


@pytest.mark.parametrize("shape", [(0, 3), (4, 0), (0, 0)])
def test_empty_sequences_and_batches(shape):
    T, B = shape
    H = 5
    gates = torch.randn(T, B, 3 * H, requires_grad=True)
    c0 = torch.randn(B, H, requires_grad=True)
    out, c_n = qrnn.qrnn_gates(gates, c0)
    assert out.shape == (T, B, H) and c_n.shape == (B, H)
    assert torch.equal(c_n, c0)  # nothing happened
    (out.sum() + c_n.sum()).backward()
    assert gates.grad.shape == gates.shape and torch.equal(c0.grad, torch.ones(B, H))


def test_eager_fast_path_matches_op_path():
    gates, c0, mask, lens = make_inputs(8, 3, 16, torch.float32, lengths=True, mask=True, c0=True)
    with torch.no_grad():
        fast = qrnn.qrnn_gates(gates, c0, forget_mask=mask, lengths=lens)
    slow = ops.qrnn_gates_op(gates, c0, mask, lens, 1.0, True, False, False)
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])


def test_extreme_pre_activations_saturate_cleanly():
    """Huge, tiny and infinite pre-activations give exact gate limits, never NaN."""
    H = 8
    values = torch.tensor([0.0, 1e-30, -1e-30, 1e-4, 50.0, -50.0, 1e30, float("inf"), -float("inf")])
    gates = values.view(-1, 1, 1).expand(len(values), 1, 3 * H).contiguous()
    out, c_n = qrnn.qrnn_gates(gates)
    ref = qrnn_gates_reference(gates.double())
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), ref[0], atol=1e-6, rtol=1e-6)


def test_bad_arguments():
    g = torch.randn(4, 2, 12)
    with pytest.raises(ValueError, match="gates must be 3-D"):
        qrnn.qrnn_gates(torch.randn(4, 12))
    with pytest.raises(ValueError, match="multiple of 3"):
        qrnn.qrnn_gates(torch.randn(4, 2, 10))
    with pytest.raises(TypeError, match="gates must be float32"):
        qrnn.qrnn_gates(g.to(torch.int32))
    with pytest.raises(ValueError, match="c0 must have shape"):
        qrnn.qrnn_gates(g, torch.randn(2, 5))
    with pytest.raises(TypeError, match="c0 must have dtype"):
        qrnn.qrnn_gates(g, torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="forget_mask must have"):
        qrnn.qrnn_gates(g, forget_mask=torch.ones(4, 2, 3))
    with pytest.raises(TypeError, match="forget_mask must have gates' dtype"):
        qrnn.qrnn_gates(g, forget_mask=torch.ones(4, 2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="forget_scale"):
        qrnn.qrnn_gates(g, forget_scale=1.5)
    with pytest.raises(TypeError, match="lengths must be an int32 or int64 tensor"):
        qrnn.qrnn_gates(g, lengths=torch.tensor([4.0, 2.0]))
    with pytest.raises(ValueError, match="lengths"):  # the kernel checks values
        qrnn.qrnn_gates(g, lengths=torch.tensor([5, 2]))
    with pytest.raises(ValueError, match="lengths"):
        qrnn.qrnn_gates(g.requires_grad_(), lengths=torch.tensor([-1, 2]))


def test_opcheck():
    T, B, H = 5, 3, 6
    for dtype, output_gate, full in ((torch.float32, True, True), (torch.float64, False, False),
                                     (torch.bfloat16, True, False)):
        gates, c0, mask, lens = make_inputs(T, B, H, dtype, output_gate, lengths=True, mask=True, c0=True,
                                            requires_grad=True)
        args = (gates, c0, mask, lens, 0.9, output_gate, False, True) if full else \
            (gates, None, None, None, 1.0, output_gate, True, False)
        torch.library.opcheck(ops.qrnn_gates_op, args)


def test_torch_compile_fullgraph():
    gates, c0, mask, lens = make_inputs(6, 3, 8, torch.float32, lengths=True, mask=True, c0=True,
                                        requires_grad=True)

    def step(g, h):
        out, c_n = qrnn.qrnn_gates(g, h, forget_mask=mask, lengths=lens, reverse=True)
        return out.sum() + c_n.square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss = compiled(gates, c0)
    grads = torch.autograd.grad(loss, (gates, c0))
    want_loss = step(gates, c0)
    want = torch.autograd.grad(want_loss, (gates, c0))
    torch.testing.assert_close(loss, want_loss)
    for got, exp in zip(grads, want):
        torch.testing.assert_close(got, exp)


def test_dispatch_falls_back_where_no_fused_kernel(monkeypatch):
    """A device without a fused kernel runs the unfused path: one registration switches it."""
    gates, c0, _, lens = make_inputs(5, 2, 6, torch.float64, lengths=True, c0=True)
    assert ops.has_fused_qrnn_gates("cpu")
    fused = qrnn.qrnn_gates(gates, c0, lengths=lens)
    monkeypatch.delitem(GATE_KERNELS.forward, "cpu")
    assert not ops.has_fused_qrnn_gates(torch.device("cpu"))
    unfused = qrnn.qrnn_gates(gates, c0, lengths=lens)
    torch.testing.assert_close(fused, unfused)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_matches_cpu(dtype):
    T, B, H = 12, 5, 64
    gates, c0, mask, lens = make_inputs(T, B, H, dtype, lengths=True, mask=True, c0=True)
    kwargs = dict(forget_mask=mask, lengths=lens, reverse=True)
    cpu = qrnn.qrnn_gates(gates, c0, **kwargs)
    g = gates.cuda().requires_grad_()
    cuda = qrnn.qrnn_gates(g, c0.cuda(), forget_mask=mask.cuda(), lengths=lens.cuda(), reverse=True)
    ref = qrnn_gates_reference(gates.double(), c0.double(), forget_mask=mask.double(), lengths=lens, reverse=True)
    assert_close_to_reference(cuda[0], ref[0], dtype, "cuda output")
    assert_close_to_reference(cuda[1], ref[1], dtype, "cuda c_n")
    assert_close_to_reference(cpu[0], ref[0], dtype, "cpu output")
    cuda[0].float().sum().backward()
    assert g.grad.shape == g.shape and g.grad.isfinite().all()
    assert HAS_CUDA


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels")
@pytest.mark.parametrize("options", OPTION_SETS, ids=OPTION_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("H", [37, 40])
def test_cuda_fused_matches_float64_reference(dtype, options, H):
    """The fused CUDA kernels through the op (autograd included) against float64."""
    assert ops.has_fused_qrnn_gates("cuda")
    output_gate, lengths, reverse, batch_first, mask, c0 = options
    gates, c0, forget_mask, lens = make_inputs(9, 4, H, dtype, output_gate, lengths, batch_first, mask, c0)
    kwargs = dict(output_gate=output_gate, forget_scale=0.85, lengths=lens, batch_first=batch_first, reverse=reverse)
    grad_out = torch.randn(gates.shape[:-1] + (H,), dtype=torch.float64)
    grad_cn = torch.randn(4, H, dtype=torch.float64)
    ref_g = gates.double().requires_grad_()
    ref_c0 = None if c0 is None else c0.double().requires_grad_()
    expected = run_with_grads(qrnn_gates_reference, ref_g, ref_c0,
                              dict(kwargs, forget_mask=None if forget_mask is None else forget_mask.double()),
                              grad_out, grad_cn)
    cuda = lambda t: None if t is None else t.cuda()  # noqa: E731
    g = gates.cuda().requires_grad_()
    h = None if c0 is None else c0.cuda().requires_grad_()
    output, c_n, grads = run_with_grads(qrnn.qrnn_gates, g, h,
                                        dict(kwargs, forget_mask=cuda(forget_mask), lengths=cuda(lens)),
                                        grad_out.cuda(), grad_cn.cuda())
    assert output.is_cuda and output.dtype == dtype
    for got, want, what in zip((output, c_n) + tuple(grads), expected[:2] + tuple(expected[2]),
                               ("output", "c_n", "grad gates", "grad c0")):
        assert_close_to_reference(got, want, dtype, what)


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_every_output_element_is_written(dtype):
    T, B, H = 6, 5, 40
    gates, c0, mask, lens = (t.cuda() for t in make_inputs(T, B, H, dtype, lengths=True, mask=True, c0=True))
    lens[1] = 0
    for reverse in (False, True):
        output = torch.full((T, B, H), float("nan"), dtype=dtype, device="cuda")
        states, c_n = torch.full_like(output, float("nan")), torch.full_like(c0, float("nan"))
        gate_kernels.forward_into(output, states, c_n, gates, c0, mask, lens, reverse=reverse)
        grad_gates, grad_c0 = torch.full_like(gates, float("nan")), torch.full_like(c0, float("nan"))
        gate_kernels.backward_into(grad_gates, grad_c0, torch.randn_like(output), None, gates, states, c0, mask,
                                         lens, reverse=reverse)
        torch.cuda.synchronize()
        for t in (output, states, c_n, grad_gates, grad_c0):
            assert not t.isnan().any()
        assert (output[:, 1] == 0).all() and (grad_gates[:, 1] == 0).all()


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels")
def test_cuda_opcheck_and_side_stream():
    gates, c0, mask, lens = (t.cuda() for t in make_inputs(7, 3, 16, torch.float32, lengths=True, mask=True, c0=True))
    gates.requires_grad_()
    torch.library.opcheck(torch.ops.qrnn.qrnn_gates.default, (gates, c0, mask, lens, 0.9, True, False, True))
    ref = qrnn.qrnn_gates(gates, c0, forget_mask=mask, lengths=lens)[0]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = qrnn.qrnn_gates(gates, c0, forget_mask=mask, lengths=lens)[0]
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(out, ref)


@pytest.mark.skipif(not cuda_backend.AVAILABLE or HAS_CUDA, reason="needs a CUDA build on a machine without a GPU")
def test_cuda_launchers_without_a_gpu_raise():
    """The binding reads the CPU entry points' arguments and validates them before any CUDA
    call (bad input: ValueError); a valid call on a machine without a GPU fails the launch
    with a RuntimeError naming the kernel, never a crash."""
    gates, c0, mask, lens = make_inputs(4, 2, 8, torch.float32, lengths=True, mask=True, c0=True)
    output, states, c_n = qrnn_gates_outputs(gates, True, False)
    args = gate_kernels.forward_args(output, states, c_n, gates, c0, mask, lens, 1.0, True, False, False)
    with pytest.raises(TypeError, match="takes [0-9]+ arguments"):
        _C.cuda_qrnn_gates_forward(*args)
    with pytest.raises(ValueError, match="forget_scale"):
        _C.cuda_qrnn_gates_forward(2.0, *args[1:], 0, 0)
    with pytest.raises(RuntimeError, match="qrnn::cuda::qrnn_gates_forward"):
        _C.cuda_qrnn_gates_forward(*args, 0, 0)
    grad_gates = torch.empty_like(gates)
    grad_output = torch.ones_like(output)  # held: bargs holds addresses, not tensors
    bargs = gate_kernels.backward_args(grad_gates, None, grad_output, None, gates, states, c0, mask,
                                            lens, 1.0, True, False, False)
    with pytest.raises(RuntimeError, match="qrnn::cuda::qrnn_gates_backward"):
        _C.cuda_qrnn_gates_backward(*bargs, 0, 0)
