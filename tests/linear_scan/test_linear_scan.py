"""qrnn.linear_scan (h[t] = a[t] h[t-1] + b[t]) on the CPU against the float64 reference, plus
the op machinery: gradcheck, forward AD, torch.func, opcheck, torch.compile, torch.export,
DTensor-free fallbacks, bad input, and every element written."""

import itertools

import pytest
import torch
from torch.func import grad, jvp, vmap

import qrnn
from conftest import CPU_DTYPES, assert_close_to_reference, assert_threads_agree, scan_bad_inputs
from qrnn.ops.linear_scan import KERNELS
from qrnn.ops.linear_scan.kernels import backward_args, forward_args
from qrnn.ops.linear_scan.reference import linear_scan_backward_reference, linear_scan_reference

HALF = (torch.bfloat16, torch.float16)


def make_inputs(T, B, H, dtype, *, batch_first=False, with_h0=True, requires_grad=False):
    """Decays in (0, 1), inputs and a state in the kernels' state dtype, never zeros."""
    shape = (B, T, H) if batch_first else (T, B, H)
    a = torch.rand(shape, dtype=torch.float64).to(dtype)
    b = torch.randn(shape, dtype=torch.float64).to(dtype)
    h0 = torch.randn(B, H, dtype=torch.float64).to(torch.float32 if dtype in HALF else dtype) if with_h0 else None
    if requires_grad:
        for t in (a, b, h0):
            if t is not None:
                t.requires_grad_()
    return a, b, h0


def as64(t):
    return None if t is None else t.detach().double()


CASES = list(itertools.product(CPU_DTYPES, [(1, 1, 1), (7, 3, 5), (70, 20, 1550), (300, 3, 64)], [False, True],
                               [False, True], [False, True]))


@pytest.mark.parametrize("dtype, shape, batch_first, with_h0, reverse", CASES,
                         ids=[f"{str(c[0])[6:]}-{'x'.join(map(str, c[1]))}-{'bf' if c[2] else 'tm'}-"
                              f"{'h0' if c[3] else 'no_h0'}-{'rev' if c[4] else 'fwd'}" for c in CASES])
def test_against_float64_reference(dtype, shape, batch_first, with_h0, reverse):
    """Forward against the float64 recurrence; gradients against the float64 backward of the
    stored h (16-bit storage rounds h, which grad_a = h[t-1] g inherits: see conftest)."""
    a, b, h0 = make_inputs(*shape, dtype, batch_first=batch_first, with_h0=with_h0, requires_grad=True)
    h = qrnn.linear_scan(a, b, h0, reverse=reverse, batch_first=batch_first)
    assert h.dtype == dtype and h.shape == a.shape
    expected = linear_scan_reference(as64(a), as64(b), as64(h0), reverse=reverse, batch_first=batch_first)
    assert_close_to_reference(h, expected, dtype, "h")
    grad_h = torch.randn_like(h)
    h.backward(grad_h)
    ref_a, ref_b, ref_h0 = linear_scan_backward_reference(as64(grad_h), as64(a), as64(h), as64(h0), reverse=reverse,
                                                          batch_first=batch_first)
    assert_close_to_reference(a.grad, ref_a, dtype, "grad_a")
    assert_close_to_reference(b.grad, ref_b, dtype, "grad_b")
    if with_h0:
        assert h0.grad.dtype == h0.dtype
        assert_close_to_reference(h0.grad, ref_h0, dtype, "grad_h0")


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_backward_reference_matches_autograd(reverse, batch_first):
    a, b, h0 = make_inputs(9, 3, 4, torch.float64, batch_first=batch_first, requires_grad=True)
    h = linear_scan_reference(a, b, h0, reverse=reverse, batch_first=batch_first)
    grad_h = torch.randn_like(h)
    expected = torch.autograd.grad(h, (a, b, h0), grad_h)
    actual = linear_scan_backward_reference(grad_h, a.detach(), h.detach(), h0.detach(), reverse=reverse,
                                            batch_first=batch_first)
    for e, got in zip(expected, actual):
        torch.testing.assert_close(got, e, atol=1e-12, rtol=1e-12)


def test_known_values():
    """a = 0.5, b = 0.5, h0 = 2: h = 1.5, 1.25, 1.125, 1.0625; reversed, from the last step."""
    a, b = torch.full((4, 1, 1), 0.5, dtype=torch.float64), torch.full((4, 1, 1), 0.5, dtype=torch.float64)
    h0 = torch.full((1, 1), 2.0, dtype=torch.float64)
    assert qrnn.linear_scan(a, b, h0).flatten().tolist() == [1.5, 1.25, 1.125, 1.0625]
    assert qrnn.linear_scan(a, b, h0, reverse=True).flatten().tolist() == [1.0625, 1.125, 1.25, 1.5]


@pytest.mark.parametrize("view", ["transposed", "sliced", "expanded", "every_other", "flipped_strides"])
def test_any_strides(view):
    T, B, H = 11, 4, 37
    a, b, h0 = make_inputs(T, B, H, torch.float32)
    if view == "transposed":  # batch-major memory read as time-major
        a, b = a.transpose(0, 1).contiguous().transpose(0, 1), b.transpose(0, 1).contiguous().transpose(0, 1)
    elif view == "sliced":
        a, b = make_inputs(T, B, 2 * H, torch.float32)[0][..., H:], make_inputs(T, B, 2 * H, torch.float32)[1][..., :H]
    elif view == "expanded":  # one decay per unit, shared by every step and row (stride 0)
        a = torch.rand(1, 1, H).expand(T, B, H)
    elif view == "every_other":
        a, b = torch.rand(T, B, 2 * H)[..., ::2], torch.randn(T, B, 2 * H)[..., 1::2]
    else:  # hidden-major memory
        a, b = a.permute(2, 0, 1).contiguous().permute(1, 2, 0), b.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    h0 = torch.randn(B, 2 * H)[:, ::2]
    for reverse in (False, True):
        h = qrnn.linear_scan(a, b, h0, reverse=reverse)
        assert_close_to_reference(h, linear_scan_reference(as64(a), as64(b), as64(h0), reverse=reverse),
                                  torch.float32, view)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_every_element_written_by_kernel(reverse, batch_first):
    """The kernels write into NaN-filled outputs of odd sizes (partial blocks everywhere)."""
    T, B, H = 7, 3, 517
    a, b, h0 = make_inputs(T, B, H, torch.float32, batch_first=batch_first)
    h = torch.full_like(a, float("nan"))
    qrnn._C.linear_scan_forward(*forward_args(h, a, b, h0, reverse, batch_first), 2)
    assert not h.isnan().any()
    grads = [torch.full_like(a, float("nan")), torch.full_like(a, float("nan")), torch.full_like(h0, float("nan"))]
    grad_h = torch.randn_like(a)  # held: the argument tuple holds addresses, not tensors
    qrnn._C.linear_scan_backward(*backward_args(*grads, grad_h, a, h, h0, reverse, batch_first), 2)
    assert not any(g.isnan().any() for g in grads)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_gradcheck_float64(reverse, batch_first, with_h0):
    inputs = make_inputs(6, 3, 4, torch.float64, batch_first=batch_first, with_h0=with_h0, requires_grad=True)
    inputs = tuple(t for t in inputs if t is not None)

    def fn(a, b, h0=None):
        return qrnn.linear_scan(a, b, h0, reverse=reverse, batch_first=batch_first)

    assert torch.autograd.gradcheck(fn, inputs, check_forward_ad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
def test_opcheck(dtype, with_h0, reverse):
    a, b, h0 = make_inputs(5, 3, 8, dtype, with_h0=with_h0, requires_grad=True)
    torch.library.opcheck(torch.ops.qrnn.linear_scan.default, (a, b, h0, reverse, False))
    h = qrnn.linear_scan(a, b, h0, reverse=reverse).detach()
    torch.library.opcheck(torch.ops.qrnn.linear_scan_backward.default,
                          (torch.randn_like(h), a.detach(), h, None if h0 is None else h0.detach(), reverse, False))


def test_torch_compile_fullgraph():
    a, b, h0 = make_inputs(9, 3, 16, torch.float32, requires_grad=True)

    def step(a, b, h0):
        return qrnn.linear_scan(torch.sigmoid(a), b * 2, h0, reverse=True).square().sum()

    compiled = torch.compile(step, fullgraph=True)
    eager_loss = step(a, b, h0)
    eager_grads = torch.autograd.grad(eager_loss, (a, b, h0))
    loss = compiled(a, b, h0)
    grads = torch.autograd.grad(loss, (a, b, h0))
    torch.testing.assert_close(loss, eager_loss)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e)


def test_torch_export_keeps_the_op():
    class Scan(torch.nn.Module):
        def forward(self, a, b):
            return qrnn.linear_scan(a, b, reverse=True, batch_first=True)

    a, b, _ = make_inputs(6, 2, 5, torch.float32, batch_first=True)
    program = torch.export.export(Scan(), (a, b))
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.qrnn.linear_scan.default in targets
    a2, b2, _ = make_inputs(6, 2, 5, torch.float32, batch_first=True)
    torch.testing.assert_close(program.module()(a2, b2), qrnn.linear_scan(a2, b2, reverse=True, batch_first=True))


def test_torch_func_transforms():
    a, b, h0 = make_inputs(8, 3, 5, torch.float64)
    # grad, vmap over an extra leading dimension, and jvp against the reference's own jvp
    g = grad(lambda a: qrnn.linear_scan(a, b, h0, reverse=True).square().sum())(a)
    g_ref = torch.func.grad(lambda a: linear_scan_reference(a, b, h0, reverse=True).square().sum())(a)
    torch.testing.assert_close(g, g_ref)
    stacked_a, stacked_b = torch.stack([a, a.flip(0)]), torch.stack([b, -b])
    batched = vmap(lambda a, b: qrnn.linear_scan(a, b, h0))(stacked_a, stacked_b)
    for i in range(2):
        torch.testing.assert_close(batched[i], linear_scan_reference(stacked_a[i], stacked_b[i], h0))
    tangents = tuple(torch.randn_like(t) for t in (a, b, h0))
    _, out = jvp(lambda a, b, h0: qrnn.linear_scan(a, b, h0, reverse=True), (a, b, h0), tangents)
    _, expected = jvp(lambda a, b, h0: linear_scan_reference(a, b, h0, reverse=True), (a, b, h0), tangents)
    torch.testing.assert_close(out, expected)


def test_direct_path_matches_op_path_and_fallback():
    a, b, h0 = make_inputs(8, 3, 21, torch.float32)
    with torch.no_grad():
        direct = qrnn.linear_scan(a, b, h0, reverse=True)
    assert torch.equal(direct, torch.ops.qrnn.linear_scan(a, b, h0, True, False))
    previous = KERNELS.set("cpu", None, None)  # the pure-PyTorch bodies, as on a device without kernels
    try:
        assert not KERNELS.has("cpu")
        a_g, b_g = a.clone().requires_grad_(), b.clone().requires_grad_()
        fallback = qrnn.linear_scan(a_g, b_g, h0, reverse=True)
        fallback.sum().backward()
    finally:
        KERNELS.set("cpu", *previous)
    assert_close_to_reference(fallback, direct, torch.float32, "fallback")
    a_k, b_k = a.clone().requires_grad_(), b.clone().requires_grad_()
    qrnn.linear_scan(a_k, b_k, h0, reverse=True).sum().backward()
    assert_close_to_reference(a_g.grad, a_k.grad, torch.float32, "fallback grad_a")


@pytest.mark.parametrize("shape", [(0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0)])
def test_zero_size(shape):
    a, b = torch.rand(shape, requires_grad=True), torch.randn(shape, requires_grad=True)
    h0 = torch.randn(shape[1], shape[2], requires_grad=True)
    h = qrnn.linear_scan(a, b, h0, reverse=True)
    assert h.shape == shape
    h.sum().backward()
    assert a.grad.shape == shape and (h0.grad == 0).all()


def test_threads_agree():
    assert_threads_agree(qrnn.linear_scan, *make_inputs(50, 7, 1500, torch.float32))


BAD_INPUTS = scan_bad_inputs(qrnn.linear_scan, "linear_scan", "a", "b") + [
    (lambda: qrnn.linear_scan(torch.rand(2, 3, 4), torch.rand(2, 3, 4), reverse=1), TypeError,
     "reverse must be a bool"),
    (lambda: qrnn.linear_scan(torch.rand(2, 3, 4), torch.rand(2, 3, 4), batch_first="yes"), TypeError,
     "batch_first must be a bool"),
]


@pytest.mark.parametrize("call, error, message", BAD_INPUTS)
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()
