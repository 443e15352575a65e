"""qrnn's whole CUDA path, run on a machine without a GPU.

The ``emulated_cuda`` fixture (conftest.py) sends CPU tensors down the path a CUDA tensor
takes: qrnn.forget_mult / qrnn.qrnn_gates / qrnn.QRNN -> the ops' kernel tables ->
qrnn.ops_cuda (allocation, argument building, stream lookup, device switch) -> qrnn._C's
CUDA launchers, whose numbers then run the CUDA kernels compiled for the host
(tests/cuda_emulation). Everything but the launch itself is the code a GPU runs; the
results are compared with the CPU kernels'.
"""

from __future__ import annotations

import pytest
import torch

import qrnn
from conftest import (
    CPU_DTYPES,
    FORGET_MULT_CASES,
    EmulatedRuntime,
    assert_all_close,
    outputs_and_grads,
    random_forget_mult_inputs,
)
from qrnn import ops, ops_cuda
from test_qrnn_gates import OPTION_IDS, OPTION_SETS, make_inputs

pytestmark = pytest.mark.skipif(not ops_cuda.AVAILABLE, reason="qrnn was built without its CUDA kernels")



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


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("options", OPTION_SETS, ids=OPTION_IDS)
def test_qrnn_gates_through_cuda_glue(emulated_cuda, dtype, options):
    output_gate, lengths, reverse, batch_first, mask, c0 = options
    gates, c0, forget_mask, lens = make_inputs(13, 4, 24, dtype, output_gate, lengths, batch_first, mask, c0)
    kwargs = dict(output_gate=output_gate, forget_mask=forget_mask, forget_scale=0.9, lengths=lens,
                  batch_first=batch_first, reverse=reverse)
    expected = outputs_and_grads(qrnn.qrnn_gates, (gates, c0), **kwargs)
    eager = qrnn.qrnn_gates(gates, c0, **kwargs)
    with emulated_cuda() as launches:
        actual = outputs_and_grads(qrnn.qrnn_gates, (gates, c0), **kwargs)
        eager_emulated = qrnn.qrnn_gates(gates, c0, **kwargs)
    assert [launch[0] for launch in launches.launches] == ["qrnn_gates_forward", "qrnn_gates_backward",
                                                   "qrnn_gates_forward"]
    assert_all_close(actual + list(eager_emulated), expected + list(eager), dtype, "qrnn_gates")


QRNN_CONFIGS = [
    dict(window=1, bidirectional=False, output_gate=True, zoneout=0.0, h0=False, lengths=False),
    dict(window=2, bidirectional=True, output_gate=True, zoneout=0.0, h0=True, lengths=True),
    dict(window=[2, 1], bidirectional=False, output_gate=False, zoneout=0.3, h0=True, lengths=False),
    dict(window=1, bidirectional=True, output_gate=False, zoneout=0.2, h0=False, lengths=True),
]


@pytest.mark.parametrize("config", QRNN_CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("batch_first", [False, True], ids=["time_major", "batch_first"])
def test_qrnn_module_through_cuda_glue(emulated_cuda, config, batch_first):
    torch.manual_seed(torch.seed() % 2**31)
    model = qrnn.QRNN(6, 8, num_layers=2, window=config["window"], bidirectional=config["bidirectional"],
                      output_gate=config["output_gate"], zoneout=config["zoneout"], batch_first=batch_first)
    model.train(config["zoneout"] > 0)
    directions = 2 if config["bidirectional"] else 1
    x = torch.randn((3, 9, 6) if batch_first else (9, 3, 6))
    h0 = torch.randn(2 * directions, 3, 8) if config["h0"] else None
    lengths = torch.tensor([9, 4, 6]) if config["lengths"] else None

    def run():
        torch.manual_seed(1234)  # the same zoneout masks on both paths
        model.zero_grad()
        output, h_n = model(x, h0, lengths=lengths) if lengths is not None else model(x, h0)
        (output.sum() + h_n.sum()).backward()
        return [output.detach(), h_n.detach()] + [p.grad.clone() for p in model.parameters()]

    expected = run()
    with emulated_cuda() as launches:
        actual = run()
    assert {launch[0] for launch in launches.launches} == {"qrnn_gates_forward", "qrnn_gates_backward"}
    assert_all_close(actual, expected, torch.float32, "QRNN")


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
    ref = ops._backward_cpu(grad_h, f, x, h_ref, h0, False)
    with emulated_cuda() as launches:
        h = torch.full_like(f, float("nan"))
        ops_cuda.forward_into(h, f, x, h0)
        grads = [torch.full_like(t, float("nan")) for t in (f, f, h0)]
        ops_cuda.backward_into(*grads, grad_h, f, x, h, h0)
        with ops_cuda.schedule("chunked"):
            h_chunked = torch.full_like(f, float("nan"))
            ops_cuda.forward_into(h_chunked, f, x, h0)
        plan = ops_cuda.forward_plan(h, f, x, h0, schedule="chunked")
        bplan = ops_cuda.backward_plan(*grads, grad_h, f, x, h, h0, schedule="serial")
    assert launches.launches[-1][3] == plan and plan[1] > 1 and bplan[1] == 1
    torch.testing.assert_close(h, h_ref)
    torch.testing.assert_close(h_chunked, h_ref)
    for a, e in zip(grads, ref):
        torch.testing.assert_close(a, e)

    gates, c0, mask, lens = make_inputs(7, 3, 16, torch.float32, True, True, False, True, True)
    out_ref, cn_ref = qrnn.qrnn_gates(gates, c0, forget_mask=mask, lengths=lens)
    with emulated_cuda():
        output, states, c_n = (torch.full(s, float("nan")) for s in ((7, 3, 16), (7, 3, 16), (3, 16)))
        ops_cuda.gates_forward_into(output, states, c_n, gates, c0, mask, lens)
        grad_gates, grad_c0 = torch.full_like(gates, float("nan")), torch.full_like(c0, float("nan"))
        ops_cuda.gates_backward_into(grad_gates, grad_c0, torch.ones_like(output), None, gates, states, c0, mask,
                                     lens)
    torch.testing.assert_close(output, out_ref)
    torch.testing.assert_close(c_n, cn_ref)
    assert not grad_gates.isnan().any() and not grad_c0.isnan().any()


def test_into_entry_points_check_their_outputs():
    f, x = torch.rand(4, 2, 8), torch.randn(4, 2, 8)
    with pytest.raises(ValueError, match="h must be"):
        ops_cuda.forward_into(torch.empty(4, 2, 9), f, x)
    with pytest.raises(ValueError, match="grad_h0 needs h0"):
        ops_cuda.backward_into(torch.empty_like(f), torch.empty_like(f), torch.empty(2, 8), f, f, x, f)
    with pytest.raises(ValueError, match="grad_x must be"):
        ops_cuda.backward_into(torch.empty_like(f), torch.empty(4, 2, 8, dtype=torch.float64), None, f, f, x, f)
    with pytest.raises(ValueError, match="schedule: expected one of"):
        with ops_cuda.schedule("fastest"):
            pass


def test_real_runtime_lookups_exist():
    """The lookups the emulation replaces are the real ones on a GPU: their names resolve
    here too (a missing attribute would only fail on a GPU)."""
    assert ops_cuda.runtime.index(torch.device("cuda", 3)) == 3
    assert callable(ops_cuda.runtime.stream)
    for name in ("Stream", "Event", "current_stream", "stream"):
        assert callable(getattr(torch.cuda, name))
