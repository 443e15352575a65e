"""Property-based tests (hypothesis): random shapes, memory layouts, dtypes and initial
states, every case compared with the float64 reference.

Each example draws a seed for its tensor contents, so a failure hypothesis shrinks and
prints is reproducible as is. Bounded (max_examples, no deadline) to stay fast in CI.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qrnn
from qrnn.reference import forget_mult_backward_reference, forget_mult_reference

from conftest import CPU_DTYPES, assert_close_to_reference

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

LAYOUTS_3D = ["contiguous", "transposed", "sliced", "strided", "flipped", "expanded"]
LAYOUTS_2D = ["contiguous", "transposed", "strided", "expanded"]


def random_values(shape, kind, gen):
    if kind == "gate":
        return torch.rand(shape, generator=gen, dtype=torch.float64)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def make_tensor(shape, dtype, layout, kind, gen, expand_dim=0):
    """A tensor of `shape` with random contents stored in `layout`. Gaps of sliced and
    strided views hold NaN, so a kernel reading outside the view poisons its result."""
    shape = tuple(shape)
    nd = len(shape)
    if layout == "contiguous":
        return random_values(shape, kind, gen).to(dtype)
    if layout == "transposed":  # stored with the dims reversed, viewed back
        return random_values(shape[::-1], kind, gen).to(dtype).permute(*range(nd - 1, -1, -1))
    if layout in ("sliced", "strided"):
        big = torch.full([s * 2 + 3 for s in shape], float("nan"), dtype=dtype)
        if layout == "sliced":
            index = tuple(slice(1, 1 + s) for s in shape)
        else:
            index = tuple(slice(2, 2 + 2 * s, 2) for s in shape)
        big[index] = random_values(shape, kind, gen).to(dtype)
        return big[index]
    if layout == "flipped":  # a reversed (flip) copy of a padded buffer, sliced along the last dim
        padded = torch.full(shape[:-1] + (2 * shape[-1] + 1,), float("nan"), dtype=dtype)
        padded[..., 1:1 + shape[-1]] = random_values(shape, kind, gen).to(dtype)
        return padded.flip(0)[..., 1:1 + shape[-1]]
    if layout == "expanded":  # stride 0 along one dim
        small = list(shape)
        small[expand_dim] = 1
        return random_values(small, kind, gen).to(dtype).expand(shape)
    raise AssertionError(layout)


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


def describe(case):
    return " ".join(f"{k}={v}" for k, v in case.items())


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
    h.backward(grad_h)
    ref_df, ref_dx, ref_dh0 = forget_mult_backward_reference(grad_h.double(), f64, x64, ref_h, h064,
                                                             batch_first=batch_first)
    assert_close_to_reference(f.grad, ref_df, dtype, f"grad_f {what}")
    assert_close_to_reference(x.grad, ref_dx, dtype, f"grad_x {what}")
    if h0 is not None:
        assert h0.grad.dtype == h0.dtype
        assert_close_to_reference(h0.grad, ref_dh0, dtype, f"grad_h0 {what}")


@SETTINGS
@given(forget_mult_cases())
def test_batch_first_is_a_transpose(case):
    """batch_first only changes which dim is time: results agree bit for bit."""
    f, x, h0, _ = build(case)
    bf = case["batch_first"]
    h = qrnn.forget_mult(f, x, h0, batch_first=bf)
    h_other = qrnn.forget_mult(f.transpose(0, 1), x.transpose(0, 1), h0, batch_first=not bf)
    assert torch.equal(h.transpose(0, 1), h_other)
