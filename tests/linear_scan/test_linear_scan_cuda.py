"""qrnn.linear_scan's CUDA kernels on a real GPU (every test is marked ``cuda``: skipped, never
failed, without one; the same kernels run on the CPU by emulation in
test_linear_scan_cuda_emulated.py). Against the float64 reference: every dtype, both
schedules, reversed, batch-first and strided views, gradients, a CUDA graph and torch.compile."""

from __future__ import annotations

import pytest
import torch

import qrnn
from conftest import assert_close_to_reference
from qrnn.ops.core import cuda as cuda_backend
from qrnn.ops.linear_scan.kernels import CUDA_AVAILABLE
from qrnn.ops.linear_scan.reference import linear_scan_backward_reference, linear_scan_reference

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not CUDA_AVAILABLE, reason="qrnn was built without its CUDA kernels")]

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
HALF = (torch.bfloat16, torch.float16)


def _inputs(T, B, H, dtype, batch_first):
    shape = (B, T, H) if batch_first else (T, B, H)
    a = torch.rand(shape, dtype=torch.float64, device="cuda").to(dtype).requires_grad_()
    b = torch.randn(shape, dtype=torch.float64, device="cuda").to(dtype).requires_grad_()
    h0 = torch.randn(B, H, dtype=torch.float64, device="cuda").to(torch.float32 if dtype in HALF else dtype)
    return a, b, h0.requires_grad_()


def as64(t):
    return t.detach().double().cpu()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("schedule", ["serial", "chunked"])
@pytest.mark.parametrize("T, B, H", [(1, 1, 1), (37, 3, 129), (300, 2, 64), (70, 20, 1550)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_against_float64_reference(dtype, schedule, T, B, H, reverse, batch_first):
    a, b, h0 = _inputs(T, B, H, dtype, batch_first)
    with cuda_backend.schedule(schedule):
        h = qrnn.linear_scan(a, b, h0, reverse=reverse, batch_first=batch_first)
        grad_h = torch.randn_like(h)
        h.backward(grad_h)
    assert_close_to_reference(h, linear_scan_reference(as64(a), as64(b), as64(h0), reverse=reverse,
                                                       batch_first=batch_first), dtype, "h")
    expected = linear_scan_backward_reference(as64(grad_h), as64(a), as64(h), as64(h0), reverse=reverse,
                                              batch_first=batch_first)
    for name, got, want in zip(("grad_a", "grad_b", "grad_h0"), (a.grad, b.grad, h0.grad), expected):
        assert_close_to_reference(got, want, dtype, name)


def test_strided_views_and_graph_capture():
    T, B, H = 50, 4, 96
    a = torch.rand(T, B, 2 * H, device="cuda")[..., ::2]
    b = torch.randn(B, T, H, device="cuda").transpose(0, 1)
    expected = linear_scan_reference(as64(a), as64(b), reverse=True)
    assert_close_to_reference(qrnn.linear_scan(a, b, reverse=True), expected, torch.float32, "strided")
    out = qrnn.linear_scan(a, b, reverse=True)  # loads the kernels before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = qrnn.linear_scan(a, b, reverse=True)
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_reference(out, expected, torch.float32, "graph")


def test_torch_compile_fullgraph():
    a, b, h0 = _inputs(40, 3, 64, torch.float32, False)
    step = torch.compile(lambda a, b, h0: qrnn.linear_scan(a, b, h0).square().sum(), fullgraph=True)
    loss = step(a, b, h0)
    loss.backward()
    torch.testing.assert_close(loss.cpu().double(), linear_scan_reference(as64(a), as64(b), as64(h0)).square().sum(),
                               rtol=1e-4, atol=1e-3)
