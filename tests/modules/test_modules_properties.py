"""Property-based tests of qrnn.QRNN (hypothesis): random sizes and options against the
float64 per-step layer reference, and chunked runs against whole ones."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qrnn
from conftest import assert_close_to_reference
from property_cases import describe


@st.composite
def module_cases(draw):
    return dict(
        T=draw(st.integers(1, 6)), B=draw(st.integers(1, 3)), I=draw(st.integers(1, 6)), H=draw(st.integers(1, 6)),
        num_layers=draw(st.integers(1, 2)), bidirectional=draw(st.booleans()), window=draw(st.integers(1, 3)),
        output_gate=draw(st.booleans()), batch_first=draw(st.booleans()), lengths=draw(st.booleans()),
        with_h0=draw(st.booleans()), split=draw(st.integers(1, 5)), seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_cases())
def test_qrnn_module_matches_layer_reference(case):
    """qrnn.QRNN in float64 (eval) against the per-step layer reference, stacked as nn.GRU
    stacks layers (each layer reads both directions of the one below)."""
    from qrnn.reference import qrnn_layer_reference

    torch.manual_seed(case["seed"])
    T, B, n_in, H, bf = case["T"], case["B"], case["I"], case["H"], case["batch_first"]
    D = 2 if case["bidirectional"] else 1
    model = qrnn.QRNN(n_in, H, num_layers=case["num_layers"], bidirectional=case["bidirectional"],
                      window=case["window"], output_gate=case["output_gate"], batch_first=bf,
                      dtype=torch.float64).eval()
    x = torch.randn((B, T, n_in) if bf else (T, B, n_in), dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (B,)) if case["lengths"] else None
    h0 = torch.randn(case["num_layers"] * D, B, H, dtype=torch.float64) if case["with_h0"] else None
    with torch.no_grad():
        out, h_n = model(x, h0, lengths=lengths)
        layer_in, states = x, []
        for layer in range(case["num_layers"]):
            outs = []
            for d in range(D):
                lin = model.layers[layer * D + d].linear
                o, c, _ = qrnn_layer_reference(layer_in, lin.weight, lin.bias,
                                               None if h0 is None else h0[layer * D + d], window=case["window"],
                                               output_gate=case["output_gate"], lengths=lengths, batch_first=bf,
                                               reverse=d == 1)
                outs.append(o)
                states.append(c)
            layer_in = torch.cat(outs, -1)
    what = describe(case)
    assert_close_to_reference(out, layer_in, torch.float64, f"output {what}")
    assert_close_to_reference(h_n, torch.stack(states), torch.float64, f"h_n {what}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_cases())
def test_qrnn_chunks_equal_whole_sequence(case):
    """Running a sequence in two chunks with the carried QRNNState gives the same outputs
    and final state as running it whole (unidirectional: what chunked BPTT relies on)."""
    torch.manual_seed(case["seed"])
    T, B, n_in, H, bf = case["T"], case["B"], case["I"], case["H"], case["batch_first"]
    model = qrnn.QRNN(n_in, H, num_layers=case["num_layers"], window=case["window"], output_gate=case["output_gate"],
                      batch_first=bf, dtype=torch.float64).eval()
    x = torch.randn((B, T, n_in) if bf else (T, B, n_in), dtype=torch.float64)
    time_dim = 1 if bf else 0
    split = min(case["split"], T)
    with torch.no_grad():
        whole, whole_state = model(x, model.initial_state())
        first, state = model(x.narrow(time_dim, 0, split), model.initial_state())
        second, state = model(x.narrow(time_dim, split, T - split), state)
    torch.testing.assert_close(torch.cat([first, second], time_dim), whole, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(state.c, whole_state.c, atol=1e-12, rtol=1e-12)
