"""Packed (cu_seqlens) and variable-length (lengths) sequences in every op family, and the
reverse direction within sequences: against a loop over the sequences in float64, gradcheck,
every element written, the dense-rows form the CUDA kernels and the fallback run, the op
machinery (opcheck, torch.compile, torch.export with dynamic sizes) and bad input."""

import itertools

import pytest
import torch

import qrnn
from conftest import CPU_DTYPES, assert_close_to_reference
from qrnn.ops.forget_mult import KERNELS as FM_KERNELS
from qrnn.ops.forget_mult import kernels as fm_kernels
from qrnn.ops.linear_scan import KERNELS as LS_KERNELS
from qrnn.ops.linear_scan import kernels as ls_kernels
from qrnn.ops.qrnn_gates import kernels as gate_kernels

HALF = (torch.bfloat16, torch.float16)
H = 16


# ---- The families behind one interface: inputs, a call returning (output, final state) ----------


def _state_dtype(dtype):
    return torch.float32 if dtype in HALF else dtype


def _scan_inputs(steps, rows, dtype, batch_first, gates=False):
    shape = (rows, steps) if batch_first else (steps, rows)
    if gates:
        return (torch.randn(*shape, 3 * H, dtype=torch.float64).to(dtype),)
    decay = torch.rand(*shape, H, dtype=torch.float64).clamp(0.05, 0.95).to(dtype)
    return decay, torch.randn(*shape, H, dtype=torch.float64).to(dtype)


def _forget_mult(inputs, h0, **kw):
    return qrnn.forget_mult(*inputs, h0, output_final_state=True, **kw)


def _linear_scan(inputs, h0, **kw):
    return qrnn.linear_scan(*inputs, h0, output_final_state=True, **kw)


def _gates(inputs, h0, **kw):
    return qrnn.qrnn_gates(*inputs, h0, **kw)


FAMILIES = {"forget_mult": (_forget_mult, False), "linear_scan": (_linear_scan, False), "qrnn_gates": (_gates, True)}


def _time_slice(batch_first, start, stop):
    return (slice(None), slice(start, stop)) if batch_first else (slice(start, stop),)


def _random_lengths(count, longest, generator=None):
    """Lengths in 1..longest with an empty and a length-1 sequence among them."""
    lengths = torch.randint(1, longest + 1, (count,), generator=generator).tolist()
    lengths[1], lengths[-2] = 0, 1
    return lengths


def _offsets(lengths, dtype=torch.int64):
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=dtype)


def _loss_weights(out, final):
    return torch.randn_like(out, dtype=torch.float64), torch.randn_like(final, dtype=torch.float64)


# ---- Packed: against a loop over the sequences in float64 -------------------------------------------

CASES = list(itertools.product(FAMILIES, CPU_DTYPES, [False, True], [False, True]))


@pytest.mark.parametrize("family, dtype, reverse, batch_first", CASES,
                         ids=[f"{c[0]}-{str(c[1])[6:]}-{'rev' if c[2] else 'fwd'}-{'bf' if c[3] else 'tm'}"
                              for c in CASES])
def test_packed_matches_a_loop_over_sequences(family, dtype, reverse, batch_first):
    """Random lengths 1..200 with an empty and a length-1 sequence: outputs, final states
    and the gradients of the inputs and of every h0 row, against the same sequences run one
    at a time in float64."""
    call, gates = FAMILIES[family]
    lengths = _random_lengths(9, 200)
    cu = _offsets(lengths, torch.int32)  # int32 offsets are accepted as well
    inputs = [t.requires_grad_() for t in _scan_inputs(sum(lengths), 1, dtype, batch_first, gates)]
    h0 = torch.randn(len(lengths), H, dtype=torch.float64).to(_state_dtype(dtype)).requires_grad_()
    out, final = call(inputs, h0, cu_seqlens=cu, reverse=reverse, batch_first=batch_first)
    assert out.shape[:2] == inputs[0].shape[:2] and final.shape == (len(lengths), H)
    w_out, w_final = _loss_weights(out, final)
    ((out.double() * w_out).sum() + (final.double() * w_final).sum()).backward()

    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_h0 = h0.detach().double().requires_grad_()
    ref_out, ref_final = [], []
    for n in range(len(lengths)):
        where = _time_slice(batch_first, int(cu[n]), int(cu[n + 1]))
        o, f = call([t[where] for t in ref_inputs], ref_h0[n:n + 1], reverse=reverse, batch_first=batch_first)
        ref_out.append(o)
        ref_final.append(f)
    ref_out_all = torch.cat(ref_out, 1 if batch_first else 0)
    ref_final_all = torch.cat(ref_final)
    ((ref_out_all * w_out).sum() + (ref_final_all * w_final).sum()).backward()

    assert_close_to_reference(out, ref_out_all, dtype, "output")
    assert_close_to_reference(final, ref_final_all, dtype, "final state")
    # A 16-bit backward reads the stored (rounded) states, so an input's gradient is off by
    # about the state's rounding times the carried gradient, which sums over up to 200 steps:
    # the absolute tolerance scales with the largest gradient.
    for name, got, ref in zip(("first input", "second input"), inputs, ref_inputs):
        assert_close_to_reference(got.grad, ref.grad, dtype, f"grad of the {name}", scale=ref.grad.abs().max())
    assert_close_to_reference(h0.grad, ref_h0.grad, dtype, "grad_h0", scale=ref_h0.grad.abs().max())
    # The empty sequence: its final state is its h0, which gets the final state's gradient.
    torch.testing.assert_close(final[1].double(), h0[1].detach().double().to(final.dtype).double())


@pytest.mark.parametrize("family", ["forget_mult", "linear_scan"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_lengths_match_a_loop_over_rows(family, reverse, batch_first):
    """Dense rows with lengths (the fused gates had them already): each row's real steps as
    their own sequence, the padding 0 with no gradient, the final state after the last real
    step."""
    call, _ = FAMILIES[family]
    lengths = [5, 0, 1, 7]
    inputs = [t.requires_grad_() for t in _scan_inputs(7, 4, torch.float64, batch_first)]
    h0 = torch.randn(4, H, dtype=torch.float64, requires_grad=True)
    out, final = call(inputs, h0, lengths=torch.tensor(lengths), reverse=reverse, batch_first=batch_first)
    (out.square().sum() + final.square().sum()).backward()
    for b, length in enumerate(lengths):
        row = [t.detach()[b:b + 1] if batch_first else t.detach()[:, b:b + 1] for t in inputs]
        real = [t[:, :length] if batch_first else t[:length] for t in row]
        o, f = call(real, h0.detach()[b:b + 1], reverse=reverse, batch_first=batch_first)
        got = out[b:b + 1] if batch_first else out[:, b:b + 1]
        torch.testing.assert_close(got[:, :length] if batch_first else got[:length], o)
        assert not (got[:, length:] if batch_first else got[length:]).any(), "padding must be 0"
        torch.testing.assert_close(final[b], f[0])
        for t in inputs:
            padding = t.grad[b, length:] if batch_first else t.grad[length:, b]
            assert not padding.any(), "padding must get no gradient"


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_gradcheck_float64(family, reverse, batch_first):
    call, gates = FAMILIES[family]
    cu = _offsets([3, 0, 1, 4])
    inputs = [t.requires_grad_() for t in _scan_inputs(8, 1, torch.float64, batch_first, gates)]
    h0 = torch.randn(4, H, dtype=torch.float64, requires_grad=True)

    def fn(*args):
        return call(list(args[:-1]), args[-1], cu_seqlens=cu, reverse=reverse, batch_first=batch_first)

    assert torch.autograd.gradcheck(fn, (*inputs, h0))


# ---- Every element written; the dense-rows form of other devices ------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
def test_every_element_written_packed(reverse):
    """The CPU kernels write every element of NaN-filled outputs of a packed row (odd sizes,
    an empty sequence), forward and backward, in each family."""
    cu = _offsets([3, 0, 1, 9, 2])
    f, x = _scan_inputs(15, 1, torch.float32, False)
    h0 = torch.randn(5, H)
    nan = float("nan")
    h = torch.full_like(f, nan)
    qrnn._C.forget_mult_forward(*fm_kernels.forward_args(h, f, x, h0, False, None, cu, reverse), 2)
    grads = [torch.full_like(f, nan), torch.full_like(f, nan), torch.full_like(h0, nan)]
    grad_out = torch.randn_like(f)  # held: the argument tuples hold addresses, not tensors
    qrnn._C.forget_mult_backward(*fm_kernels.backward_args(*grads, grad_out, f, x, h, h0, False, None, cu,
                                                           reverse), 2)
    h2 = torch.full_like(f, nan)
    qrnn._C.linear_scan_forward(*ls_kernels.forward_args(h2, f, x, h0, reverse, False, None, cu), 2)
    grads2 = [torch.full_like(f, nan), torch.full_like(f, nan), torch.full_like(h0, nan)]
    qrnn._C.linear_scan_backward(*ls_kernels.backward_args(*grads2, grad_out, f, h2, h0, reverse, False,
                                                           None, cu), 2)
    (g,) = _scan_inputs(15, 1, torch.float32, False, gates=True)
    out, states, c_n = (torch.full_like(f, nan), torch.full_like(f, nan), torch.full_like(h0, nan))
    qrnn._C.qrnn_gates_forward(*gate_kernels.forward_args(out, states, c_n, g, h0, None, None, 1.0, True, False,
                                                          reverse, cu), 2)
    grad_g, grad_c0 = torch.full_like(g, nan), torch.full_like(h0, nan)
    qrnn._C.qrnn_gates_backward(*gate_kernels.backward_args(grad_g, grad_c0, grad_out, None, g, states, h0,
                                                            None, None, 1.0, True, False, reverse, cu), 2)
    for t in (h, *grads, h2, *grads2, out, states, c_n, grad_g, grad_c0):
        assert not t.isnan().any()


def _cpu_dense_ls_forward(a, b, h0, reverse, batch_first):
    return ls_kernels.cpu_forward(a, b, h0, reverse, batch_first)


def _cpu_dense_ls_backward(grad_h, a, h, h0, reverse, batch_first):
    return ls_kernels.cpu_backward(grad_h, a, h, h0, reverse, batch_first)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_dense_rows_form_matches_the_cpu_kernels(reverse, batch_first, packed):
    """What the CUDA kernels (whole or padded rows only) and the fallback run for a call with
    sequences, here on the CPU's dense kernels: the same results as the CPU's own sequences."""
    if packed:
        lengths, cu, rows, steps = None, _offsets([2, 0, 5, 1]), 1, 8
    else:
        lengths, cu, rows, steps = torch.tensor([3, 0, 5, 1]), None, 4, 5
    a, b = _scan_inputs(steps, rows, torch.float64, batch_first)
    h0 = torch.randn(4, H, dtype=torch.float64)
    grad = torch.randn_like(a)
    h = ls_kernels.cpu_forward(a, b, h0, reverse, batch_first, lengths, cu)
    torch.testing.assert_close(ls_kernels.with_sequences_forward(_cpu_dense_ls_forward, a, b, h0, reverse,
                                                                 batch_first, lengths, cu), h)
    native = ls_kernels.cpu_backward(grad, a, h, h0, reverse, batch_first, lengths, cu)
    dense = ls_kernels.with_sequences_backward(_cpu_dense_ls_backward, grad, a, h, h0, reverse, batch_first, lengths,
                                               cu)
    for got, expected in zip(dense, native):
        torch.testing.assert_close(got, expected)
    # ForgetMult's fallback (through linear_scan's) and the gates' padded form
    hf = fm_kernels.cpu_forward(a, b, h0, batch_first, lengths, cu, reverse)
    torch.testing.assert_close(fm_kernels.fallback_forward(a, b, h0, batch_first, lengths, cu, reverse), hf)
    for got, expected in zip(fm_kernels.fallback_backward(grad, a, b, hf, h0, batch_first, lengths, cu, reverse),
                             fm_kernels.cpu_backward(grad, a, b, hf, h0, batch_first, lengths, cu, reverse)):
        torch.testing.assert_close(got, expected)
    if packed:
        (g,) = _scan_inputs(steps, rows, torch.float64, batch_first, gates=True)
        native_out = gate_kernels.cpu_forward(g, h0, None, None, 1.0, True, batch_first, reverse, cu)
        padded_out = gate_kernels.packed_forward(gate_kernels.cpu_forward, g, h0, None, 1.0, True, batch_first,
                                                 reverse, cu)
        for got, expected in zip(padded_out, native_out):
            torch.testing.assert_close(got, expected)
        grads = (torch.randn_like(native_out[0]), torch.randn_like(native_out[1]))
        native_back = gate_kernels.cpu_backward(*grads, g, native_out[2], h0, None, None, 1.0, True, batch_first,
                                                reverse, cu)
        padded_back = gate_kernels.packed_backward(gate_kernels.cpu_backward, *grads, g, native_out[2], h0, None, 1.0,
                                                   True, batch_first, reverse, cu)
        for got, expected in zip(padded_back, native_back):
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("kernels", [FM_KERNELS, LS_KERNELS], ids=["forget_mult", "linear_scan"])
def test_fallback_devices_run_sequences(kernels):
    """A device without native kernels runs the ops' bodies: the same results."""
    cu = _offsets([4, 0, 2])
    a, b = _scan_inputs(6, 1, torch.float64, True)
    h0 = torch.randn(3, H, dtype=torch.float64)
    call = _forget_mult if kernels is FM_KERNELS else _linear_scan
    expected = call([a, b], h0, cu_seqlens=cu, reverse=True, batch_first=True)
    previous = kernels.set("cpu", None, None)
    try:
        got = call([a, b], h0, cu_seqlens=cu, reverse=True, batch_first=True)
    finally:
        kernels.set("cpu", *previous)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


# ---- The op machinery ---------------------------------------------------------------------------


def test_opcheck_with_sequences():
    cu = _offsets([3, 0, 2])
    a, b = _scan_inputs(5, 1, torch.float32, False)
    h0 = torch.randn(3, H)
    lengths = torch.tensor([4, 0])
    a2, b2 = _scan_inputs(4, 2, torch.float32, False)
    torch.library.opcheck(torch.ops.qrnn.linear_scan.default, (a, b, h0, True, False, None, cu))
    torch.library.opcheck(torch.ops.qrnn.linear_scan.default, (a2, b2, None, False, False, lengths, None))
    torch.library.opcheck(torch.ops.qrnn.forget_mult.default, (a, b, h0, False, None, cu, True))
    (g,) = _scan_inputs(5, 1, torch.float32, False, gates=True)
    torch.library.opcheck(torch.ops.qrnn.qrnn_gates.default, (g.requires_grad_(), h0, None, None, 1.0, True, False,
                                                              False, cu))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_torch_compile_fullgraph(family):
    call, gates = FAMILIES[family]
    cu = _offsets([3, 0, 6, 1])
    inputs = [t.requires_grad_() for t in _scan_inputs(10, 1, torch.float32, True, gates)]
    h0 = torch.randn(4, H, requires_grad=True)

    def step(*args):
        out, final = call(list(args[:-1]), args[-1], cu_seqlens=cu, reverse=True, batch_first=True)
        return out.square().sum() + final.sum()

    eager = step(*inputs, h0)
    eager_grads = torch.autograd.grad(eager, (*inputs, h0))
    compiled = torch.compile(step, fullgraph=True)(*inputs, h0)
    for got, expected in zip(torch.autograd.grad(compiled, (*inputs, h0)), eager_grads):
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(compiled, eager)


# Older torch specializes the packed length while exporting (torch 2.4 does); tested from 2.13.
NEEDS_DYNAMIC_EXPORT = pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13),
                                          reason="torch < 2.13 specializes the packed length when exporting")


@NEEDS_DYNAMIC_EXPORT
@pytest.mark.parametrize("family", list(FAMILIES))
def test_torch_export_with_dynamic_sequences(family):
    """The exported program keeps the op and runs other numbers of sequences and lengths."""
    call, gates = FAMILIES[family]

    class Packed(torch.nn.Module):
        def forward(self, x, h0, cu_seqlens):
            inputs = [x] if gates else [torch.sigmoid(x), x]
            return call(inputs, h0, cu_seqlens=cu_seqlens, batch_first=True)

    width = 3 * H if gates else H
    x, h0, cu = torch.randn(1, 9, width), torch.randn(3, H), _offsets([4, 2, 3])
    total, sequences = torch.export.Dim("total", min=2, max=2**20), torch.export.Dim("sequences", min=2, max=4096)
    program = torch.export.export(Packed(), (x, h0, cu), dynamic_shapes=(
        {1: total}, {0: sequences}, {0: sequences + 1}))
    op = {"forget_mult": torch.ops.qrnn.forget_mult.default, "linear_scan": torch.ops.qrnn.linear_scan.default,
          "qrnn_gates": torch.ops.qrnn.qrnn_gates.default}[family]
    assert op in [n.target for n in program.graph.nodes if n.op == "call_function"]
    x2, h02, cu2 = torch.randn(1, 13, width), torch.randn(5, H), _offsets([1, 0, 7, 4, 1])
    for got, expected in zip(program.module()(x2, h02, cu2), Packed()(x2, h02, cu2)):
        torch.testing.assert_close(got, expected)


def test_transforms_refuse_sequences_clearly():
    cu = _offsets([2, 2])
    a, b = _scan_inputs(4, 1, torch.float64, False)
    # vmap: refused by the op's rule, or (torch 2.4, which takes torch's per-sample fallback
    # instead) the per-sample result; never a wrong one.
    try:
        mapped = torch.func.vmap(lambda a, b: qrnn.linear_scan(a, b, cu_seqlens=cu))(a.unsqueeze(0), b.unsqueeze(0))
    except NotImplementedError as error:
        assert "cu_seqlens" in str(error)
    else:
        torch.testing.assert_close(mapped[0], qrnn.linear_scan(a, b, cu_seqlens=cu))
    with pytest.raises(NotImplementedError, match="forward-mode"):
        torch.func.jvp(lambda a: qrnn.forget_mult(a, b, cu_seqlens=cu), (a,), (torch.ones_like(a),))


# ---- Bad input: a clear error naming the argument -----------------------------------------------


def _packed_call(family, cu, *, batch=1, h0_rows=None, device_of_cu=None, lengths=None):
    call, gates = FAMILIES[family]
    inputs = _scan_inputs(6, batch, torch.float32, False, gates)
    h0 = None if h0_rows is None else torch.randn(h0_rows, H)
    return call(inputs, h0, cu_seqlens=cu, lengths=lengths)


BAD = [
    (dict(cu=torch.tensor([0, 4, 2, 6])), ValueError, "cu_seqlens must be nondecreasing"),
    (dict(cu=torch.tensor([1, 4, 6])), ValueError, r"cu_seqlens\[0\] must be 0"),
    (dict(cu=torch.tensor([0, 4, 5])), ValueError, "packed length"),
    (dict(cu=torch.tensor([0, 4, 7])), ValueError, "packed length"),
    (dict(cu=torch.tensor([0.0, 6.0])), TypeError, "cu_seqlens must be an int32 or int64 tensor"),
    (dict(cu=torch.tensor([[0, 6]])), ValueError, "cu_seqlens must be 1-D"),
    (dict(cu=torch.tensor([0, 3, 6]), batch=2), ValueError, "one packed row"),
    (dict(cu=torch.tensor([0, 3, 6]), h0_rows=3), ValueError, r"must have shape \(sequences, hidden\)"),
    (dict(cu=torch.tensor([0, 6], device="meta")), ValueError, "cu_seqlens must be on"),
    (dict(cu=[0, 6]), TypeError, "cu_seqlens must be a torch.Tensor"),
    (dict(cu=torch.tensor([0, 6]), lengths=torch.tensor([6])), ValueError, "not both"),
]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("case, error, message", BAD, ids=[m for _, _, m in BAD])
def test_bad_cu_seqlens(family, case, error, message):
    with pytest.raises(error, match=message):
        _packed_call(family, **case)


@pytest.mark.parametrize("family", ["forget_mult", "linear_scan"])
def test_bad_lengths(family):
    call, _ = FAMILIES[family]
    inputs = _scan_inputs(5, 2, torch.float32, False)
    with pytest.raises(ValueError, match=r"lengths\[1\] = 6 is outside 0..seq_len"):
        call(inputs, None, lengths=torch.tensor([2, 6]))
    with pytest.raises(ValueError, match=r"lengths must have shape \(batch,\)"):
        call(inputs, None, lengths=torch.tensor([2, 3, 1]))
