"""QRNN / QRNNLayer modules: fused vs unfused vs the float64 per-step reference over the
options, nn.GRU API parity, PackedSequence, chunked BPTT, salesforce/pytorch-qrnn
state dicts, mixed precision, zoneout and dropout, bad inputs, compile and DDP."""

import itertools
import os
import tempfile

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import qrnn
from conftest import HAS_CUDA, assert_close_to_reference
from qrnn import ops
from qrnn.ops.forget_mult.reference import forget_mult_reference
from qrnn.ops.qrnn_gates.op import KERNELS as GATE_KERNELS
from qrnn.reference import qrnn_layer_reference

# ---- Option combinations: every pair of option values covered, few runs -------------

OPTIONS = {
    "window": [1, 2, 3],
    "output_gate": [True, False],
    "zoneout": ["off", "train", "eval"],
    "bias": [True, False],
    "batch_first": [False, True],
    "bidirectional": [False, True],
    "lengths": [False, True],
    "hx": [False, True],
}


def pairwise_cases(options):
    """A small deterministic set of combinations covering every pair of values (greedy)."""
    names = list(options)
    uncovered = {((a, va), (b, vb)) for a, b in itertools.combinations(names, 2)
                 for va in options[a] for vb in options[b]}
    candidates = [dict(zip(names, values)) for values in itertools.product(*options.values())]
    cases = []
    while uncovered:
        def gain(case, uncovered=uncovered):
            return sum(((a, case[a]), (b, case[b])) in uncovered for a, b in itertools.combinations(names, 2))
        best = max(candidates, key=gain)
        uncovered -= {((a, best[a]), (b, best[b])) for a, b in itertools.combinations(names, 2)}
        cases.append(best)
    return cases


CASES = pairwise_cases(OPTIONS)
CASE_IDS = ["-".join(f"{k[:4]}{int(v) if isinstance(v, bool) else v}" for k, v in c.items()) for c in CASES]


class GateRecorder:
    """Wraps ops.qrnn_gates as the modules call it, recording each call's zoneout mask
    and scale (to hand the very same ones to the reference) and the gates' dtype."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = ops.qrnn_gates

        def recording(gates, c0=None, **kwargs):
            self.calls.append(dict(kwargs, gates_dtype=gates.dtype, c0_dtype=None if c0 is None else c0.dtype))
            return real(gates, c0, **kwargs)

        monkeypatch.setattr(ops, "qrnn_gates", recording)


def reference_stack(model, x, hx, lengths, calls):
    """The whole QRNN from qrnn_layer_reference, layer by layer, with the recorded masks."""
    D = model.num_directions
    states = []
    for layer in range(model.num_layers):
        outputs = []
        for direction in range(D):
            index = layer * D + direction
            lin = model.layers[index].linear
            call = calls[index]
            out, c_n, _ = qrnn_layer_reference(
                x, lin.weight, lin.bias, None if hx is None else hx[index], window=model.windows[layer],
                output_gate=model.output_gate, forget_mask=call["forget_mask"], forget_scale=call["forget_scale"],
                lengths=lengths, batch_first=model.batch_first, reverse=direction == 1)
            outputs.append(out)
            states.append(c_n)
        x = torch.cat(outputs, -1)
    return x, torch.stack(states)


def make_batch(T, B, n_in, batch_first, dtype=torch.float64, lengths=False):
    x = torch.randn((B, T, n_in) if batch_first else (T, B, n_in), dtype=dtype, requires_grad=True)
    lens = None
    if lengths:
        lens = torch.randint(0, T + 1, (B,))
        lens[0] = T
    return x, lens


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_fused_unfused_and_reference_agree(case, monkeypatch):
    T, B, n_in, H, L = 6, 3, 5, 4, 2
    model = qrnn.QRNN(n_in, H, num_layers=L, bias=case["bias"], batch_first=case["batch_first"],
                      bidirectional=case["bidirectional"], window=case["window"],
                      zoneout=0.0 if case["zoneout"] == "off" else 0.4, output_gate=case["output_gate"],
                      dtype=torch.float64)
    model.train(case["zoneout"] == "train")
    x, lens = make_batch(T, B, n_in, case["batch_first"], lengths=case["lengths"])
    hx = torch.randn(L * model.num_directions, B, H, dtype=torch.float64, requires_grad=True) if case["hx"] else None
    params = list(model.parameters())
    inputs = [x] + ([hx] if hx is not None else []) + params
    seed = torch.seed()

    def run():
        torch.manual_seed(seed)  # the same zoneout masks for every path
        out, h_n = model(x, hx, lengths=lens)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
        loss = (out * weights).sum() + h_n.square().sum()
        return out, h_n, torch.autograd.grad(loss, inputs)

    recorder = GateRecorder(monkeypatch)
    fused = run()
    calls = recorder.calls[:]
    with monkeypatch.context() as m:
        m.delitem(GATE_KERNELS.forward, "cpu")  # the unfused PyTorch path
        unfused = run()
    assert all(torch.equal(a["forget_mask"], b["forget_mask"]) if a["forget_mask"] is not None
               else b["forget_mask"] is None for a, b in zip(calls, recorder.calls[len(calls):]))

    ref_out, ref_h = reference_stack(model, x, hx, lens, calls)
    weights = torch.linspace(-1, 1, ref_out.numel(), dtype=ref_out.dtype).view(ref_out.shape)
    ref_grads = torch.autograd.grad((ref_out * weights).sum() + ref_h.square().sum(), inputs)
    for name, (out, h_n, grads) in (("fused", fused), ("unfused", unfused)):
        assert out.shape == ref_out.shape and h_n.shape == ref_h.shape
        assert_close_to_reference(out, ref_out, torch.float64, f"{name} output")
        assert_close_to_reference(h_n, ref_h, torch.float64, f"{name} h_n")
        for i, (got, want) in enumerate(zip(grads, ref_grads)):
            torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-8,
                                       msg=lambda m, name=name, i=i: f"{name} grad {i}: {m}")
    if lens is not None:
        out_tm = fused[0].transpose(0, 1) if case["batch_first"] else fused[0]
        for b in range(B):
            assert (out_tm[int(lens[b]):, b] == 0).all()


def test_gradcheck_float64():
    model = qrnn.QRNN(3, 4, num_layers=2, bidirectional=True, window=2, dtype=torch.float64)
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    hx = torch.randn(4, 2, 4, dtype=torch.float64, requires_grad=True)
    lens = torch.tensor([4, 2])
    assert torch.autograd.gradcheck(lambda a, b: model(a, b, lengths=lens), (x, hx), eps=1e-6, atol=1e-7)


# ---- nn.GRU API parity ----------------------------------------------------------------

GRU_ARGS = [
    {},
    {"num_layers": 2, "dropout": 0.25},
    {"num_layers": 2, "bidirectional": True, "batch_first": True},
    {"num_layers": 3, "bias": False, "bidirectional": True},
]


@pytest.mark.parametrize("kwargs", GRU_ARGS, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()) or "default")
def test_same_arguments_and_shapes_as_gru(kwargs):
    n_in, H, T, B = 5, 7, 6, 3
    gru = nn.GRU(n_in, H, **kwargs, dtype=torch.float64)
    model = qrnn.QRNN(n_in, H, **kwargs, dtype=torch.float64)
    for attr in ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional"):
        assert getattr(model, attr) == getattr(gru, attr), attr
    batch_first = kwargs.get("batch_first", False)
    D = 2 if kwargs.get("bidirectional") else 1
    L = kwargs.get("num_layers", 1)
    x = torch.randn((B, T, n_in) if batch_first else (T, B, n_in), dtype=torch.float64)
    hx = torch.randn(L * D, B, H, dtype=torch.float64)
    for args in ((x,), (x, hx)):
        want_out, want_h = gru(*args)
        out, h_n = model(*args)
        assert out.shape == want_out.shape and h_n.shape == want_h.shape
        assert out.dtype == want_out.dtype and h_n.dtype == want_h.dtype
    unbatched = x[0] if batch_first else x[:, 0]
    out, h_n = model(unbatched, hx[:, 0])
    want_out, want_h = gru(unbatched, hx[:, 0])
    assert out.shape == want_out.shape and h_n.shape == want_h.shape
    # Unbatched runs are the batched run's row 0.
    model.eval()
    out, h_n = model(unbatched, hx[:, 0])
    full_out, full_h = model(x, hx)
    torch.testing.assert_close(out, full_out[0] if batch_first else full_out[:, 0])
    torch.testing.assert_close(h_n, full_h[:, 0])
    model.flatten_parameters()  # accepted, like cuDNN RNNs


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("enforce_sorted", [False, True])
def test_packed_sequence_round_trip(batch_first, enforce_sorted):
    n_in, H, T = 4, 5, 7
    lens = torch.tensor([7, 5, 5, 2, 1]) if enforce_sorted else torch.tensor([3, 7, 1, 5, 5])
    B = len(lens)
    gru = nn.GRU(n_in, H, num_layers=2, bidirectional=True, batch_first=batch_first, dtype=torch.float64)
    model = qrnn.QRNN(n_in, H, num_layers=2, bidirectional=True, batch_first=batch_first, window=2, dtype=torch.float64)
    x = torch.randn((B, T, n_in) if batch_first else (T, B, n_in), dtype=torch.float64, requires_grad=True)
    hx = torch.randn(4, B, H, dtype=torch.float64)
    packed = pack_padded_sequence(x, lens, batch_first=batch_first, enforce_sorted=enforce_sorted)
    out, h_n = model(packed, hx)
    want_out, want_h = gru(packed, hx)
    assert type(out) is type(want_out)
    assert torch.equal(out.batch_sizes, want_out.batch_sizes)
    for a, b in ((out.sorted_indices, want_out.sorted_indices), (out.unsorted_indices, want_out.unsorted_indices)):
        assert (a is None and b is None) or torch.equal(a, b)
    assert out.data.shape == want_out.data.shape and h_n.shape == want_h.shape
    # The same as padded input with lengths; padding of the unpacked output is zero.
    padded_out, out_lens = pad_packed_sequence(out, batch_first=batch_first)
    direct_out, direct_h = model(x, hx, lengths=lens)
    assert torch.equal(out_lens, lens)
    torch.testing.assert_close(padded_out, direct_out)
    torch.testing.assert_close(h_n, direct_h)
    padded_out.sum().backward()
    assert x.grad is not None and x.grad.isfinite().all()


def test_dropout_warning_like_gru():
    with pytest.warns(UserWarning, match="dropout"):
        qrnn.QRNN(3, 4, dropout=0.5)


# ---- Chunked BPTT, state dicts -------------------------------------------------------


@pytest.mark.parametrize("batch_first", [False, True])
def test_chunked_bptt_equals_one_pass_window_2(batch_first):
    T, B, n_in, H = 11, 3, 4, 5
    model = qrnn.QRNN(n_in, H, num_layers=2, window=[2, 3], batch_first=batch_first, dtype=torch.float64)
    x, _ = make_batch(T, B, n_in, batch_first)
    time_dim = 1 if batch_first else 0
    full_out, full_h = model(x)
    full_grads = torch.autograd.grad(full_out.square().sum(), list(model.parameters()))

    state = model.initial_state()
    outs = []
    for chunk in x.split([4, 1, 6], dim=time_dim):
        out, state = model(chunk, state)
        outs.append(out)
    out = torch.cat(outs, time_dim)
    torch.testing.assert_close(out, full_out)
    torch.testing.assert_close(state.c, full_h)
    assert state.x_tails[0].shape == ((B, 1, n_in) if batch_first else (1, B, n_in))
    assert state.x_tails[1].shape == ((B, 2, H) if batch_first else (2, B, H))
    grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
    for got, want in zip(grads, full_grads):
        torch.testing.assert_close(got, want)
    detached = state.detach()
    assert not detached.c.requires_grad and not any(t.requires_grad for t in detached.x_tails)


def test_chunks_shorter_than_the_window():
    T, B, n_in, H = 5, 2, 3, 4
    model = qrnn.QRNN(n_in, H, window=4, dtype=torch.float64)
    x, _ = make_batch(T, B, n_in, False)
    full_out, _ = model(x)
    state, outs = model.initial_state(), []
    for chunk in x.split(1):
        out, state = model(chunk, state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs), full_out)


def test_lengths_carry_each_sequences_own_tail():
    """With lengths, the returned input tail is each sequence's own last inputs."""
    model = qrnn.QRNN(3, 4, window=3, dtype=torch.float64)
    x, _ = make_batch(6, 3, 3, False)
    lens = torch.tensor([6, 1, 0])
    tail_in = torch.randn(2, 3, 3, dtype=torch.float64)
    _, state = model(x, qrnn.QRNNState(None, (tail_in,)), lengths=lens)
    tail = state.x_tails[0]
    torch.testing.assert_close(tail[:, 0], x[4:6, 0])
    torch.testing.assert_close(tail[:, 1], torch.stack([tail_in[1, 1], x[0, 1]]))
    torch.testing.assert_close(tail[:, 2], tail_in[:, 2])


def forget_mult_loop(f, z, h0):
    return forget_mult_reference(f, z, None if h0 is None else h0.view(h0.shape[-2:]))


class SalesforceQRNNLayer(nn.Module):
    """The forward pass of salesforce/pytorch-qrnn 0.2.1's QRNNLayer as that package
    defines it (window 1 or 2 with [x_t, x_{t-1}] on the feature axis, gates chunked
    Z, F, O, zoneout at evaluation as F * (1 - p), save_prev_x between calls), with its
    ForgetMult replaced by the per-step loop."""

    def __init__(self, input_size, hidden_size=None, save_prev_x=False, zoneout=0, window=1, output_gate=True):
        super().__init__()
        assert window in (1, 2)
        self.window, self.zoneout, self.output_gate, self.save_prev_x = window, zoneout, output_gate, save_prev_x
        self.prevX = None
        hidden_size = hidden_size or input_size
        self.linear = nn.Linear(window * input_size, (3 if output_gate else 2) * hidden_size)

    def forward(self, X, hidden=None):
        source = X
        if self.window == 2:
            first = self.prevX if self.prevX is not None else X[:1] * 0
            source = torch.cat([X, torch.cat([first, X[:-1]], 0)], 2)
        Y = self.linear(source)
        if self.output_gate:
            Z, F_, O_ = Y.chunk(3, dim=2)
        else:
            Z, F_ = Y.chunk(2, dim=2)
        Z, F_ = torch.tanh(Z), torch.sigmoid(F_)
        if self.zoneout and not self.training:
            F_ = F_ * (1 - self.zoneout)
        C = forget_mult_loop(F_, Z, hidden)
        H = torch.sigmoid(O_) * C if self.output_gate else C
        if self.window > 1 and self.save_prev_x:
            self.prevX = X[-1:].detach()
        return H, C[-1:]


class SalesforceQRNN(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers=1, dropout=0, **kwargs):
        super().__init__()
        self.num_layers, self.dropout = num_layers, dropout
        self.layers = nn.ModuleList(SalesforceQRNNLayer(input_size if i == 0 else hidden_size, hidden_size, **kwargs)
                                    for i in range(num_layers))

    def forward(self, input, hidden=None):
        next_hidden = []
        for i, layer in enumerate(self.layers):
            input, hn = layer(input, None if hidden is None else hidden[i])
            next_hidden.append(hn)
            if self.dropout and i < self.num_layers - 1:
                input = F.dropout(input, p=self.dropout, training=self.training)
        return input, torch.cat(next_hidden, 0)


@pytest.mark.parametrize("window,output_gate", [(1, True), (2, True), (2, False)])
def test_loads_salesforce_qrnn_state_dict(window, output_gate):
    original = SalesforceQRNN(5, 6, num_layers=3, window=window, output_gate=output_gate, zoneout=0.2).double().eval()
    model = qrnn.QRNN(5, 6, num_layers=3, window=window, output_gate=output_gate, zoneout=0.2, dtype=torch.float64)
    model.load_state_dict(original.state_dict())  # strict: the same keys and shapes
    model.eval()
    x = torch.randn(7, 4, 5, dtype=torch.float64)
    hidden = torch.randn(3, 4, 6, dtype=torch.float64)
    want_out, want_h = original(x, hidden)
    out, h_n = model(x, hidden)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(h_n, want_h)


def test_awd_qrnn_layers_with_saved_inputs_across_batches():
    """AWD-QRNN's per-layer QRNNLayers (window 2 first, save_prev_x) map onto ours, with
    the carried input kept in a QRNNState instead of module state."""
    sizes = [(4, 6, 2), (6, 6, 1), (6, 4, 1)]
    original = nn.ModuleList(SalesforceQRNNLayer(i, h, save_prev_x=True, window=w) for i, h, w in sizes).double()
    ours = nn.ModuleList(qrnn.QRNNLayer(i, h, window=w, dtype=torch.float64) for i, h, w in sizes)
    ours.load_state_dict(original.state_dict())
    hidden = [torch.zeros(1, 3, h, dtype=torch.float64) for _, h, _ in sizes]
    states = [qrnn.QRNNState(None, (None,)) for _ in sizes]
    for _ in range(3):  # consecutive BPTT batches of one stream
        x = torch.randn(5, 3, 4, dtype=torch.float64)
        a = b = x
        for i in range(len(sizes)):
            a, hidden[i] = original[i](a, hidden[i])
            b, states[i] = ours[i](b, states[i])
        torch.testing.assert_close(b, a)
        for h, s in zip(hidden, states):
            torch.testing.assert_close(s.c, h)
    out, h_n = ours[0](x)  # the GRU-style call: h_n (1, batch, hidden)
    assert h_n.shape == (1, 3, 6)


# ---- Mixed precision, zoneout, dropout --------------------------------------------------


@pytest.mark.parametrize("window", [1, 2])
def test_bf16_autocast(window, monkeypatch):
    model = qrnn.QRNN(8, 16, num_layers=2, window=window)
    x = torch.randn(9, 3, 8, requires_grad=True)
    hx = torch.randn(2, 3, 16)
    want_out, want_h = model(x, hx)
    recorder = GateRecorder(monkeypatch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, h_n = model(x, hx)
    # The GEMM ran in bf16 and the kernel took its bf16 output as is, the float32 state beside it.
    assert [c["gates_dtype"] for c in recorder.calls] == [torch.bfloat16] * 2
    assert [c["c0_dtype"] for c in recorder.calls] == [torch.float32] * 2
    assert out.dtype == torch.bfloat16 and h_n.dtype == torch.float32
    torch.testing.assert_close(out.float(), want_out, atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(h_n, want_h, atol=5e-2, rtol=5e-2)
    out.float().sum().backward()
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
    assert x.grad.dtype == torch.float32


def test_dtype_follows_input_outside_autocast():
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        model = qrnn.QRNN(4, 5, num_layers=2, window=2, dtype=dtype)
        out, h_n = model(torch.randn(6, 2, 4, dtype=dtype), torch.randn(2, 2, 5, dtype=dtype))
        assert out.dtype == dtype and h_n.dtype == dtype
        _, state = model(torch.randn(6, 2, 4, dtype=dtype), model.initial_state())
        expected = torch.float32 if dtype != torch.float64 else dtype
        assert state.c.dtype == expected  # the carried state keeps float32 for 16-bit models


def test_zoneout_masks_and_scale(monkeypatch):
    p = 0.3
    model = qrnn.QRNN(6, 64, num_layers=2, zoneout=p)
    x = torch.randn(40, 8, 6)
    recorder = GateRecorder(monkeypatch)
    model.train()
    model(x)
    for call in recorder.calls:
        mask = call["forget_mask"]
        assert mask.shape == (40, 8, 64) and call["forget_scale"] == 1.0
        assert set(mask.unique().tolist()) <= {0.0, 1.0}  # unscaled: f never exceeds 1
        assert abs(mask.mean().item() - (1 - p)) < 0.02
    assert not torch.equal(recorder.calls[0]["forget_mask"], recorder.calls[1]["forget_mask"])
    recorder.calls.clear()
    model.eval()
    model(x)
    assert all(c["forget_mask"] is None and c["forget_scale"] == pytest.approx(1 - p) for c in recorder.calls)


def test_zoneout_keeps_the_previous_state_exactly():
    """Where the keep mask is 0, f is 0 and the state is carried over bit for bit."""
    model = qrnn.QRNNLayer(3, 50, zoneout=0.5, output_gate=False)
    model.train()
    x = torch.randn(5, 4, 3)
    out, _ = model(x)
    same = out[1:] == out[:-1]
    assert 0.35 < same.float().mean().item() < 0.65


def test_dropout_between_layers_not_after_last():
    model = qrnn.QRNN(4, 6, num_layers=3, dropout=0.5, dtype=torch.float64)
    model.train()
    x = torch.randn(5, 2, 4, dtype=torch.float64)
    torch.manual_seed(7)
    out, h_n = model(x)
    torch.manual_seed(7)
    y = x
    states = []
    for i, layer in enumerate(model.layers):
        y, c_n, _ = layer.run(y)
        states.append(c_n)
        if i < 2:
            y = F.dropout(y, 0.5, training=True)
    torch.testing.assert_close(out, y)
    torch.testing.assert_close(h_n, torch.stack(states))
    assert (out != 0).all()  # nothing dropped after the last layer
    model.eval()
    torch.testing.assert_close(model(x)[0], model(x)[0])


# ---- Bad input, empty input ---------------------------------------------------------------


def test_bad_inputs_raise_value_error_naming_the_argument():
    model = qrnn.QRNN(4, 5, num_layers=2)
    x = torch.randn(6, 3, 4)
    cases = [
        (lambda: model(torch.randn(6, 3, 7)), "input_size"),
        (lambda: model(torch.randn(6, 3, 4, 1)), "input must be 3-D"),
        (lambda: model(x, torch.randn(1, 3, 5)), "hx must have shape"),
        (lambda: model(x, torch.randn(2, 4, 5)), "hx must have shape"),
        (lambda: model(x, lengths=torch.tensor([6, 7, 1])), "lengths must be in 0..seq_len"),
        (lambda: model(x, lengths=torch.tensor([6, -1, 1])), "lengths must be in 0..seq_len"),
        (lambda: model(x, lengths=torch.tensor([6, 2])), "lengths must have shape"),
        (lambda: model(x, lengths=torch.tensor([6.0, 2.0, 1.0])), "lengths must hold integers"),
        (lambda: model(pack_padded_sequence(x, [6, 3, 1]), lengths=torch.tensor([6, 3, 1])), "lengths must be None"),
        (lambda: model(x, qrnn.QRNNState(None, (None,))), "x_tails must have one entry per layer"),
        (lambda: model(x, qrnn.QRNNState(None, (torch.zeros(1, 3, 4), None))), "window-1 layer"),
        (lambda: qrnn.QRNN(4, 5, window=2)(x, qrnn.QRNNState(None, (torch.zeros(2, 3, 4),))), r"x_tails\[0\]"),
        (lambda: qrnn.QRNN(4, 5, window=0), "window"),
        (lambda: qrnn.QRNN(4, 5, window=[1, 2]), "window"),
        (lambda: qrnn.QRNN(4, 5, dropout=1.0), "dropout"),
        (lambda: qrnn.QRNN(4, 5, dropout=-0.1), "dropout"),
        (lambda: qrnn.QRNN(4, 5, zoneout=1.0), "zoneout"),
        (lambda: qrnn.QRNN(4, 0), "hidden_size"),
        (lambda: qrnn.QRNN(4, 5, num_layers=0), "num_layers"),
        (lambda: qrnn.QRNNLayer(4, 5, window=0), "window"),
        (lambda: qrnn.QRNNLayer(4, 5)(x, torch.randn(2, 3, 5)), "hx must have shape"),
    ]
    for fn, message in cases:
        with pytest.raises(ValueError, match=message):
            fn()


@pytest.mark.parametrize("shape", [(0, 3), (5, 0)])
def test_empty_sequence_or_batch(shape):
    T, B = shape
    model = qrnn.QRNN(4, 5, num_layers=2, bidirectional=True, window=2)
    x = torch.randn(T, B, 4, requires_grad=True)
    hx = torch.randn(4, B, 5)
    out, h_n = model(x, hx)
    assert out.shape == (T, B, 10) and h_n.shape == (4, B, 5)
    if T == 0:
        torch.testing.assert_close(h_n, hx)
    (out.sum() + h_n.sum()).backward()
    assert x.grad.shape == x.shape


# ---- compile, DDP -----------------------------------------------------------------------------


def test_torch_compile_fullgraph_with_carried_state():
    model = qrnn.QRNN(4, 6, num_layers=2, window=2, zoneout=0.2)
    model.eval()
    x = torch.randn(7, 3, 4, requires_grad=True)
    lens = torch.tensor([7, 4, 2])

    def step(inp, state):
        out, state = model(inp, state, lengths=lens)
        return out.square().sum(), state

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    loss, state = compiled(x, model.initial_state())
    want_loss, want_state = step(x, model.initial_state())
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(state.c, want_state.c)
    grad = torch.autograd.grad(loss, x)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(want_loss, x)[0])


def test_ddp_with_carried_state():
    """PyTorch's DDP (gloo, one process) wraps the model; the state passes through forward."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}", rank=0, world_size=1)
        try:
            model = qrnn.QRNN(4, 6, num_layers=2, window=2)
            ddp = DistributedDataParallel(model)
            state = model.initial_state()
            for chunk in torch.randn(8, 3, 4).split(4):
                out, state = ddp(chunk, state)
                out.sum().backward()
                state = state.detach()
            assert all(p.grad is not None for p in model.parameters())
        finally:
            dist.destroy_process_group()


# ---- CUDA ---------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cuda_matches_cpu(bidirectional):
    model = qrnn.QRNN(5, 8, num_layers=2, window=2, bidirectional=bidirectional, batch_first=True)
    x = torch.randn(3, 9, 5)
    lens = torch.tensor([9, 4, 1])
    want_out, want_h = model(x, lengths=lens)
    model.cuda()
    xc = x.cuda().requires_grad_()
    out, h_n = model(xc, lengths=lens)
    torch.testing.assert_close(out.cpu(), want_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(h_n.cpu(), want_h, atol=1e-4, rtol=1e-4)
    out.sum().backward()
    assert xc.grad.isfinite().all()


@pytest.mark.cuda
def test_cuda_float16_autocast():
    model = qrnn.QRNN(8, 16, num_layers=2, window=2).cuda()
    x = torch.randn(9, 3, 8, device="cuda")
    want_out, _ = model(x)
    with torch.autocast("cuda", dtype=torch.float16):
        out, h_n = model(x)
    assert out.dtype == torch.float16 and h_n.dtype == torch.float32
    torch.testing.assert_close(out.float(), want_out, atol=1e-2, rtol=1e-2)
    assert HAS_CUDA


def test_lengths_reach_the_device_without_a_host_synchronisation(monkeypatch):
    """Host lengths are checked on the host and moved to the input's device; lengths already
    on a device are checked there (asynchronously), never read back to the host; while a
    CUDA graph is being captured, host lengths raise a clear error instead of a copy."""
    from qrnn.functional import check_lengths as _check_lengths

    on_host = _check_lengths([4, 0, 2], 3, 4, torch.device("cpu"))
    assert on_host.dtype == torch.int64 and on_host.tolist() == [4, 0, 2]
    with pytest.raises(ValueError, match=r"0\.\.seq_len \(4\), got values from 0 to 5"):
        _check_lengths([5, 0, 2], 3, 4, torch.device("cpu"))
    assert _check_lengths(torch.tensor([1, 2]), 2, 4, torch.device("meta")).device.type == "meta"

    reads = []

    class CountHostReads(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads.append(func)
            return func(*args, **(kwargs or {}))

    on_device = torch.tensor([3, 1], device="meta")
    with CountHostReads():
        assert _check_lengths(on_device, 2, 4, torch.device("meta")) is on_device
    assert reads == []
    with pytest.raises(ValueError, match="CPU or the input's device"):
        _check_lengths(on_device, 2, 4, torch.device("cpu"))

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(ValueError, match="CUDA graph is being captured"):
        _check_lengths(torch.tensor([1, 2]), 2, 4, torch.device("cuda"))
