"""Property-based tests of qrnn.qrnn_gates (hypothesis): gates read in place through any
strides, every option and dtype, compared with the float64 per-step reference."""

import torch
from hypothesis import given
from hypothesis import strategies as st

import qrnn
from conftest import CPU_DTYPES, assert_close_to_reference
from property_cases import LAYOUTS_2D, LAYOUTS_3D, SETTINGS, describe, make_tensor


@st.composite
def gates_cases(draw):
    dtype = draw(st.sampled_from(CPU_DTYPES))
    half = dtype in (torch.bfloat16, torch.float16)
    return dict(
        dtype=dtype, T=draw(st.integers(0, 7)), B=draw(st.integers(0, 4)),
        H=draw(st.one_of(st.integers(1, 20), st.integers(60, 70))),
        output_gate=draw(st.booleans()), batch_first=draw(st.booleans()), reverse=draw(st.booleans()),
        lengths=draw(st.booleans()), mask=draw(st.booleans()),
        scale=draw(st.sampled_from([1.0, 0.8, 0.0])),
        c0=draw(st.sampled_from(["none", "same", "float32"] if half else ["none", "same"])),
        gates_layout=draw(st.sampled_from(LAYOUTS_3D)), c0_layout=draw(st.sampled_from(LAYOUTS_2D)),
        mask_layout=draw(st.sampled_from(LAYOUTS_3D)), expand_dim=draw(st.integers(0, 2)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@SETTINGS
@given(gates_cases())
def test_qrnn_gates_matches_reference(case):
    """qrnn.qrnn_gates (forward and gradients) against the float64 per-step reference, for
    gates read in place through any strides, every option and dtype."""
    from qrnn.ops.qrnn_gates.reference import qrnn_gates_reference

    gen = torch.Generator().manual_seed(case["seed"])
    dtype, T, B, H, bf = case["dtype"], case["T"], case["B"], case["H"], case["batch_first"]
    n = 3 if case["output_gate"] else 2
    shape = (B, T, n * H) if bf else (T, B, n * H)
    out_shape = shape[:-1] + (H,)
    # Spread wide enough to reach the activations' flat ends. Gates are never broadcast
    # (each gradient element belongs to one gate), but may be any other view.
    layout = case["gates_layout"] if case["gates_layout"] != "expanded" else "strided"
    gates = (3 * make_tensor(shape, torch.float64, layout, "value", gen)).to(dtype)
    c0 = None
    if case["c0"] != "none":
        c0 = make_tensor((B, H), torch.float32 if case["c0"] == "float32" else dtype, case["c0_layout"], "value", gen,
                         case["expand_dim"] % 2)
    mask = None
    if case["mask"]:
        mask = (make_tensor(out_shape, torch.float64, case["mask_layout"], "gate", gen, case["expand_dim"]) > 0.3)
        mask = mask.to(dtype)
    lengths = None
    if case["lengths"]:
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
    kwargs = dict(output_gate=case["output_gate"], forget_mask=mask, forget_scale=case["scale"], lengths=lengths,
                  batch_first=bf, reverse=case["reverse"])
    grad_out = torch.randn(out_shape, generator=gen, dtype=torch.float64)
    grad_cn = torch.randn(B, H, generator=gen, dtype=torch.float64)

    leaf_gates = gates.detach().requires_grad_()  # keeps the drawn strides
    leaf_c0 = None if c0 is None else c0.detach().requires_grad_()
    output, c_n = qrnn.qrnn_gates(leaf_gates, leaf_c0, **kwargs)
    ref_gates = gates.detach().double().requires_grad_()
    ref_c0 = None if c0 is None else c0.detach().double().requires_grad_()
    ref_kwargs = dict(kwargs, forget_mask=None if mask is None else mask.double())
    ref_out, ref_cn = qrnn_gates_reference(ref_gates, ref_c0, **ref_kwargs)
    what = describe(case)
    assert output.dtype == dtype and output.shape == out_shape
    assert_close_to_reference(output, ref_out, dtype, f"output {what}")
    assert_close_to_reference(c_n, ref_cn, dtype, f"c_n {what}")
    if lengths is not None:  # padding steps are exactly zero
        out_tm = output.transpose(0, 1) if bf else output
        for b in range(B):
            assert (out_tm[int(lengths[b]):, b] == 0).all(), what

    if output.numel() == 0 and c_n.numel() == 0:
        return
    loss = (output.double() * grad_out).sum() + (c_n.double() * grad_cn).sum()
    ref_loss = (ref_out * grad_out).sum() + (ref_cn * grad_cn).sum()
    inputs = [leaf_gates] + ([leaf_c0] if leaf_c0 is not None else [])
    ref_inputs = [ref_gates] + ([ref_c0] if ref_c0 is not None else [])
    def gradients(total, leaves):  # None where nothing reaches a leaf (e.g. seq_len 0 without c0)
        if not total.requires_grad:
            return [None] * len(leaves)
        return torch.autograd.grad(total, leaves, allow_unused=True)

    grads, ref_grads = gradients(loss, inputs), gradients(ref_loss, ref_inputs)
    for got, want, inp, name in zip(grads, ref_grads, inputs, ("grad gates", "grad c0")):
        got = torch.zeros_like(inp) if got is None else got
        want = torch.zeros_like(inp, dtype=torch.float64) if want is None else want
        assert got.dtype == inp.dtype, name
        assert_close_to_reference(got, want, dtype, f"{name} {what}")
