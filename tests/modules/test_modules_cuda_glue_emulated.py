"""qrnn.QRNN on the CUDA path without a GPU (see test_forget_mult_cuda_glue_emulated.py):
layers, directions, zoneout and lengths through qrnn.ops.core.cuda and the emulated fused gate
kernels, outputs and parameter gradients against the CPU kernels."""

from __future__ import annotations

import pytest
import torch

import qrnn
from conftest import assert_all_close, needs_cuda_build

pytestmark = needs_cuda_build


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
