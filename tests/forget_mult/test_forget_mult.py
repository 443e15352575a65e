"""qrnn.forget_mult on the CPU against the float64 reference, plus the op machinery:
gradcheck, opcheck, torch.compile, bad input, and every element written."""

import itertools

import pytest
import torch

import qrnn
from conftest import CPU_DTYPES, assert_close_to_reference, assert_threads_agree, reference_grads, scan_bad_inputs
from qrnn.ops.forget_mult.kernels import backward_args, forward_args
from qrnn.ops.forget_mult.reference import forget_mult_backward_reference, forget_mult_reference


def make_inputs(T, B, H, dtype, *, batch_first=False, with_h0=True, requires_grad=False):
    shape = (B, T, H) if batch_first else (T, B, H)
    f = torch.rand(shape, dtype=torch.float64).to(dtype)  # gates in (0, 1)
    x = torch.randn(shape, dtype=torch.float64).to(dtype)
    h0 = torch.randn(B, H, dtype=torch.float64).to(dtype) if with_h0 else None
    if requires_grad:
        for t in (f, x, h0):
            if t is not None:
                t.requires_grad_()
    return f, x, h0


def reference_fwd_bwd(f, x, h0, grad_h, h_saved, batch_first):
    """float64 output of the plain recurrence, and its float64 gradients given `h_saved`, the
    forward output the backward op receives (16-bit storage rounds it; see reference_grads)."""
    f64, x64 = f.detach().double(), x.detach().double()
    h064 = h0.detach().double() if h0 is not None else None
    h = forget_mult_reference(f64, x64, h064, batch_first=batch_first)
    return (h,) + reference_grads(grad_h, f, x, h_saved, h0, batch_first)


def test_backward_reference_matches_autograd():
    """The explicit backward reference is itself checked against autograd of the forward one."""
    f, x, h0 = make_inputs(9, 3, 4, torch.float64, requires_grad=True)
    h = forget_mult_reference(f, x, h0)
    grad_h = torch.randn_like(h)
    h.backward(grad_h)
    got = forget_mult_backward_reference(grad_h, f.detach(), x.detach(), h.detach(), h0.detach())
    for a, b in zip(got, (f.grad, x.grad, h0.grad)):
        torch.testing.assert_close(a, b)


def check_against_reference(T, B, H, dtype, batch_first, with_h0):
    f, x, h0 = make_inputs(T, B, H, dtype, batch_first=batch_first, with_h0=with_h0, requires_grad=True)
    h = qrnn.forget_mult(f, x, h0, batch_first=batch_first)
    assert h.shape == f.shape and h.dtype == dtype
    grad_h = torch.randn(h.shape, dtype=torch.float64).to(dtype)
    h.backward(grad_h)
    ref_h, ref_df, ref_dx, ref_dh0 = reference_fwd_bwd(f, x, h0, grad_h, h, batch_first)
    what = f"T={T} B={B} H={H} batch_first={batch_first} h0={with_h0}"
    assert_close_to_reference(h, ref_h, dtype, f"h {what}")
    assert_close_to_reference(x.grad, ref_dx, dtype, f"grad_x {what}")
    assert_close_to_reference(f.grad, ref_df, dtype, f"grad_f {what}")
    if with_h0:
        assert h0.grad.dtype == dtype
        assert_close_to_reference(h0.grad, ref_dh0, dtype, f"grad_h0 {what}")


@pytest.mark.parametrize("T, B, H", list(itertools.product([1, 2, 7, 70, 300], [1, 3, 20], [1, 5, 64, 1550])))
def test_float32_shape_grid(T, B, H):
    with_h0 = bool(torch.randint(2, ()).item())  # both cases show up across the grid
    check_against_reference(T, B, H, torch.float32, batch_first=False, with_h0=with_h0)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("T, B, H", [(1, 1, 1), (7, 3, 5), (70, 20, 1550), (300, 3, 64)])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_dtypes_layouts(dtype, T, B, H, batch_first, with_h0):
    check_against_reference(T, B, H, dtype, batch_first, with_h0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_float32_state_with_16bit_sequence(dtype):
    """A float32 carried state with 16-bit gates: math and state stay float32."""
    f, x, _ = make_inputs(30, 4, 33, dtype)
    h0 = torch.randn(4, 33, dtype=torch.float32, requires_grad=True)
    h = qrnn.forget_mult(f, x, h0)
    ref = forget_mult_reference(f.double(), x.double(), h0.detach().double())
    assert_close_to_reference(h, ref, dtype, "h")
    h.float().sum().backward()
    assert h0.grad.dtype == torch.float32
    ref_h0 = h0.detach().double().requires_grad_()
    forget_mult_reference(f.double(), x.double(), ref_h0).sum().backward()
    assert_close_to_reference(h0.grad, ref_h0.grad, dtype, "grad_h0")


@pytest.mark.parametrize("view", ["transposed", "sliced", "reversed", "expanded", "every_other"])
def test_non_contiguous_inputs(view):
    T, B, H = 9, 4, 37
    base_f, base_x = torch.rand(T, B, 2 * H, dtype=torch.float64), torch.randn(T, B, 2 * H, dtype=torch.float64)
    if view == "transposed":  # stored batch-major, viewed time-major
        f, x = torch.rand(B, T, H).transpose(0, 1), torch.randn(B, T, H).transpose(0, 1)
    elif view == "sliced":
        f, x = base_f.float()[:, :, 3:3 + H], base_x.float()[:, :, 5:5 + H]
    elif view == "reversed":  # a flipped copy, then a strided view of it
        f, x = base_f.float().flip(0)[:, :, :H], base_x.float().flip(0)[:, :, H:]
    elif view == "expanded":  # stride 0 along batch
        f = torch.rand(T, 1, H).expand(T, B, H)
        x = torch.randn(T, 1, H).expand(T, B, H)
    else:
        f, x = base_f.float()[:, :, ::2], base_x.float()[:, :, 1::2]
    assert not (f.is_contiguous() and x.is_contiguous())
    h0 = torch.randn(B, 2 * H)[:, ::2]  # strided h0 too
    h = qrnn.forget_mult(f, x, h0)
    assert_close_to_reference(h, forget_mult_reference(f.double(), x.double(), h0.double()), torch.float32, view)


def test_every_element_written():
    """Poison the allocator's memory first: any element the kernel skips stays NaN."""
    T, B, H = 13, 5, 1031  # odd sizes: partial blocks everywhere
    for _ in range(3):
        poison = torch.full((T * B * H * 4,), float("nan"))
        del poison
        f, x, h0 = make_inputs(T, B, H, torch.float32, requires_grad=True)
        h = qrnn.forget_mult(f, x, h0)
        assert not h.isnan().any()
        h.backward(torch.randn_like(h))
        assert not (f.grad.isnan().any() or x.grad.isnan().any() or h0.grad.isnan().any())


def test_every_element_written_by_kernel():
    """Call the kernels directly on NaN-filled outputs (no allocator luck involved)."""
    T, B, H = 7, 3, 517
    f, x, h0 = make_inputs(T, B, H, torch.float32)

    h = torch.full((T, B, H), float("nan"))
    qrnn._C.forget_mult_forward(*forward_args(h, f, x, h0, False), 2)
    assert not h.isnan().any()
    gf, gx, gh0 = (torch.full_like(t, float("nan")) for t in (f, x, h0))
    gh = torch.randn(T, B, H)
    qrnn._C.forget_mult_backward(*backward_args(gf, gx, gh0, gh, f, x, h, h0, False), 2)
    assert not (gf.isnan().any() or gx.isnan().any() or gh0.isnan().any())


def test_known_values():
    """The worked example of the original test suite: x = 3..7, f = 0.5, h0 = 1 gives 2..6."""
    x = torch.tensor([3.0, 4, 5, 6, 7], dtype=torch.float64).view(5, 1, 1)
    f = torch.full_like(x, 0.5)
    h = qrnn.forget_mult(f, x, torch.ones(1, 1, dtype=torch.float64))
    assert h.flatten().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_gradcheck_float64(batch_first, with_h0):
    f, x, h0 = make_inputs(6, 3, 5, torch.float64, batch_first=batch_first, with_h0=with_h0, requires_grad=True)
    inputs = (f, x, h0) if with_h0 else (f, x)
    fn = (lambda f, x, h0: qrnn.forget_mult(f, x, h0, batch_first=batch_first)) if with_h0 else \
         (lambda f, x: qrnn.forget_mult(f, x, batch_first=batch_first))
    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_h0", [False, True])
def test_opcheck(dtype, with_h0):
    f, x, h0 = make_inputs(5, 3, 7, dtype, with_h0=with_h0, requires_grad=True)
    torch.library.opcheck(torch.ops.qrnn.forget_mult.default, (f, x, h0, False))
    torch.library.opcheck(torch.ops.qrnn.forget_mult.default, (f.transpose(0, 1), x.transpose(0, 1),
                                                               h0, True))
    h = qrnn.forget_mult(f, x, h0).detach()
    grad_h = torch.randn_like(h)
    torch.library.opcheck(torch.ops.qrnn.forget_mult_backward.default,
                          (grad_h, f.detach(), x.detach(), h, None if h0 is None else h0.detach(), False))


def test_torch_compile_fullgraph():
    torch._dynamo.reset()

    def model(f_logits, x, h0):
        h = qrnn.forget_mult(torch.sigmoid(f_logits), torch.tanh(x), h0)
        return (h * h).sum()

    compiled = torch.compile(model, fullgraph=True)
    f, x, h0 = make_inputs(11, 4, 19, torch.float32, requires_grad=True)
    loss = compiled(f, x, h0)
    loss.backward()
    grads = [t.grad.clone() for t in (f, x, h0)]
    for t in (f, x, h0):
        t.grad = None
    expected = model(f, x, h0)
    expected.backward()
    torch.testing.assert_close(loss, expected)
    for got, t in zip(grads, (f, x, h0)):
        torch.testing.assert_close(got, t.grad)


def test_direct_path_matches_op_path():
    f, x, h0 = make_inputs(8, 3, 21, torch.float32)
    with torch.no_grad():
        direct = qrnn.forget_mult(f, x, h0)
    via_op = torch.ops.qrnn.forget_mult(f, x, h0, False)
    assert torch.equal(direct, via_op)


@pytest.mark.parametrize("shape", [(0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0)])
def test_zero_size(shape):
    f = torch.rand(shape, requires_grad=True)
    x = torch.randn(shape, requires_grad=True)
    h0 = torch.randn(shape[1], shape[2], requires_grad=True)
    h = qrnn.forget_mult(f, x, h0)
    assert h.shape == shape
    h.sum().backward()
    assert f.grad.shape == shape and h0.grad.shape == h0.shape
    assert (h0.grad == 0).all()


def test_threads_agree():
    """The result does not depend on how many threads split the work."""
    assert_threads_agree(qrnn.forget_mult, *make_inputs(50, 7, 1500, torch.float32))


BAD_INPUTS = scan_bad_inputs(qrnn.forget_mult, "forget_mult", "f", "x") + [
    (lambda: qrnn.forget_mult(torch.ones(2, 2, 2, dtype=torch.int64), torch.ones(2, 2, 2, dtype=torch.int64)),
     TypeError, "torch.int64"),
    (lambda: qrnn.forget_mult(torch.rand(2, 3, 4), torch.rand(2, 3, 4), torch.rand(3, 4, dtype=torch.float64)),
     TypeError, "h0 must have dtype"),
    (lambda: qrnn.forget_mult(torch.rand(2, 3, 4), torch.rand(2, 3, 4), "h0"), TypeError, "h0 must be"),
]


@pytest.mark.parametrize("call, error, message", BAD_INPUTS)
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("entry", ["forget_mult_forward", "linear_scan_forward"])
def test_core_validates_again(entry):
    """The scan families' C++ cores reject bad sizes themselves (Python's checks are not
    trusted); both take the same fields: dtype, sizes, two sequences, h0, its dtype, the
    sequences (lengths, its stride, cu_seqlens, reverse), h."""
    fwd = getattr(qrnn._C, entry)
    # f (a), x (b), no h0, h0 dtype, no lengths or cu_seqlens, h
    views = (8, 1, 1, 1, 8, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 8, 1, 1, 1)
    with pytest.raises(ValueError, match="seq_len"):
        fwd(0, -1, 1, 1, *views, 1)
    with pytest.raises(ValueError, match="null pointer"):
        fwd(0, 2, 1, 1, 0, 1, 1, 1, *views[4:], 1)
    with pytest.raises(ValueError, match="overflow"):
        fwd(0, 2**40, 2**40, 2, *views, 1)
    with pytest.raises(ValueError, match="dtype"):
        fwd(7, 1, 1, 1, *views, 1)
    with pytest.raises(TypeError, match="takes 25 arguments"):
        fwd(0, 1, 1, 1)
    with pytest.raises(TypeError):
        fwd(0, 1.5, 1, 1, *views, 1)


def test_build_info():
    info = qrnn.build_info()
    assert info["version"] == qrnn.__version__
    assert info["simd"] in ("generic", "avx2", "avx512", "avx512_bf16")
    assert isinstance(info["cuda"], bool)


def test_kernel_argument_lists_are_defined_once():
    """Python's argument builders are generated from qrnn._C's own field lists, and a list
    they cannot fill (a field renamed in C++, or an expression of the wrong size) fails
    at import with KernelArgsError instead of passing misread pointers."""
    from qrnn.ops.core import kernel_args

    fields = qrnn._C.kernel_fields()
    assert {"forget_mult_forward", "forget_mult_backward", "qrnn_gates_forward", "qrnn_gates_backward"} <= set(fields)
    assert [name for _, name in fields["forget_mult_forward"]][:4] == ["dtype", "seq_len", "batch", "hidden"]
    assert {getattr(torch, name) for name in qrnn._C.dtype_codes()} == set(kernel_args.DTYPE_CODES)
    f = torch.rand(2, 3, 4)
    sources = {"dtype": "0", "seq_len": "2", "batch": "3", "hidden": "4", "f": "f", "x": "f", "h0": "view2(None)",
               "h0_dtype": "0", "lengths": "0", "lengths_stride": "1", "cu_seqlens": "0", "reverse": "0", "h": "f"}
    build = kernel_args.generate("forget_mult_forward", "f", "", sources, [(f,)])
    assert len(build(f)) == 24
    with pytest.raises(kernel_args.KernelArgsError, match=r"fields \['h'\] have no Python expression"):
        kernel_args.generate("forget_mult_forward", "f", "", {k: v for k, v in sources.items() if k != "h"}, [])
    with pytest.raises(kernel_args.KernelArgsError, match=r"\['hidden_size'\] are not qrnn._C fields"):
        kernel_args.generate("forget_mult_forward", "f", "", {**sources, "hidden_size": "4"}, [])
    with pytest.raises(kernel_args.KernelArgsError, match="field h0 .* expected 3"):
        kernel_args.generate("forget_mult_forward", "f", "", {**sources, "h0": "(0, 0)"}, [(f,)])


def test_python_m_qrnn_self_check_and_folders(capsys):
    """`python -m qrnn`: build information and the kernels checked against float64 on this
    machine; --cmake-dir / --include-dir print the folders a C++ project needs."""
    from qrnn.__main__ import main

    assert main([]) == 0
    out = capsys.readouterr().out
    assert "self-check passed" in out and out.count(" ok") >= 6 and "linear_scan" in out
    assert main(["--cmake-dir"]) == 0 and capsys.readouterr().out.strip() == qrnn.cmake_dir()
    assert main(["--include-dir"]) == 0 and capsys.readouterr().out.strip() == qrnn.include_dir()
