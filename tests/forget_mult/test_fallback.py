"""The pure-PyTorch path for devices without native kernels (mps, xpu, ROCm builds of
torch, ...), forced here on CPU tensors by taking the CPU kernels away from the ops,
and compared with the native kernels."""

from __future__ import annotations

import pytest
import torch

import qrnn
from conftest import FORGET_MULT_CASES, assert_all_close, outputs_and_grads, random_forget_mult_inputs
from qrnn import ops
from qrnn.ops._testing import native_kernels
from qrnn_gates_cases import OPTION_IDS, OPTION_SETS, make_inputs


@pytest.fixture
def no_native_kernels():
    """CPU tensors see a device qrnn has no kernels for."""
    with native_kernels("cpu", None, None):
        assert not ops.has_native_kernels("cpu") and not ops.has_fused_qrnn_gates("cpu")
        yield


@pytest.mark.parametrize("dtype,h0,batch_first", FORGET_MULT_CASES)
def test_forget_mult_fallback_matches_kernels(request, dtype, h0, batch_first):
    f, x, c0 = random_forget_mult_inputs(11, 3, 10, dtype, h0, batch_first)
    native = outputs_and_grads(qrnn.forget_mult, (f, x, c0), batch_first=batch_first)
    native_eager = qrnn.forget_mult(f, x, c0, batch_first=batch_first)
    request.getfixturevalue("no_native_kernels")
    fallback = outputs_and_grads(qrnn.forget_mult, (f, x, c0), batch_first=batch_first)
    assert_all_close(fallback, native, dtype)
    assert_all_close([qrnn.forget_mult(f, x, c0, batch_first=batch_first)], [native_eager], dtype)


@pytest.mark.parametrize("options", OPTION_SETS, ids=OPTION_IDS)
def test_qrnn_gates_fallback_matches_fused_kernel(request, options):
    output_gate, lengths, reverse, batch_first, mask, c0 = options
    gates, c0, forget_mask, lens = make_inputs(9, 3, 8, torch.float32, output_gate, lengths, batch_first, mask, c0)
    kwargs = dict(output_gate=output_gate, forget_mask=forget_mask, forget_scale=0.8, lengths=lens,
                  batch_first=batch_first, reverse=reverse)
    native = outputs_and_grads(qrnn.qrnn_gates, (gates, c0), **kwargs)
    request.getfixturevalue("no_native_kernels")
    assert_all_close(outputs_and_grads(qrnn.qrnn_gates, (gates, c0), **kwargs), native, torch.float32)


def test_qrnn_module_and_compile_on_the_fallback(request):
    model = qrnn.QRNN(5, 7, num_layers=2, window=2, bidirectional=True)
    x = torch.randn(6, 2, 5)
    native = model(x)
    request.getfixturevalue("no_native_kernels")
    fallback = model(x)
    compiled = torch.compile(model, fullgraph=True, backend="eager")(x)
    for result in (fallback, compiled):
        torch.testing.assert_close(result[0], native[0])
        torch.testing.assert_close(result[1], native[1])


def test_fused_gate_op_without_a_kernel_says_what_to_call(no_native_kernels):
    gates = torch.randn(4, 2, 9)
    with pytest.raises(RuntimeError, match="call qrnn.qrnn_gates"):
        torch.ops.qrnn.qrnn_gates(gates, None, None, None, 1.0, True, False, False)
