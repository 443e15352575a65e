"""Bad-input sweep of qrnn.forget_mult and its ops: wrong types, shapes, dtypes, devices,
layouts, NaN/Inf values and empty tensors. Each call must raise a TypeError or ValueError
naming the argument, or propagate the values correctly; never crash or hang.
"""

import numpy as np
import pytest
import torch

import qrnn
from conftest import reference_grads
from qrnn.ops.forget_mult.reference import forget_mult_reference

T, B, H = 4, 3, 5

NON_TENSORS = [None, 1, 1.5, "f", [1.0, 2.0], np.ones((T, B, H), dtype=np.float32), object()]
BAD_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
              torch.complex64, torch.complex128]
if hasattr(torch, "float8_e4m3fn"):
    BAD_DTYPES.append(torch.float8_e4m3fn)


def gates(shape=(T, B, H), dtype=torch.float32):
    return torch.rand(shape, dtype=torch.float64).to(dtype)


def values(shape=(T, B, H), dtype=torch.float32):
    return torch.randn(shape, dtype=torch.float64).to(dtype)


def tensor_of(dtype, shape=(T, B, H)):
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype)
    if dtype.is_floating_point:
        return torch.rand(shape).to(dtype)
    return torch.ones(shape, dtype=dtype)


# ---- wrong types ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", NON_TENSORS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("argument", ["f", "x"])
def test_forget_mult_non_tensor(argument, bad):
    args = {"f": gates(), "x": values()}
    args[argument] = bad
    with pytest.raises(TypeError, match=f"{argument} must be a torch.Tensor"):
        qrnn.forget_mult(args["f"], args["x"])


@pytest.mark.parametrize("bad", [1, 1.5, "h0", [0.0], np.zeros((B, H), dtype=np.float32)],
                         ids=lambda v: type(v).__name__)
def test_forget_mult_h0_non_tensor(bad):
    with pytest.raises(TypeError, match="h0 must be a torch.Tensor or None"):
        qrnn.forget_mult(gates(), values(), bad)


@pytest.mark.parametrize("bad", [None, 0, 1, "True", 1.0, torch.tensor(True)], ids=repr)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_forget_mult_batch_first_not_bool(bad, requires_grad):
    f = gates().requires_grad_(requires_grad)
    with pytest.raises(TypeError, match="batch_first must be a bool"):
        qrnn.forget_mult(f, values(), batch_first=bad)


def test_forget_mult_positional_batch_first_rejected():
    with pytest.raises(TypeError):
        qrnn.forget_mult(gates(), values(), None, True)


# ---- wrong dtypes --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("path", ["direct", "autograd", "op"])
def test_forget_mult_bad_dtype(dtype, path):
    f, x = tensor_of(dtype), tensor_of(dtype)
    with pytest.raises(TypeError, match=str(dtype)):
        if path == "op":  # the registered op checks on its own, whoever calls it
            torch.ops.qrnn.forget_mult(f, x, None, False)
        elif path == "autograd":
            with torch.enable_grad():
                qrnn.forget_mult(f, gates().requires_grad_())
        else:
            qrnn.forget_mult(f, x)


@pytest.mark.parametrize("f_dtype, x_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.float16),
                                              (torch.float16, torch.float32), (torch.float32, torch.int32)])
def test_forget_mult_mixed_dtypes(f_dtype, x_dtype):
    with pytest.raises(TypeError, match="x must have f's dtype"):
        qrnn.forget_mult(gates(dtype=f_dtype), tensor_of(x_dtype))


@pytest.mark.parametrize("f_dtype, h0_dtype", [
    (torch.float32, torch.float64), (torch.float32, torch.bfloat16), (torch.float64, torch.float32),
    (torch.bfloat16, torch.float16), (torch.float16, torch.float64), (torch.float32, torch.int64),
    (torch.float32, torch.bool), (torch.float32, torch.complex64)])
def test_forget_mult_h0_bad_dtype(f_dtype, h0_dtype):
    with pytest.raises(TypeError, match="h0 must have dtype"):
        qrnn.forget_mult(gates(dtype=f_dtype), values(dtype=f_dtype), tensor_of(h0_dtype, (B, H)))


# ---- wrong shapes --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (5,), (4, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)], ids=str)
def test_forget_mult_not_3d(shape):
    with pytest.raises(ValueError, match="f must be 3-D"):
        qrnn.forget_mult(gates(shape), values(shape))


@pytest.mark.parametrize("x_shape", [(T + 1, B, H), (T, B + 1, H), (T, B, H - 1), (T, B), (1, B, H), (T, 1, H)],
                         ids=str)
@pytest.mark.parametrize("path", ["direct", "op"])
def test_forget_mult_x_shape_mismatch(x_shape, path):
    """Includes broadcastable shapes: x is never broadcast (and never read out of bounds)."""
    call = (lambda f, x: torch.ops.qrnn.forget_mult(f, x, None, False)) if path == "op" else qrnn.forget_mult
    with pytest.raises(ValueError, match="x must have f's shape"):
        call(gates(), values(x_shape))


@pytest.mark.parametrize("h0_shape", [(B,), (H,), (B, H, 1), (1, B, H), (H, B), (1, H), (B, 1), ()], ids=str)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("path", ["direct", "op"])
def test_forget_mult_h0_bad_shape(h0_shape, batch_first, path):
    shape = (B, T, H) if batch_first else (T, B, H)
    f, x, h0 = gates(shape), values(shape), values(h0_shape)
    with pytest.raises(ValueError, match="h0 must have shape"):
        if path == "op":
            torch.ops.qrnn.forget_mult(f, x, h0, batch_first)
        else:
            qrnn.forget_mult(f, x, h0, batch_first=batch_first)


@pytest.mark.parametrize("bad", ["grad_h_shape", "h_shape", "grad_h_dtype", "h_dtype"])
def test_forget_mult_backward_op_checks(bad):
    """The backward op, callable as torch.ops.qrnn.forget_mult_backward, checks its inputs
    (non-tensor arguments never reach it: the dispatcher's schema check rejects them)."""
    f, x = gates(), values()
    h, grad_h = values(), values()
    if bad == "grad_h_shape":
        grad_h, error = values((1, 1, 1)), ValueError
    elif bad == "h_shape":
        h, error = values((T, B, 1)), ValueError
    elif bad == "grad_h_dtype":
        grad_h, error = values(dtype=torch.float64), TypeError
    else:
        h, error = tensor_of(torch.int32), TypeError
    with pytest.raises(error, match=bad.rsplit("_", 1)[0]):
        torch.ops.qrnn.forget_mult_backward(grad_h, f, x, h, None, False)


# ---- devices and layouts ------------------------------------------------------------------

@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_forget_mult_meta_tensors_propagate_shape(requires_grad, with_h0):
    """Meta tensors (shape inference, deferred init) give a meta result of the right shape."""
    f = torch.empty(T, B, H, device="meta", requires_grad=requires_grad)
    x = torch.empty(T, B, H, device="meta")
    h0 = torch.empty(B, H, device="meta") if with_h0 else None
    h = qrnn.forget_mult(f, x, h0)
    assert h.device.type == "meta" and h.shape == (T, B, H) and h.dtype == torch.float32


@pytest.mark.parametrize("meta", ["x", "h0", "f"])
def test_forget_mult_mixed_devices(meta):
    args = {"f": gates(), "x": values(), "h0": values((B, H))}
    args[meta] = args[meta].to("meta")
    with pytest.raises(ValueError, match="must be on f's device"):
        qrnn.forget_mult(args["f"], args["x"], args["h0"])


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "nested"])
@pytest.mark.parametrize("argument", ["f", "x", "h0"])
def test_forget_mult_non_dense(layout, argument):
    args = {"f": gates(), "x": values(), "h0": values((B, H))}
    t = args[argument]
    if layout == "sparse_coo":
        t = t.to_sparse()
    elif layout == "sparse_csr":
        t = t.to_sparse_csr()
    else:
        t = torch.nested.nested_tensor(list(t.unbind(0)))
    args[argument] = t
    with pytest.raises((TypeError, ValueError), match=argument):
        qrnn.forget_mult(args["f"], args["x"], args["h0"])


def test_forget_mult_negative_bit_view_is_read_as_its_values():
    """complex.conj().imag is a real view with the negative bit set: the kernel must see -v."""
    c = torch.randn(T, B, H, dtype=torch.complex128)
    x = c.conj().imag
    assert x.is_neg()
    f = gates(dtype=torch.float64)
    expected = forget_mult_reference(f, x.resolve_neg())
    torch.testing.assert_close(qrnn.forget_mult(f, x), expected)
    torch.testing.assert_close(qrnn.forget_mult(f, x, x[0]), forget_mult_reference(f, x.resolve_neg(),
                                                                                    x[0].resolve_neg()))


# ---- NaN and Inf ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("where", ["x", "f", "h0", "grad"])
def test_forget_mult_nan_inf_propagate(dtype, where):
    """Non-finite values flow through exactly as in the plain formula (same NaN positions)."""
    f, x, h0 = gates(dtype=dtype), values(dtype=dtype), values((B, H), dtype=dtype)
    grad = values(dtype=dtype)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    target = {"x": x, "f": f, "h0": h0, "grad": grad}[where]
    flat = target.view(-1)
    flat[:3] = specials
    if where == "f":
        flat[3:5] = torch.tensor([0.0, 1.0], dtype=dtype)  # f = 0 or 1 exactly: inf * 0 and friends
    for t in (f, x, h0):
        t.requires_grad_()
    h = qrnn.forget_mult(f, x, h0)
    h.backward(grad)
    f64, x64, h064 = f.detach().double(), x.detach().double(), h0.detach().double()
    ref_h = forget_mult_reference(f64, x64, h064)
    ref_df, ref_dx, ref_dh0 = reference_grads(grad, f, x, h, h0)
    if where != "grad":
        assert not torch.isfinite(h).all(), "the non-finite input vanished"
    for got, ref, name in ((h, ref_h, "h"), (f.grad, ref_df, "grad_f"), (x.grad, ref_dx, "grad_x"),
                           (h0.grad, ref_dh0, "grad_h0")):
        got = got.detach().double()
        # Same non-finite pattern (NaN where NaN, same-signed Inf where Inf) ...
        assert torch.equal(torch.isnan(got), torch.isnan(ref)), name
        assert torch.equal(got[torch.isinf(ref)], ref[torch.isinf(ref)]), name
        # ... and the finite elements close (16-bit inputs: same tolerance as everywhere).
        finite = torch.isfinite(ref)
        atol, rtol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype], 2e-2
        torch.testing.assert_close(got[finite], ref[finite], atol=atol, rtol=rtol, msg=name)


# ---- empty tensors ------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, B, H), (T, 0, H), (T, B, 0), (0, 0, 0), (0, 1, 1)], ids=str)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_forget_mult_empty(shape, batch_first, dtype):
    f = gates(shape, dtype).requires_grad_()
    x = values(shape, dtype).requires_grad_()
    batch, hidden = (shape[0], shape[2]) if batch_first else (shape[1], shape[2])
    h0 = values((batch, hidden), dtype).requires_grad_()
    h = qrnn.forget_mult(f, x, h0, batch_first=batch_first)
    assert h.shape == shape and h.dtype == dtype
    h.sum().backward()
    assert f.grad.shape == shape and x.grad.shape == shape
    seq_len = shape[1] if batch_first else shape[0]
    if seq_len == 0:  # nothing reaches h: the gradient of h0 is exactly zero
        assert (h0.grad == 0).all()
