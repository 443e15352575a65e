"""qrnn.qrnn_gates on the CUDA path without a GPU (see
test_forget_mult_cuda_glue_emulated.py): forward, backward and the eager path through
qrnn.ops.core.cuda, launching the emulated fused gate kernels, against the CPU kernels."""

from __future__ import annotations

import pytest

import qrnn
from conftest import CPU_DTYPES, assert_all_close, needs_cuda_build, outputs_and_grads
from qrnn_gates_cases import OPTION_IDS, OPTION_SETS, make_inputs

pytestmark = needs_cuda_build


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
