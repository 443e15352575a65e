"""The CUDA fused gate kernels (cuda/qrnn_gates/kernels.cuh), run on the CPU by emulation.

The ``emulator`` fixture (conftest.py) compiles the kernels with the host compiler; these
tests hand them the very integers qrnn._C's CUDA launchers receive (qrnn.ops builds them),
with the vector width the real build picks (qrnn.ops.qrnn_gates.kernels.*_width) or every width
the build compiles, on odd and aligned sizes, every option, NaN-poisoned outputs inside
wider buffers, and compare with the float64 reference. test_qrnn_gates.py's `cuda` tests
run the same kernels on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from conftest import assert_close_to_reference
from cuda_cases import assert_untouched_outside, poisoned_like
from qrnn.ops.core import cuda as cuda_backend
from qrnn.ops.core import kernel_args
from qrnn.ops.qrnn_gates import kernels as gate_kernels
from qrnn.ops.qrnn_gates.reference import qrnn_gates_reference
from qrnn_gates_cases import OPTION_IDS, OPTION_SETS, make_inputs

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _ids(dtype):
    return str(dtype)[6:]


def run_emulated(emulator, gates, c0, mask, lens, grad_out, grad_cn, *, scale=0.85, output_gate=True,
                 batch_first=False, reverse=False, width=None):
    """Forward then backward through the emulated kernels into poisoned views; returns
    (output, c_n, grad_gates, grad_c0, widths) after checking nothing else was written."""
    B = gates.shape[0] if batch_first else gates.shape[1]
    hidden = gates.shape[2] // (3 if output_gate else 2)
    state_dtype = kernel_args.state_dtype(gates.dtype)
    like_out = gates.new_empty(gates.shape[:2] + (hidden,))
    output, out_buf = poisoned_like(like_out)
    states, states_buf = poisoned_like(like_out) if output_gate else (None, None)
    c_n, cn_buf = poisoned_like(gates.new_empty((B, hidden), dtype=state_dtype))
    options = (scale, output_gate, batch_first, reverse)
    fargs = gate_kernels.forward_args(output, states, c_n, gates, c0, mask, lens, *options)
    fwidth = width or gate_kernels.forward_width(fargs)
    emulator.gates_forward(fargs, fwidth)
    for view, buf in ((output, out_buf), (states, states_buf), (c_n, cn_buf)):
        if view is not None:
            assert_untouched_outside(view, buf)

    grad_gates, gg_buf = poisoned_like(gates)
    grad_c0, gc0_buf = poisoned_like(c0) if c0 is not None else (None, None)
    saved = states if output_gate else output
    bargs = gate_kernels.backward_args(grad_gates, grad_c0, grad_out, grad_cn, gates, saved, c0, mask, lens,
                                            *options)
    bwidth = width or gate_kernels.backward_width(bargs)
    emulator.gates_backward(bargs, bwidth)
    assert_untouched_outside(grad_gates, gg_buf)
    if grad_c0 is not None:
        assert_untouched_outside(grad_c0, gc0_buf)
    return output, c_n, grad_gates, grad_c0, (fwidth, bwidth)


def float64_reference(gates, c0, mask, lens, grad_out, grad_cn, **kwargs):
    """(output, c_n, grad_gates, grad_c0) of the per-step reference in float64."""
    g = gates.detach().double().requires_grad_()
    h = None if c0 is None else c0.detach().double().requires_grad_()
    out, c_n = qrnn_gates_reference(g, h, forget_mask=None if mask is None else mask.double(), lengths=lens,
                                    **kwargs)
    loss = (out * grad_out.double()).sum() + (c_n * grad_cn.double()).sum()
    grads = torch.autograd.grad(loss, [g] + ([h] if h is not None else []))
    return out.detach(), c_n.detach(), grads[0], (grads[1] if h is not None else None)


def check(emulator, dtype, T, B, H, options, width=None):
    output_gate, lengths, reverse, batch_first, mask, with_c0 = options
    gates, c0, forget_mask, lens = make_inputs(T, B, H, dtype, output_gate, lengths, batch_first, mask, with_c0)
    out_shape = gates.shape[:2] + (H,)
    grad_out = torch.randn(out_shape, dtype=torch.float64).to(dtype)
    grad_cn = torch.randn(B, H, dtype=torch.float64).to(kernel_args.state_dtype(dtype))
    kwargs = dict(output_gate=output_gate, batch_first=batch_first, reverse=reverse)
    got = run_emulated(emulator, gates, c0, forget_mask, lens, grad_out, grad_cn, width=width, **kwargs)
    want = float64_reference(gates, c0, forget_mask, lens, grad_out, grad_cn, forget_scale=0.85, **kwargs)
    for name, g, w in zip(("output", "c_n", "grad_gates", "grad_c0"), got[:4], want):
        if w is not None:
            assert_close_to_reference(g, w, dtype, f"{name} widths={got[4]}")
    return got[4]


@pytest.mark.parametrize("options", OPTION_SETS, ids=OPTION_IDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("H", [37, 40])
def test_matches_float64_reference(emulator, dtype, options, H):
    """Every option, odd (scalar) and aligned (vector) hidden sizes, the widths the build picks."""
    check(emulator, dtype, 9, 4, H, options)


def _compiled_widths(dtype):
    """8- and 4-byte packs (when over one element) and single elements."""
    widest = max(1, 8 // torch.empty(0, dtype=dtype).element_size())
    return sorted({w for w in (widest, widest // 2) if w > 1} | {1})


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
@pytest.mark.parametrize("options", [OPTION_SETS[0], OPTION_SETS[1], OPTION_SETS[3]], ids=lambda o: "opts")
def test_every_compiled_width(emulator, dtype, options):
    """Each width on aligned inputs and sequences longer than the steps kept in flight, so
    the rolling buffer wraps. H = 44 keeps every gate block aligned for every width (the
    blocks start H elements apart, so a partial last pack, H = 42, would misalign the F and
    O blocks of 8-byte packs: the emulator reports such a plan, a GPU would fault on it)."""
    for width in _compiled_widths(dtype):
        check(emulator, dtype, 19, 3, 44, options, width=width)


# (dtype, H, layout) -> the widest pack (at most 8 bytes) every array allows.
EXPECTED_WIDTHS = [
    (torch.float16, 40, 4), (torch.float16, 42, 2), (torch.float16, 37, 1),
    (torch.bfloat16, 40, 4), (torch.float32, 40, 2), (torch.float32, 37, 1), (torch.float64, 40, 1),
]


@pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels (the rule lives there)")
@pytest.mark.parametrize("dtype,H,width", EXPECTED_WIDTHS)
def test_vector_width_rule(dtype, H, width):
    gates, c0, mask, lens = make_inputs(5, 3, H, dtype, mask=True, c0=True, lengths=True)
    out = poisoned_like(gates.new_empty(5, 3, H))[0]
    c_n = gates.new_empty((3, H), dtype=kernel_args.state_dtype(dtype))
    args = gate_kernels.forward_args(out, poisoned_like(out)[0], c_n, gates, c0, mask, lens, 1.0, True, False,
                                          False)
    assert gate_kernels.forward_width(args) == width
    # A misaligned view of G (one element in) leaves only scalar accesses.
    wide = torch.zeros(5, 3, 3 * H + 1, dtype=dtype)[..., 1:]
    args = gate_kernels.forward_args(out, None, c_n, wide, c0, mask, lens, 1.0, True, False, False)
    assert gate_kernels.forward_width(args) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=_ids)
def test_lengths_are_clamped(emulator, dtype):
    """Device lengths cannot be checked on the host: out-of-range values behave as the
    nearest valid length (and read nothing outside the arrays)."""
    T, B, H = 6, 4, 8
    gates, c0, _, _ = make_inputs(T, B, H, dtype, c0=True)
    grad_out = torch.randn(T, B, H).to(dtype)
    grad_cn = torch.randn(B, H)
    wild = torch.tensor([T + 5, -3, 2, 1 << 40])
    got = run_emulated(emulator, gates, c0, None, wild, grad_out, grad_cn, reverse=True)
    want = float64_reference(gates, c0, None, wild.clamp(0, T), grad_out, grad_cn, forget_scale=0.85, reverse=True)
    for g, w in zip(got[:4], want):
        assert_close_to_reference(g, w, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=_ids)
def test_empty_sequence(emulator, dtype):
    """seq_len 0: c_n is c0, grad_c0 is grad_c_n, nothing else is touched."""
    gates, c0, _, _ = make_inputs(0, 3, 8, dtype, c0=True)
    grad_cn = torch.randn(3, 8).to(c0.dtype)
    got = run_emulated(emulator, gates, c0, None, None, gates.new_empty(0, 3, 8), grad_cn)
    assert torch.equal(got[1], c0) and torch.equal(got[3], grad_cn)


def test_broadcast_grad_output(emulator):
    """output.sum().backward() hands the backward a gradient with all strides 0."""
    gates, c0, mask, lens = make_inputs(7, 3, 16, torch.float32, mask=True, c0=True, lengths=True)
    grad_out = torch.ones(()).expand(7, 3, 16)
    grad_cn = torch.zeros(3, 16)
    got = run_emulated(emulator, gates, c0, mask, lens, grad_out, grad_cn)
    want = float64_reference(gates, c0, mask, lens, grad_out, grad_cn, forget_scale=0.85)
    for g, w in zip(got[:4], want):
        assert_close_to_reference(g, w, torch.float32)
