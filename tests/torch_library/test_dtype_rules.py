"""The carried-state dtype rule is stated once per language (cpp/include/qrnn/dtype.hpp for
C++, qrnn.ops.core.kernel_args for Python): the two must agree on every pair of dtypes, and
every entry point (the Python checks, the C++ core behind them) must apply it."""

import itertools

import pytest
import torch

import qrnn
from qrnn import _C
from qrnn.ops.core.kernel_args import DTYPE_CODES, accepts_state_dtype, state_dtype

DTYPES = list(DTYPE_CODES)


def test_every_kernel_dtype_is_covered():
    assert set(DTYPES) == {torch.float32, torch.float64, torch.bfloat16, torch.float16}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_written_state_dtype_agrees(dtype):
    assert _C.state_dtype(DTYPE_CODES[dtype]) == DTYPE_CODES[state_dtype(dtype)]


@pytest.mark.parametrize("dtype,state", list(itertools.product(DTYPES, DTYPES)), ids=str)
def test_accepted_state_dtypes_agree(dtype, state):
    assert _C.accepts_state_dtype(DTYPE_CODES[dtype], DTYPE_CODES[state]) == accepts_state_dtype(dtype, state)


@pytest.mark.parametrize("dtype,state", list(itertools.product(DTYPES, DTYPES)), ids=str)
def test_ops_apply_the_rule_to_h0_and_c0(dtype, state):
    """Each op accepts exactly the h0/c0 dtypes the rule allows; the gates' carried c_n comes
    back in state_dtype, the scans' final state (a step of h) in the data's dtype."""
    torch.manual_seed(0)
    f, x = torch.rand(3, 2, 4, dtype=dtype), torch.randn(3, 2, 4, dtype=dtype)
    gates = torch.randn(3, 2, 12, dtype=dtype)
    h0 = torch.randn(2, 4, dtype=state)
    calls = {
        "forget_mult": lambda: qrnn.forget_mult(f, x, h0, output_final_state=True),
        "linear_scan": lambda: qrnn.linear_scan(f, x, h0, output_final_state=True),
        "qrnn_gates": lambda: qrnn.qrnn_gates(gates, h0),
    }
    for name, call in calls.items():
        if accepts_state_dtype(dtype, state):
            final = call()[1]
            assert final.dtype == (state_dtype(dtype) if name == "qrnn_gates" else dtype), name
        else:
            with pytest.raises(TypeError, match="must have dtype"):
                call()
