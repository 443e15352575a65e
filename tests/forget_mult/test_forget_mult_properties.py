"""Property-based tests of qrnn.forget_mult (hypothesis): random shapes, memory layouts,
dtypes and initial states, every case compared with the float64 reference."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import qrnn
from conftest import CPU_DTYPES, assert_close_to_reference, assert_forget_mult_grads
from property_cases import LAYOUTS_2D, LAYOUTS_3D, SETTINGS, describe, make_tensor
from qrnn.ops.forget_mult.reference import forget_mult_reference


@st.composite
def forget_mult_cases(draw):
    dtype = draw(st.sampled_from(CPU_DTYPES))
    T = draw(st.integers(0, 12))
    B = draw(st.integers(0, 5))
    H = draw(st.one_of(st.integers(0, 40), st.integers(500, 530)))  # around the 512-unit work block
    batch_first = draw(st.booleans())
    h0_mode = draw(st.sampled_from(["none", "same", "float32"] if dtype in (torch.bfloat16, torch.float16)
                                   else ["none", "same"]))
    return dict(
        dtype=dtype, T=T, B=B, H=H, batch_first=batch_first, h0_mode=h0_mode,
        f_layout=draw(st.sampled_from(LAYOUTS_3D)), x_layout=draw(st.sampled_from(LAYOUTS_3D)),
        grad_layout=draw(st.sampled_from(LAYOUTS_3D)), h0_layout=draw(st.sampled_from(LAYOUTS_2D)),
        expand_dims=draw(st.lists(st.integers(0, 2), min_size=3, max_size=3)),
        requires_grad=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)),
    )


def build(case):
    gen = torch.Generator().manual_seed(case["seed"])
    T, B, H, dtype = case["T"], case["B"], case["H"], case["dtype"]
    shape = (B, T, H) if case["batch_first"] else (T, B, H)
    e = case["expand_dims"]
    f = make_tensor(shape, dtype, case["f_layout"], "gate", gen, e[0])
    x = make_tensor(shape, dtype, case["x_layout"], "value", gen, e[1])
    h0 = None
    if case["h0_mode"] != "none":
        h0_dtype = torch.float32 if case["h0_mode"] == "float32" else dtype
        h0 = make_tensor((B, H), h0_dtype, case["h0_layout"], "value", gen, e[2] % 2)
    grad_h = make_tensor(shape, dtype, case["grad_layout"], "value", gen, e[0])
    return f, x, h0, grad_h


@SETTINGS
@given(forget_mult_cases())
def test_forget_mult_matches_reference(case):
    f, x, h0, grad_h = build(case)
    dtype, batch_first, what = case["dtype"], case["batch_first"], describe(case)
    f64, x64 = f.double(), x.double()
    h064 = h0.double() if h0 is not None else None
    ref_h = forget_mult_reference(f64, x64, h064, batch_first=batch_first)

    if not case["requires_grad"]:
        h = qrnn.forget_mult(f, x, h0, batch_first=batch_first)
        assert h.shape == f.shape and h.dtype == dtype
        assert_close_to_reference(h, ref_h, dtype, f"h {what}")
        return

    # Leaves that keep the drawn layouts (detach() shares storage and strides).
    f, x = f.detach().requires_grad_(), x.detach().requires_grad_()
    if h0 is not None:
        h0 = h0.detach().requires_grad_()
    h = qrnn.forget_mult(f, x, h0, batch_first=batch_first)
    assert_close_to_reference(h, ref_h, dtype, f"h {what}")
    assert_forget_mult_grads(h, grad_h, f, x, h0, batch_first, dtype, what)


@SETTINGS
@given(forget_mult_cases())
def test_batch_first_is_a_transpose(case):
    """batch_first only changes which dim is time: results agree bit for bit."""
    f, x, h0, _ = build(case)
    bf = case["batch_first"]
    h = qrnn.forget_mult(f, x, h0, batch_first=bf)
    h_other = qrnn.forget_mult(f.transpose(0, 1), x.transpose(0, 1), h0, batch_first=not bf)
    assert torch.equal(h.transpose(0, 1), h_other)
