"""The CUDA path of qrnn.forget_mult, and the CUDA backend's own entry points (launches into
given outputs, plans, stream and device lookups), on a machine without a GPU: CPU tensors
go down the path a CUDA tensor takes, through the family's CUDA backend's allocation, argument
building, stream lookup and device switch to qrnn._C's CUDA launchers, with only the launch
swapped for the emulated kernels (the emulated_cuda fixture in conftest.py); results are
compared with the CPU kernels'.
"""

from __future__ import annotations

import pytest
import torch

import qrnn
from conftest import (
    FORGET_MULT_CASES,
    EmulatedRuntime,
    assert_all_close,
    needs_cuda_build,
    outputs_and_grads,
    random_forget_mult_inputs,
)
from qrnn.ops.core import cuda as cuda_backend
from qrnn.ops.forget_mult import kernels as forget_mult_kernels
from qrnn.ops.qrnn_gates import kernels as gate_kernels
from qrnn_gates_cases import make_inputs

pytestmark = needs_cuda_build


@pytest.mark.parametrize("dtype,h0,batch_first", FORGET_MULT_CASES)
def test_forget_mult_through_cuda_glue(emulated_cuda, dtype, h0, batch_first):
    f, x, c0 = random_forget_mult_inputs(17, 3, 40, dtype, h0, batch_first)
    expected = outputs_and_grads(qrnn.forget_mult, (f, x, c0), batch_first=batch_first)
    eager = qrnn.forget_mult(f, x, c0, batch_first=batch_first)  # the direct path, no autograd
    with emulated_cuda() as launches:
        actual = outputs_and_grads(qrnn.forget_mult, (f, x, c0), batch_first=batch_first)
        eager_emulated = qrnn.forget_mult(f, x, c0, batch_first=batch_first)
    kernels = [launch[0] for launch in launches.launches]
    assert kernels == ["forget_mult_forward", "forget_mult_backward", "forget_mult_forward"]
    assert all(launch[1:3] == (EmulatedRuntime.STREAM, 0) for launch in launches.launches)
    assert_all_close(actual + [eager_emulated], expected + [eager], dtype, "forget_mult")


def test_launch_names_the_tensors_device(emulated_cuda):
    """Each launch passes the tensors' device index (the C++ launcher makes it current) and
    that device's current stream."""
    f, x = torch.rand(5, 2, 8), torch.randn(5, 2, 8)
    expected = qrnn.forget_mult(f, x)
    with emulated_cuda() as launches:
        launches.runtime.device_index = 1
        actual = qrnn.forget_mult(f, x)
    assert [launch[1:3] for launch in launches.launches] == [(EmulatedRuntime.STREAM, 1)]
    torch.testing.assert_close(actual, expected)


def test_into_entry_points_and_plans(emulated_cuda):
    """The write-into entry points fill poisoned outputs; plans describe the launch made."""
    f, x, h0 = torch.rand(20, 3, 32), torch.randn(20, 3, 32), torch.randn(3, 32)
    h_ref = qrnn.forget_mult(f, x, h0)
    grad_h = torch.randn_like(f)
    ref = forget_mult_kernels.cpu_backward(grad_h, f, x, h_ref, h0, False)
    with emulated_cuda() as launches:
        h = torch.full_like(f, float("nan"))
        forget_mult_kernels.forward_into(h, f, x, h0)
        grads = [torch.full_like(t, float("nan")) for t in (f, f, h0)]
        forget_mult_kernels.backward_into(*grads, grad_h, f, x, h, h0)
        with cuda_backend.schedule("chunked"):
            h_chunked = torch.full_like(f, float("nan"))
            forget_mult_kernels.forward_into(h_chunked, f, x, h0)
        plan = forget_mult_kernels.forward_plan(h, f, x, h0, schedule="chunked")
        bplan = forget_mult_kernels.backward_plan(*grads, grad_h, f, x, h, h0, schedule="serial")
    assert launches.launches[-1][3] == plan and plan[1] > 1 and bplan[1] == 1
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(h_chunked, h_ref)
    for a, e in zip(grads, ref):
        torch.testing.assert_close(a, e)

    gates, c0, mask, lens = make_inputs(7, 3, 16, torch.float32, True, True, False, True, True)
    out_ref, cn_ref = qrnn.qrnn_gates(gates, c0, forget_mask=mask, lengths=lens)
    with emulated_cuda():
        output, states, c_n = (torch.full(s, float("nan")) for s in ((7, 3, 16), (7, 3, 16), (3, 16)))
        gate_kernels.forward_into(output, states, c_n, gates, c0, mask, lens)
        grad_gates, grad_c0 = torch.full_like(gates, float("nan")), torch.full_like(c0, float("nan"))
        gate_kernels.backward_into(grad_gates, grad_c0, torch.ones_like(output), None, gates, states, c0, mask,
                                         lens)
    torch.testing.assert_close(output, out_ref)
    torch.testing.assert_close(c_n, cn_ref)
    assert not grad_gates.isnan().any() and not grad_c0.isnan().any()


def test_into_entry_points_check_their_outputs():
    f, x = torch.rand(4, 2, 8), torch.randn(4, 2, 8)
    with pytest.raises(ValueError, match="h must be"):
        forget_mult_kernels.forward_into(torch.empty(4, 2, 9), f, x)
    with pytest.raises(ValueError, match="grad_h0 needs h0"):
        forget_mult_kernels.backward_into(torch.empty_like(f), torch.empty_like(f), torch.empty(2, 8), f, f, x, f)
    with pytest.raises(ValueError, match="grad_x must be"):
        forget_mult_kernels.backward_into(torch.empty_like(f), torch.empty(4, 2, 8, dtype=torch.float64), None, f, f, x,
                                          f)
    with pytest.raises(ValueError, match="schedule: expected one of"):
        with cuda_backend.schedule("fastest"):
            pass


def test_real_runtime_lookups_exist():
    """The lookups the emulation replaces are the real ones on a GPU: their names resolve
    here too (a missing attribute would only fail on a GPU)."""
    assert cuda_backend.runtime.index(torch.device("cuda", 3)) == 3
    assert callable(cuda_backend.runtime.stream)
    for name in ("Stream", "Event", "current_stream", "stream"):
        assert callable(getattr(torch.cuda, name))
