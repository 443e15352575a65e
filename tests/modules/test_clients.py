"""Programs QRNN users already run: the original pytorch-qrnn API through the torchqrnn
package (its README, awd-lstm-lm),
modules put in place of a layer's Linear, generic hidden-state handling, whole-model
pickles loaded with weights_only, ONNX export through onnxruntime, torch.export.

Small programs written in the style of those clients, checked against plain PyTorch
references on fresh random inputs."""

import contextlib
import copy
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import qrnn
import torchqrnn
from qrnn.reference import qrnn_layer_reference

F64 = torch.float64


# ---- Client-style helpers (as users write them) ---------------------------------------


class WeightDrop(nn.Module):
    """awd-lstm-lm's DropConnect wrapper, in its current-PyTorch form: the wrapped module's
    weight becomes a plain attribute recomputed from ``<name>_raw`` at every call."""

    def __init__(self, module, weights, dropout=0.0):
        super().__init__()
        self.module, self.weights, self.dropout = module, weights, dropout
        for name in weights:
            w = getattr(module, name)
            del module._parameters[name]
            module.register_parameter(name + "_raw", nn.Parameter(w.data))

    def _setweights(self):
        for name in self.weights:
            raw = getattr(self.module, name + "_raw")
            # a view, not the Parameter itself, which would register as a parameter again
            w = F.dropout(raw, p=self.dropout, training=True) if self.training else raw.view_as(raw)
            setattr(self.module, name, w)

    def forward(self, *args):
        self._setweights()
        return self.module.forward(*args)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


def reference_layer(layer, x, c0=None, x_tail=None, weight=None):
    """(output, c_n, x_tail_n) of a QRNNLayer from its definition (float64 loop), with the
    layer's own weights or the given ``weight``."""
    lin = layer.linear
    if weight is None:
        weight = lin.weight
    bias = lin.bias if hasattr(lin, "bias") else lin.module.bias
    return qrnn_layer_reference(x, weight, bias, c0, x_tail, window=layer.window, output_gate=layer.output_gate,
                                forget_scale=1.0 - layer.zoneout)


# ---- 1. The original pytorch-qrnn API --------------------------------------------------


def test_layer_original_keywords_and_positions():
    layer = torchqrnn.QRNNLayer(input_size=4, hidden_size=6, save_prev_x=True, zoneout=0, window=2,
                                output_gate=True, use_cuda=True)
    assert (layer.window, layer.save_prev_x, layer.zoneout, layer.output_gate) == (2, True, 0.0, True)
    assert layer.linear.weight.shape == (18, 8)
    # pytorch-qrnn's positional order: (input_size, hidden_size, save_prev_x, zoneout, window, output_gate, use_cuda)
    layer = torchqrnn.QRNNLayer(4, 6, True, 0.25, 2, False, False)
    assert (layer.save_prev_x, layer.zoneout, layer.window, layer.output_gate, layer.use_cuda) == (
        True, 0.25, 2, False, False)
    assert layer.linear.weight.shape == (12, 8)
    # today's positional order is unchanged: (input_size, hidden_size, window, output_gate, zoneout, bias)
    layer = qrnn.QRNNLayer(4, 6, 3, False, 0.5, False)
    assert (layer.window, layer.output_gate, layer.zoneout, layer.linear.bias) == (3, False, 0.5, None)
    assert not getattr(layer, "save_prev_x", False) and layer.hidden_size == 6
    assert qrnn.QRNNLayer(5).hidden_size == 5
    with pytest.raises(TypeError, match="multiple values"):
        qrnn.QRNNLayer(4, 6, 2, window=3)
    with pytest.raises(TypeError, match="positional"):
        qrnn.QRNNLayer(4, 6, 2, True, 0.0, True, True)
    with pytest.raises(ValueError, match="window"):
        torchqrnn.QRNNLayer(4, 6, True, 0.0, 0)


def test_qrnn_original_keywords_and_layers():
    model = torchqrnn.QRNN(4, 4, num_layers=2, dropout=0.1, save_prev_x=True, window=2, use_cuda=False)
    assert all(layer.save_prev_x and layer.window == 2 for layer in model.layers)
    assert model.use_cuda is False
    layers = [torchqrnn.QRNNLayer(4, 6, save_prev_x=True, window=2), torchqrnn.QRNNLayer(6, 6)]
    # pytorch-qrnn: QRNN(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, layers)
    for model in (torchqrnn.QRNN(4, 6, layers=layers), torchqrnn.QRNN(4, 6, 1, True, False, 0, False, layers)):
        assert model.num_layers == 2 and model.windows == [2, 1] and list(model.layers) == layers
        x = torch.randn(5, 3, 4)
        out, h_n = model(x)
        assert out.shape == (5, 3, 6) and h_n.shape == (2, 3, 6)
        model.reset()
    with pytest.raises(ValueError, match="hidden_size"):
        torchqrnn.QRNN(4, 6, layers=[torchqrnn.QRNNLayer(4, 6), torchqrnn.QRNNLayer(6, 5)])
    with pytest.raises(ValueError, match="input_size"):
        torchqrnn.QRNN(4, 6, layers=[torchqrnn.QRNNLayer(4, 6), torchqrnn.QRNNLayer(5, 6)])
    with pytest.raises(ValueError, match="bidirectional"):
        torchqrnn.QRNN(4, 6, bidirectional=True, layers=layers)
    with pytest.raises(TypeError):
        torchqrnn.QRNN(4, 6, not_an_option=1)


def test_layer_returns_like_the_original():
    """forward(X, hidden) -> (H, C[-1:]): hidden (batch, hidden) or (1, batch, hidden) in,
    (1, batch, hidden) out; ``hidden=`` is accepted as the keyword."""
    layer = torchqrnn.QRNNLayer(4, 6, window=2, dtype=F64)
    x, h0 = torch.randn(7, 3, 4, dtype=F64), torch.randn(3, 6, dtype=F64)
    want_out, want_c, _ = reference_layer(layer, x, h0)
    for hidden in (h0, h0.unsqueeze(0)):
        out, h_n = layer(x, hidden)
        torch.testing.assert_close(out, want_out)
        assert h_n.shape == (1, 3, 6)
        torch.testing.assert_close(h_n[0], want_c)
    out, h_n = layer(x, hidden=h0)
    torch.testing.assert_close(out, want_out)
    model = torchqrnn.QRNN(4, 6, num_layers=2, dtype=F64)
    out, h_n = model(x, hidden=torch.randn(2, 3, 6, dtype=F64))
    assert h_n.shape == (2, 3, 6)
    with pytest.raises(TypeError, match="both"):
        layer(x, h0, hidden=h0)


@pytest.mark.parametrize("window", [1, 2, 3])
def test_save_prev_x_carries_inputs_until_reset(window):
    layer = torchqrnn.QRNNLayer(4, 5, save_prev_x=True, window=window, dtype=F64)
    x = torch.randn(9, 2, 4, dtype=F64, requires_grad=True)
    want_out, want_c, _ = reference_layer(layer, x)
    hidden, outs = None, []
    for chunk in x.split([4, 1, 4]):  # consecutive batches of one stream
        out, hidden = layer(chunk, hidden)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs), want_out)
    torch.testing.assert_close(hidden[0], want_c)
    if window > 1:
        torch.testing.assert_close(layer.prevX, x[-(window - 1):].detach())
        assert not layer.prevX.requires_grad  # detached, as in the original
    # The next call reads the kept inputs; after reset() it starts from zeros.
    y = torch.randn(3, 2, 4, dtype=F64)
    tail = None if window == 1 else x[-(window - 1):].detach()
    torch.testing.assert_close(layer(y)[0], reference_layer(layer, y, None, tail)[0])
    layer.reset()
    assert layer.prevX is None
    torch.testing.assert_close(layer(y)[0], reference_layer(layer, y)[0])
    if window > 1:  # a new batch size without reset() is a clear error
        with pytest.raises(ValueError, match="reset"):
            layer(torch.randn(3, 5, 4, dtype=F64))


def test_qrnn_save_prev_x_matches_one_pass():
    model = torchqrnn.QRNN(4, 5, num_layers=2, window=[2, 3], save_prev_x=True, dtype=F64)
    x = torch.randn(10, 3, 4, dtype=F64)
    model.reset()
    hidden, outs = None, []
    for chunk in x.split([3, 3, 4]):
        out, hidden = model(chunk, hidden)
        outs.append(out)
    model.reset()
    want_out, want_h = model(x)
    torch.testing.assert_close(torch.cat(outs), want_out)
    torch.testing.assert_close(hidden, want_h)



# pytorch-qrnn's README, as written there (it runs on a GPU; without one, .cuda() is a no-op).
ORIGINAL_README_QRNN = """
import torch
from torchqrnn import QRNN

seq_len, batch_size, hidden_size = 7, 20, 256
size = (seq_len, batch_size, hidden_size)
X = torch.autograd.Variable(torch.rand(size), requires_grad=True).cuda()

qrnn = QRNN(hidden_size, hidden_size, num_layers=2, dropout=0.4)
qrnn.cuda()
output, hidden = qrnn(X)

print(output.size(), hidden.size())
"""


def test_original_readme_example_runs_unedited(monkeypatch, capsys):
    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
        monkeypatch.setattr(nn.Module, "cuda", lambda self, *args, **kwargs: self)
    namespace: dict = {}
    exec(ORIGINAL_README_QRNN, namespace)
    assert capsys.readouterr().out.strip() == "torch.Size([7, 20, 256]) torch.Size([2, 20, 256])"
    output, X = namespace["output"], namespace["X"]
    assert namespace["hidden"].shape == (2, 20, 256)
    output.sum().backward()  # X is a non-leaf after .cuda(); the layers' weights get gradients
    assert all(p.grad is not None for p in namespace["qrnn"].parameters())
    assert isinstance(namespace["qrnn"], qrnn.QRNN) and X.shape == (7, 20, 256)


def test_forget_mult_module_as_the_original():
    """``ForgetMult()(f, x, hidden_init, use_cuda)``: its recurrence, hidden_init optional, of
    shape (batch, hidden) or a layer's (1, batch, hidden), differentiable in all three."""
    from torchqrnn.forget_mult import ForgetMult

    assert ForgetMult is torchqrnn.ForgetMult
    f = torch.rand(5, 3, 4, dtype=F64, requires_grad=True)
    x = torch.randn(5, 3, 4, dtype=F64, requires_grad=True)
    h0 = torch.randn(3, 4, dtype=F64, requires_grad=True)
    want = torch.stack(_forget_mult_steps(f, x, h0))
    torch.testing.assert_close(ForgetMult()(f, x, h0), want)
    torch.testing.assert_close(ForgetMult()(f, x, h0.unsqueeze(0), use_cuda=False), want)
    torch.testing.assert_close(ForgetMult()(f, x), torch.stack(_forget_mult_steps(f, x, torch.zeros_like(h0))))
    assert torch.autograd.gradcheck(ForgetMult(), (f, x, h0))


def _forget_mult_steps(f, x, h):
    steps = []
    for t in range(f.shape[0]):
        h = f[t] * x[t] + (1 - f[t]) * h
        steps.append(h)
    return steps


def test_original_module_paths_and_cross_api_state_dicts():
    """torchqrnn.qrnn holds the layers as in pytorch-qrnn; a model of either API loads the
    other's state dict strictly and computes the same."""
    from torchqrnn.qrnn import QRNN, QRNNLayer

    assert (QRNN, QRNNLayer) == (torchqrnn.QRNN, torchqrnn.QRNNLayer)
    assert issubclass(QRNN, qrnn.QRNN) and issubclass(QRNNLayer, qrnn.QRNNLayer)
    original = QRNN(4, 6, num_layers=2, window=2, save_prev_x=True, dtype=F64).eval()
    today = qrnn.QRNN(4, 6, num_layers=2, window=2, dtype=F64).eval()
    today.load_state_dict(original.state_dict())
    x, h0 = torch.randn(5, 3, 4, dtype=F64), torch.randn(2, 3, 6, dtype=F64)
    for got, want in zip(today(x, h0), original(x, h0)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    original.reset()
    original.load_state_dict(qrnn.QRNN(4, 6, num_layers=2, window=2, dtype=F64).state_dict())
    layer = QRNNLayer(4, 6, True, 0, 2)
    layer.load_state_dict(qrnn.QRNNLayer(4, 6, window=2).state_dict())


def test_pickled_original_api_models_load_in_a_fresh_process(tmp_path):
    """A whole torchqrnn model, pickled, loads under weights_only once torchqrnn is imported,
    with the inputs save_prev_x kept."""
    path = tmp_path / "model.pt"
    model = torchqrnn.QRNN(3, 4, 2, window=2, save_prev_x=True)
    model(torch.randn(5, 2, 3))
    torch.save(model, path)
    code = ("import sys, torch, torchqrnn\n"
            "m = torch.load(sys.argv[1], weights_only=True)\n"
            "assert type(m) is torchqrnn.QRNN and type(m.layers[0]) is torchqrnn.QRNNLayer\n"
            "assert m.layers[0].prevX.shape == (1, 2, 3) and m.layers[0].save_prev_x\n")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=300)

# ---- 2. Whatever sits at .linear is called ---------------------------------------------


def test_weight_drop_wrapper_is_called():
    torch.manual_seed(1)
    layer = torchqrnn.QRNNLayer(input_size=4, hidden_size=5, save_prev_x=True, window=2, dtype=F64)
    plain = copy.deepcopy(layer)
    layer.linear = WeightDrop(layer.linear, ["weight"], dropout=0.5)
    assert "window=2" in repr(layer)  # extra_repr without .linear.weight/.bias
    x = torch.randn(6, 3, 4, dtype=F64)
    layer.train()
    out, h_n = layer(x)
    used = layer.linear.module.weight  # this call's dropped weight
    assert (used == 0).any()
    want_out, want_c, _ = reference_layer(layer, x, weight=used)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(h_n[0], want_c)
    out.square().sum().backward()
    raw = layer.linear.module.weight_raw
    assert raw.grad is not None and (raw.grad[used == 0] == 0).all() and raw.grad.abs().sum() > 0
    # Evaluation: no dropout, the same as the unwrapped layer.
    layer.eval(), plain.eval()
    layer.reset(), plain.reset()
    torch.testing.assert_close(layer(x)[0], plain(x)[0])


def test_parametrized_hooked_and_adapter_linears_take_effect():
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    x = torch.randn(5, 2, 3, dtype=F64)
    layer = qrnn.QRNNLayer(3, 4, window=2, dtype=F64)
    weight = layer.linear.weight.detach().clone()
    parametrize.register_parametrization(layer.linear, "weight", Double())
    torch.testing.assert_close(layer(x)[0], reference_layer(layer, x, weight=2 * weight)[0])

    layer = qrnn.QRNNLayer(3, 4, dtype=F64)
    seen = []
    handle = layer.linear.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    layer(x)
    assert seen == [(5, 2, 12)]
    handle.remove()
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(type(module).__name__))
    try:
        layer(x)
    finally:
        handle.remove()
    assert "Linear" in seen[1:]  # a global hook sees the Linear called too

    class LoRALinear(nn.Linear):  # an adapter: W x + B A x
        def __init__(self, base, rank=2):
            super().__init__(base.in_features, base.out_features, dtype=base.weight.dtype)
            self.load_state_dict(base.state_dict())
            self.a = nn.Parameter(torch.randn(rank, base.in_features, dtype=base.weight.dtype))
            self.b = nn.Parameter(torch.randn(base.out_features, rank, dtype=base.weight.dtype))

        def forward(self, x):
            return super().forward(x) + F.linear(F.linear(x, self.a), self.b)

    layer = qrnn.QRNNLayer(3, 4, window=2, dtype=F64)
    layer.linear = LoRALinear(layer.linear)
    merged = layer.linear.weight + layer.linear.b @ layer.linear.a
    torch.testing.assert_close(layer(x)[0], reference_layer(layer, x, weight=merged.detach())[0])


class Int8Linear(nn.Module):
    """A weight-only int8 linear as users write them: int8 weight and per-row scale as
    buffers, no floating-point parameter (so the layer cannot check dtypes against one).
    (torch.ao's dynamic quantization is deprecated, and its first use silences a warn-once
    warning that other tests expect.)"""

    def __init__(self, linear):
        super().__init__()
        w = linear.weight.detach()
        scale = w.abs().amax(1, keepdim=True) / 127
        self.register_buffer("qweight", torch.round(w / scale).to(torch.int8))
        self.register_buffer("qscale", (scale * 2 ** 20).round().to(torch.int64))  # fixed point
        self.register_buffer("qbias", (linear.bias.detach() * 2 ** 20).round().to(torch.int64))

    def weight_float(self):
        return self.qweight.float() * (self.qscale.float() / 2 ** 20)

    def forward(self, x):
        return F.linear(x, self.weight_float().to(x.dtype), (self.qbias.float() / 2 ** 20).to(x.dtype))


def test_quantized_linear_is_called():
    torch.manual_seed(9)
    model = qrnn.QRNN(8, 16, num_layers=2, window=[2, 1]).eval()
    x = torch.randn(6, 3, 8)
    want, _ = model(x)
    quantized = copy.deepcopy(model)
    for layer in quantized.layers:
        layer.linear = Int8Linear(layer.linear)
    repr(quantized)
    got, _ = quantized(x)
    assert not torch.equal(got, want)  # the int8 weights were used ...
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)  # ... and approximate the float ones
    layer = quantized.layers[0]
    q_out, q_c, _ = qrnn_layer_reference(x.double(), layer.linear.weight_float().double(),
                                         (layer.linear.qbias.double() / 2 ** 20), window=2)
    torch.testing.assert_close(quantized.layers[0](x)[0].double(), q_out, atol=1e-5, rtol=1e-5)


def test_plain_linear_keeps_the_direct_path(monkeypatch):
    layer = qrnn.QRNNLayer(3, 4)

    def forbidden(self, x):
        raise AssertionError("a plain nn.Linear is applied with F.linear, not called")

    monkeypatch.setattr(nn.Linear, "forward", forbidden)
    layer(torch.randn(5, 2, 3))


# ---- Hidden state through generic code --------------------------------------------------


@pytest.mark.parametrize("batch_first", [False, True])
def test_state_through_repackage_hidden(batch_first):
    """A QRNNState (also a window-1 layer's) survives a tuple-rebuilding detach: its plain
    (c, x_tails) tuple is accepted as hx and gives the same result as the QRNNState."""
    model = qrnn.QRNN(4, 5, num_layers=3, window=[2, 1, 3], batch_first=batch_first, dtype=F64)
    shape = (2, 4, 4) if batch_first else (4, 2, 4)
    hidden = repackage_hidden(model.initial_state(2))
    assert type(hidden) is tuple
    state = model.initial_state()
    for _ in range(3):
        x = torch.randn(shape, dtype=F64)
        out, hidden = model(x, repackage_hidden(hidden))
        want_out, state = model(x, state)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(hidden.c, state.c)
        assert isinstance(hidden, qrnn.QRNNState)
    assert hidden.x_tails[1].shape == ((2, 0, 5) if batch_first else (0, 2, 5))
    layer = qrnn.QRNNLayer(4, 5, dtype=F64)
    x = torch.randn(4, 2, 4, dtype=F64)
    _, s = layer(x, qrnn.QRNNState())
    out, s2 = layer(x, repackage_hidden(s))
    torch.testing.assert_close(out, reference_layer(layer, x, s.c[0])[0])
    out, _ = layer(x, [s.c, [s.x_tails[0]]])  # a list of the fields
    torch.testing.assert_close(out, reference_layer(layer, x, s.c[0])[0])
    with pytest.raises(ValueError, match="hx must be"):
        layer(x, (torch.zeros(1, 2, 5), torch.zeros(1, 2, 5)))  # an LSTM-style (h, c) pair


# ---- An awd-lstm-lm program (its model.py's QRNN branch), unchanged ---------------------------


class LockedDropout(nn.Module):
    def forward(self, x, dropout=0.5):
        if not self.training or not dropout:
            return x
        m = x.data.new(1, x.size(1), x.size(2)).bernoulli_(1 - dropout)
        return x * (m / (1 - dropout))


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2, wdrop=0.3):
        super().__init__()
        self.lockdrop = LockedDropout()
        self.encoder = nn.Embedding(ntoken, ninp)
        from torchqrnn import QRNNLayer
        self.rnns = [QRNNLayer(input_size=ninp if layer == 0 else nhid,
                               hidden_size=nhid if layer != nlayers - 1 else ninp, save_prev_x=True,
                               zoneout=0, window=2 if layer == 0 else 1, output_gate=True)
                     for layer in range(nlayers)]
        for rnn in self.rnns:
            rnn.linear = WeightDrop(rnn.linear, ["weight"], dropout=wdrop)
        self.rnns = torch.nn.ModuleList(self.rnns)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight
        self.ninp, self.nhid, self.nlayers, self.dropout = ninp, nhid, nlayers, dropout

    def reset(self):
        [r.reset() for r in self.rnns]

    def forward(self, input, hidden):
        raw_output = self.lockdrop(self.encoder(input), self.dropout)
        new_hidden = []
        for layer, rnn in enumerate(self.rnns):
            raw_output, new_h = rnn(raw_output, hidden[layer])
            new_hidden.append(new_h)
            if layer != self.nlayers - 1:
                raw_output = self.lockdrop(raw_output, self.dropout)
        output = self.lockdrop(raw_output, self.dropout)
        decoded = self.decoder(output.view(output.size(0) * output.size(1), output.size(2)))
        return decoded.view(output.size(0), output.size(1), decoded.size(1)), new_hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters()).data
        return [weight.new(1, bsz, self.nhid if layer != self.nlayers - 1 else self.ninp).zero_()
                for layer in range(self.nlayers)]


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def test_awd_lstm_lm_style_training_and_evaluation():
    torch.manual_seed(0)
    ntokens, bptt = 12, 6
    stream = torch.arange(ntokens).repeat(40)  # a learnable cycle
    train_data, val_data = batchify(stream, 4), batchify(stream, 2)
    model = RNNModel(ntokens, 8, 8, 3, dropout=0.1, wdrop=0.1)  # tied decoder: nhid == ninp
    print(model.rnns)  # awd-lstm-lm prints them (extra_repr with wrapped linears)
    params = list(model.parameters())
    optimizer = torch.optim.SGD(params, lr=5.0)

    def evaluate(data_source, batch_size):
        model.eval()
        model.reset()
        total, hidden = 0.0, model.init_hidden(batch_size)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, bptt):
                seq_len = min(bptt, len(data_source) - 1 - i)
                data, targets = data_source[i:i + seq_len], data_source[i + 1:i + 1 + seq_len].reshape(-1)
                output, hidden = model(data, hidden)
                total += len(data) * F.cross_entropy(output.view(-1, ntokens), targets).item()
                hidden = repackage_hidden(hidden)
        return total / len(data_source)

    before = evaluate(val_data, 2)
    for _epoch in range(5):
        model.train()
        model.reset()
        hidden = model.init_hidden(4)
        for i in range(0, train_data.size(0) - 1, bptt):
            seq_len = min(bptt, len(train_data) - 1 - i)
            data, targets = train_data[i:i + seq_len], train_data[i + 1:i + 1 + seq_len].reshape(-1)
            hidden = repackage_hidden(hidden)
            optimizer.zero_grad()
            output, hidden = model(data, hidden)
            loss = F.cross_entropy(output.view(-1, ntokens), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.25)
            optimizer.step()
    after = evaluate(val_data, 2)
    assert after < 0.6 * before
    # Evaluation in chunks with save_prev_x equals one pass over the whole stream.
    model.eval()
    model.reset()
    data = val_data[:12]
    chunked, hidden = [], model.init_hidden(2)
    for chunk in data.split(5):
        out, hidden = model(chunk, hidden)
        chunked.append(out)
    model.reset()
    whole, _ = model(data, model.init_hidden(2))
    torch.testing.assert_close(torch.cat(chunked), whole)
    # The state dict loads strictly into a fresh model.
    fresh = RNNModel(ntokens, 8, 8, 3)
    fresh.load_state_dict(model.state_dict(), strict=True)


def test_star_import_names():
    namespace = {}
    exec("from qrnn import *", namespace)
    assert namespace["QRNNLayer"] is qrnn.QRNNLayer and namespace["QRNN"] is qrnn.QRNN
    namespace = {}
    exec("from torchqrnn import *", namespace)
    assert (namespace["QRNNLayer"], namespace["QRNN"], namespace["ForgetMult"]) == (
        torchqrnn.QRNNLayer, torchqrnn.QRNN, torchqrnn.ForgetMult)


# ---- 3. Pickled models load with weights_only ------------------------------------------


class WordModel(nn.Module):
    """PyTorch's word_language_model RNNModel with ``--model QRNN``."""

    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = qrnn.QRNN(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden):
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        return F.log_softmax(self.decoder(self.drop(output)), dim=-1), hidden


def _roundtrip(model, allowlist):
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    if not hasattr(torch.serialization, "safe_globals"):  # torch < 2.5: the process-wide list only
        torch.serialization.add_safe_globals(allowlist)
        return torch.load(buffer, weights_only=True)
    with torch.serialization.safe_globals(allowlist):
        return torch.load(buffer, weights_only=True)


def test_pickled_models_load_weights_only():
    tokens = torch.randint(0, 10, (7, 2))
    # The allowlist the word_language_model example uses for nn.LSTM / nn.GRU models.
    model = WordModel(10, 6, 8, 2).eval()
    loaded = _roundtrip(model, [WordModel, nn.Dropout, nn.Embedding, nn.Linear])
    hidden = torch.randn(2, 2, 8)
    for got, want in zip(loaded(tokens, hidden), model(tokens, hidden)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # awd-lstm-lm: QRNNLayers with wrapped linears and inputs kept by save_prev_x.
    model = RNNModel(10, 8, 8, 2).eval()
    model(tokens, model.init_hidden(2))
    loaded = _roundtrip(model, [RNNModel, LockedDropout, WeightDrop, nn.Embedding, nn.Linear])
    torch.testing.assert_close(loaded.rnns[0].prevX, model.rnns[0].prevX)
    want, _ = model(tokens, model.init_hidden(2))
    got, _ = loaded(tokens, loaded.init_hidden(2))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_safe_globals_registered_on_import():
    code = ("import io, torch, qrnn\n"
            "b = io.BytesIO(); torch.save(qrnn.QRNN(3, 4, 2, window=2), b); b.seek(0)\n"
            "m = torch.load(b, weights_only=True)\n"
            "assert type(m) is qrnn.QRNN and type(m.layers[0]) is qrnn.QRNNLayer\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.skipif(not hasattr(torch.serialization, "safe_globals"), reason="torch < 2.5 has no safe_globals block")
def test_safe_globals_survive_a_users_safe_globals_block():
    """A user's safe_globals block listing classes that import qrnn allowed (nn.Linear, set,
    even qrnn's own) removes them on exit; pickled qrnn and torchqrnn models still load with
    weights_only=True afterwards (torch >= 2.6; torch 2.5's allowlist cannot keep them)."""
    code = ("import io, torch, qrnn, torchqrnn\n"
            "from qrnn.safe_globals import named_entries_supported\n"
            "if not named_entries_supported(): raise SystemExit(3)\n"
            "saved = []\n"
            "for model in (qrnn.QRNN(3, 4, 2, window=2), torchqrnn.QRNN(3, 4, num_layers=2)):\n"
            "    b = io.BytesIO(); torch.save(model, b); saved.append((type(model), b))\n"
            "for block in ([torch.nn.Linear, set], [qrnn.QRNN, qrnn.QRNNLayer, qrnn.QRNNState, torch.nn.ModuleList,\n"
            "              torchqrnn.QRNN, torchqrnn.QRNNLayer, torchqrnn.ForgetMult]):\n"
            "    with torch.serialization.safe_globals(block):\n"
            "        pass\n"
            "for cls, b in saved:\n"
            "    b.seek(0)\n"
            "    assert type(torch.load(b, weights_only=True)) is cls\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if result.returncode == 3:
        pytest.skip(f"torch {torch.__version__}'s allowlist takes no (object, name) entries")
    assert result.returncode == 0, result.stderr


# ---- 4. ONNX and torch.export ------------------------------------------------------------


def _onnx_modules():
    try:
        import onnxruntime
        import onnxscript  # noqa: F401
    except ImportError as e:
        pytest.skip(f"onnx export needs onnxscript and onnxruntime: {e}")
    return onnxruntime


def _onnx_check(model, args, kwargs=None, use_table=False, **export_kwargs):
    """Export, run in onnxruntime on the example inputs and fresh ones, compare with PyTorch."""
    ort = _onnx_modules()
    import qrnn.onnx
    kwargs = kwargs or {}
    model.eval()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if use_table:  # the one-line form the README documents
            program = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True,
                                        custom_translation_table=qrnn.onnx.custom_translation_table(),
                                        **export_kwargs)
        else:
            program = qrnn.onnx.export(model, args, kwargs=kwargs, **export_kwargs)
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    worst = 0.0
    for _ in range(2):  # the traced inputs, then fresh ones of the same shapes
        feeds = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        for module in model.modules():  # the exported graph starts from zeros: so does each eager call
            if isinstance(module, torchqrnn.QRNNLayer):
                module.reset()
        with torch.no_grad():
            want = torch.utils._pytree.tree_leaves(model(*args, **kwargs))
        got = session.run(None, {n: t.numpy() for n, t in zip(names, feeds)})
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            worst = max(worst, float(abs(torch.from_numpy(g) - w).max()))
        args = tuple(torch.randn_like(a) if a.is_floating_point() else a for a in args)
    assert worst <= 1e-5, worst
    return worst


ONNX_CASES = [  # (window, num_layers, bidirectional, output_gate, h0, batch_first)
    (1, 1, False, True, False, False),
    (2, 2, False, True, True, False),
    (3, 2, True, True, True, True),
    (2, 1, True, False, False, True),
    ([2, 1], 2, False, False, True, True),
    (1, 2, True, True, False, False),
    ((3, 2), 2, True, False, True, False),
]


@pytest.mark.parametrize("window, layers, bidirectional, output_gate, h0, batch_first", ONNX_CASES,
                         ids=lambda v: str(v))
def test_onnx_matches_pytorch(window, layers, bidirectional, output_gate, h0, batch_first):
    torch.manual_seed(2)
    model = qrnn.QRNN(5, 6, num_layers=layers, window=window, bidirectional=bidirectional,
                      output_gate=output_gate, batch_first=batch_first, zoneout=0.2,
                      dropout=0.3 if layers > 1 else 0.0)
    x = torch.randn((3, 7, 5) if batch_first else (7, 3, 5))
    args = (x, torch.randn(layers * (2 if bidirectional else 1), 3, 6)) if h0 else (x,)
    _onnx_check(model, args)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float16, 2e-3)])
def test_onnx_other_dtypes(dtype, tolerance):
    """float64 runs the Scan in float64; float16 gates compute in float32 (state in float32)
    as the kernels do. (bfloat16 exports too, but onnxruntime's CPU Gemm has no bfloat16.)"""
    ort = _onnx_modules()
    import qrnn.onnx
    torch.manual_seed(8)
    model = qrnn.QRNN(5, 6, num_layers=2, window=2, dtype=dtype).eval()
    x, h0 = torch.randn(7, 3, 5, dtype=dtype), torch.randn(2, 3, 6, dtype=dtype)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = qrnn.onnx.export(model, (x, h0))
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, dict(zip(names, (x.numpy(), h0.numpy()))))
    with torch.no_grad():
        want = model(x, h0)
    for g, w in zip(got, want):
        assert g.dtype == w.numpy().dtype
        torch.testing.assert_close(torch.from_numpy(g), w, atol=tolerance, rtol=tolerance)


def test_onnx_lengths_and_documented_table():
    torch.manual_seed(3)
    model = qrnn.QRNN(5, 6, num_layers=2, window=2, bidirectional=True)
    _onnx_check(model, (torch.randn(7, 3, 5), torch.randn(4, 3, 6)), dict(lengths=torch.tensor([7, 2, 5])),
                use_table=True)


def test_onnx_dynamic_sequence_length_and_batch():
    ort = _onnx_modules()
    import qrnn.onnx
    torch.manual_seed(4)
    model = qrnn.QRNN(5, 6, num_layers=2, window=[2, 1]).eval()
    seq, batch = torch.export.Dim("seq", min=2), torch.export.Dim("batch", min=2)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = qrnn.onnx.export(model, (torch.randn(7, 3, 5),), dynamic_shapes=({0: seq, 1: batch},))
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in ((4, 2, 5), (11, 5, 5)):
        x = torch.randn(shape)
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        with torch.no_grad():
            want = model(x)
        for g, w in zip(got, want):
            torch.testing.assert_close(torch.from_numpy(g), w, atol=1e-5, rtol=1e-5)


def test_plain_onnx_export_after_importing_qrnn_onnx(tmp_path):
    """word_language_model's --onnx-export: torch.onnx.export(model, (input, hidden), path),
    unchanged, once qrnn.onnx is imported (its translations join the exporter's table)."""
    ort = _onnx_modules()
    import qrnn.onnx
    if not qrnn.onnx.registered:
        pytest.skip("this torch version's exporter table is not extensible; pass custom_translation_table")
    torch.manual_seed(6)
    model = WordModel(10, 6, 8, 2).eval()
    tokens, hidden = torch.randint(0, 10, (7, 3)), torch.randn(2, 3, 8)
    path = os.path.join(tmp_path, "model.onnx")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (tokens, hidden), path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    got = session.run(None, dict(zip(names, (tokens.numpy(), hidden.numpy()))))
    with torch.no_grad():
        want = model(tokens, hidden)
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.from_numpy(g), w, atol=1e-5, rtol=1e-5)


class AWDExport(nn.Module):
    """An awd-lstm-lm RNNModel (QRNNLayers with save_prev_x and WeightDrop-wrapped linears)
    behind a flat-argument forward for export."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, h0, h1):
        output, hidden = self.model(tokens, [h0, h1])
        return (output, *hidden)


def test_onnx_awd_lstm_lm_model():
    torch.manual_seed(7)
    model = AWDExport(RNNModel(12, 8, 8, 2, dropout=0.1, wdrop=0.1))
    _onnx_check(model, (torch.randint(0, 12, (7, 2)), torch.randn(1, 2, 8), torch.randn(1, 2, 8)))


class ForgetMultModel(nn.Module):
    def __init__(self, batch_first):
        super().__init__()
        self.batch_first = batch_first

    def forward(self, f, x, h0):
        return qrnn.forget_mult(torch.sigmoid(f), torch.tanh(x), h0, batch_first=self.batch_first)


@pytest.mark.parametrize("batch_first", [False, True])
def test_onnx_forget_mult(batch_first):
    shape = (3, 6, 4) if batch_first else (6, 3, 4)
    _onnx_check(ForgetMultModel(batch_first), (torch.randn(shape), torch.randn(shape), torch.randn(3, 4)))


class LinearScanModel(nn.Module):
    """Decays in (0, 1) and inputs from two projections, as the docs' recipes compute them."""

    def __init__(self, reverse, batch_first):
        super().__init__()
        self.decay, self.input = nn.Linear(5, 4), nn.Linear(5, 4)
        self.reverse, self.batch_first = reverse, batch_first

    def forward(self, x, h0=None):
        a = torch.sigmoid(self.decay(x))
        return qrnn.linear_scan(a, self.input(x), h0, reverse=self.reverse, batch_first=self.batch_first)


@pytest.mark.parametrize("reverse, batch_first, h0", [(False, False, False), (True, False, True),
                                                      (False, True, True), (True, True, False)],
                         ids=lambda v: str(v))
def test_onnx_linear_scan(reverse, batch_first, h0):
    torch.manual_seed(9)
    x = torch.randn((3, 6, 5) if batch_first else (6, 3, 5))
    _onnx_check(LinearScanModel(reverse, batch_first), (x, torch.randn(3, 4)) if h0 else (x,))


class LinearScan(nn.Module):
    def forward(self, a, b, h0):
        return qrnn.linear_scan(a, b, h0, reverse=True)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float16, 2e-3)])
def test_onnx_linear_scan_dtypes_and_a_new_length(dtype, tolerance):
    """float64 scans in float64; float16 with a float32 h0 scans in float32 (as the kernels do)
    and rounds h once; the exported dynamic sequence length runs at another length. Decays
    just below 1 (long memory) keep their precision: a is used as given, never as 1 - a."""
    ort = _onnx_modules()
    import qrnn.onnx
    state = torch.float32 if dtype == torch.float16 else dtype
    near_one = 1e-7 if dtype == torch.float64 else 1e-3

    def inputs(length):
        a = (1 - near_one * torch.rand(length, 3, 4, dtype=F64)).to(dtype)
        return a, torch.randn(length, 3, 4, dtype=dtype), torch.randn(3, 4, dtype=state)

    seq = torch.export.Dim("seq", min=2)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = qrnn.onnx.export(LinearScan(), inputs(7), dynamic_shapes=({0: seq}, {0: seq}, None))
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for length in (7, 12):
        args = inputs(length)
        (got,) = session.run(None, {n: t.numpy() for n, t in zip(names, args)})
        with torch.no_grad():
            want = LinearScan()(*args)
        assert got.dtype == want.numpy().dtype and got.shape == tuple(want.shape)
        torch.testing.assert_close(torch.from_numpy(got), want, atol=tolerance, rtol=tolerance)


def test_onnx_module_is_lazy_and_errors_are_clear():
    code = "import sys, qrnn; assert 'onnxscript' not in sys.modules and 'qrnn.onnx' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    _onnx_modules()
    import qrnn.onnx
    table = qrnn.onnx.custom_translation_table()
    for backward in ("qrnn_gates_backward", "forget_mult_backward", "linear_scan_backward"):
        with pytest.raises(NotImplementedError, match="inference"):
            table[getattr(torch.ops.qrnn, backward).default]()
    with pytest.raises(ValueError, match="dynamo"):
        qrnn.onnx.export(qrnn.QRNN(2, 2), (torch.randn(3, 1, 2),), dynamo=False)


def test_export_ignores_inputs_kept_by_save_prev_x():
    model = torchqrnn.QRNN(5, 6, num_layers=2, window=2, save_prev_x=True).eval()
    model(torch.randn(4, 3, 5))  # keeps inputs in each layer
    x = torch.randn(7, 3, 5)
    program = torch.export.export(model, (x,))
    model.reset()
    with torch.no_grad():
        want = model(x)
    for g, w in zip(program.module()(x), want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_torch_export_save_load_round_trip(tmp_path, bidirectional):
    torch.manual_seed(5)
    model = qrnn.QRNN(5, 6, num_layers=2, window=[2, 1], bidirectional=bidirectional, zoneout=0.1).eval()
    x, h0 = torch.randn(7, 3, 5), torch.randn(4 if bidirectional else 2, 3, 6)
    program = torch.export.export(model, (x, h0))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "qrnn.qrnn_gates.default" in targets  # the fused op, not a decomposition
    path = os.path.join(tmp_path, "qrnn.pt2")
    torch.export.save(program, path)
    loaded = torch.export.load(path).module()
    for _ in range(2):
        with torch.no_grad():
            want = model(x, h0)
        got = loaded(x, h0)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        x, h0 = torch.randn_like(x), torch.randn_like(h0)
