"""The CUDA path of qrnn.linear_scan on a machine without a GPU: CPU tensors go down the path a
CUDA tensor takes (the op, the family's CUDA backend: allocation, argument building with
reversed views, stream and device lookup, qrnn._C's launchers), with only the launch swapped
for the emulated kernels (conftest.py's emulated_cuda); results are compared with the CPU
kernels'."""

from __future__ import annotations

import pytest
import torch

import qrnn
from conftest import CPU_DTYPES, EmulatedRuntime, assert_all_close, needs_cuda_build, outputs_and_grads

pytestmark = needs_cuda_build

HALF = (torch.bfloat16, torch.float16)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_linear_scan_through_cuda_glue(emulated_cuda, dtype, reverse, batch_first):
    shape = (3, 17, 40) if batch_first else (17, 3, 40)
    a = torch.rand(shape, dtype=torch.float64).to(dtype)
    b = torch.randn(shape, dtype=torch.float64).to(dtype)
    h0 = torch.randn(3, 40, dtype=torch.float64).to(torch.float32 if dtype in HALF else dtype)
    options = {"reverse": reverse, "batch_first": batch_first}
    expected = outputs_and_grads(qrnn.linear_scan, (a, b, h0), **options)
    eager = qrnn.linear_scan(a, b, h0, **options)  # the direct path, no autograd
    with emulated_cuda() as launches:
        actual = outputs_and_grads(qrnn.linear_scan, (a, b, h0), **options)
        eager_emulated = qrnn.linear_scan(a, b, h0, **options)
    kernels = [launch[0] for launch in launches.launches]
    assert kernels == ["linear_scan_forward", "linear_scan_backward", "linear_scan_forward"]
    assert all(launch[1:3] == (EmulatedRuntime.STREAM, 0) for launch in launches.launches)
    assert_all_close(actual + [eager_emulated], expected + [eager], dtype, "linear_scan")


def test_schedules_reach_the_launch(emulated_cuda):
    """qrnn.ops.core.cuda.schedule forces the chunked or serial plan for linear_scan too."""
    from qrnn.ops.core import cuda as cuda_backend

    a, b = torch.rand(300, 2, 8), torch.randn(300, 2, 8)
    expected = qrnn.linear_scan(a, b)
    for name in ("serial", "chunked"):
        with emulated_cuda() as launches, cuda_backend.schedule(name):
            actual = qrnn.linear_scan(a, b)
        chunks = launches.launches[0][3][1]
        assert (chunks == 1) == (name == "serial"), (name, launches.launches)
        torch.testing.assert_close(actual, expected)
