"""Bad-input sweep of qrnn.QRNN, QRNNLayer and qrnn_layer: bad constructor and forward
arguments, meta tensors, NaN and empty inputs. Each call must raise a TypeError or
ValueError naming the argument, or propagate the values correctly; never crash or hang.
"""

import re

import pytest
import torch

from qrnn import QRNN, QRNNLayer, QRNNState, qrnn_layer


@pytest.mark.parametrize("kwargs, match", [
    (dict(input_size=0, hidden_size=3), "input_size"),
    (dict(input_size="3", hidden_size=3), "input_size"),
    (dict(input_size=3, hidden_size=-1), "hidden_size"),
    (dict(input_size=3, hidden_size=3, num_layers=1.5), "num_layers"),
    (dict(input_size=3, hidden_size=3, num_layers=True), "num_layers"),
    (dict(input_size=3, hidden_size=3, num_layers=2, window=[1]), "window"),
    (dict(input_size=3, hidden_size=3, window=0), "window"),
    (dict(input_size=3, hidden_size=3, zoneout=1.0), "zoneout"),
    (dict(input_size=3, hidden_size=3, zoneout=float("nan")), "zoneout"),
    (dict(input_size=3, hidden_size=3, dropout=-0.1), "dropout"),
], ids=lambda v: repr(v)[:50])
def test_qrnn_constructor_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        QRNN(**kwargs)


@pytest.mark.parametrize("call, match", [
    (lambda m: m([1, 2, 3]), "input must be"),
    (lambda m: m(torch.rand(2, 2, 2, 3)), "3-D"),
    (lambda m: m(torch.rand(2, 2, 4)), "input_size"),
    (lambda m: m(torch.ones(2, 2, 3, dtype=torch.int64)), "type"),
    (lambda m: m(torch.rand(2, 2, 3, dtype=torch.float64)), "type"),
    (lambda m: m(torch.rand(2, 2, 3).bfloat16()), "type"),
    (lambda m: m(torch.rand(2, 2, 3), torch.rand(2, 2, 3)), "hx must have shape"),
    (lambda m: m(torch.rand(2, 2, 3), [1]), "hx must be"),
    (lambda m: m(torch.rand(2, 2, 3), torch.rand(1, 2, 3, device="meta")), "device"),
    (lambda m: m(torch.rand(2, 2, 3), lengths=torch.tensor([3, 1])), "lengths"),
    (lambda m: m(torch.rand(2, 2, 3), lengths=torch.tensor([1.0, 1.0])), "lengths"),
    (lambda m: m(torch.rand(2, 2, 3), lengths=torch.tensor([1, 1, 1])), "lengths"),
    (lambda m: m(torch.rand(2, 2, 3), QRNNState("c")), "hx.c"),
    (lambda m: m(torch.rand(2, 2, 3), QRNNState(None, (None, None))), "x_tails"),
], ids=lambda v: None)
def test_qrnn_forward_bad_arguments(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(QRNN(3, 3))


@pytest.mark.parametrize("call, match", [
    (lambda: QRNNLayer(3)(torch.rand(2, 2, 4)), "input_size"),
    (lambda: QRNNLayer(3)(torch.rand(2, 2, 3), torch.rand(5)), "hx"),
    (lambda: QRNNLayer(3)(torch.rand(2, 2, 3), "x"), "hx"),
    (lambda: QRNNLayer(3)(torch.rand(2, 2, 3, dtype=torch.float64)), "type"),
    (lambda: QRNNLayer(3, window=2)(torch.rand(2, 2, 3), QRNNState(None, (torch.rand(5, 5, 5),))), "x_tails"),
    (lambda: QRNNLayer(0), "input_size"),
    (lambda: qrnn_layer(torch.rand(2, 2, 3), torch.rand(9, 3), window=0), "window"),
    (lambda: qrnn_layer(torch.rand(2, 2, 3), torch.rand(9, 3), zoneout=1.5, training=True), "zoneout"),
    (lambda: qrnn_layer(torch.rand(2, 2, 3), torch.rand(5, 3)), "multiple of 3"),
], ids=lambda v: None)
def test_qrnn_layer_bad_arguments(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_qrnn_meta_nan_and_empty():
    # A model built on the meta device infers shapes.
    model = QRNN(3, 4, num_layers=2, bidirectional=True, device="meta")
    out, h_n = model(torch.empty(5, 2, 3, device="meta"))
    assert out.shape == (5, 2, 8) and h_n.shape == (4, 2, 4) and out.device.type == "meta"
    # NaN in one sequence stays in that sequence.
    model = QRNN(3, 4)
    x = torch.rand(4, 2, 3)
    x[0, 0, 0] = float("nan")
    out, h_n = model(x)
    assert out[:, 0].isnan().all() and not out[:, 1].isnan().any()
    # Empty time, batch, or both, bidirectional and stacked.
    model = QRNN(3, 4, num_layers=2, bidirectional=True)
    for shape in ((0, 2, 3), (2, 0, 3), (0, 0, 3)):
        x = torch.rand(shape, requires_grad=True)
        out, h_n = model(x)
        assert out.shape == shape[:2] + (8,) and h_n.shape == (4, shape[1], 4)
        (out.sum() + h_n.sum()).backward()
        assert x.grad.shape == shape


@pytest.mark.parametrize("module", ["QRNN", "QRNNLayer"])
def test_input_and_parameters_on_different_devices(module):
    """One line naming input, both devices and the two ways out, at the module's call (not
    torch's error many frames deep); a state on another device than the input names hx."""
    make = (lambda **kw: QRNN(3, 4, num_layers=2, window=2, **kw)) if module == "QRNN" else (
        lambda **kw: QRNNLayer(3, 4, window=2, **kw))
    x = torch.rand(5, 2, 3)
    with pytest.raises(ValueError, match=rf"^input is on cpu but the parameters of qrnn\.{module} are on meta: "
                                         r"move the input with input\.to\('meta'\), or the model with "
                                         r"model\.to\('cpu'\)$"):
        make(device="meta")(x)
    with pytest.raises(ValueError, match=rf"^input is on meta but the parameters of qrnn\.{module} are on cpu"):
        make()(x.to("meta"))
    model, layers = make(), (2 if module == "QRNN" else 1)
    with pytest.raises(ValueError, match=r"^hx is on meta but input is on cpu: pass hx on the input's device "
                                         r"\(hx\.to\('cpu'\)\)$"):
        model(x, torch.zeros(layers, 2, 4, device="meta"))
    state = model(x, QRNNState())[1]
    with pytest.raises(ValueError, match=r"^hx\.c is on meta but input is on cpu"):
        model(x, QRNNState(state.c.to("meta"), state.x_tails))
    with pytest.raises(ValueError, match=r"^hx\.x_tails\[0\] is on meta but input is on cpu"):
        model(x, QRNNState(state.c, (state.x_tails[0].to("meta"),) + state.x_tails[1:]))
    assert model(x, state)[0].shape == (5, 2, 4)  # the same state on the right device runs


@pytest.mark.parametrize("module", ["QRNN", "QRNNLayer"])
def test_lstm_state_pair_as_hx(module):
    """nn.LSTM's (h_0, c_0) is told apart from a QRNNState's plain (c, x_tails) tuple, which
    still works (awd-lstm-lm's repackage_hidden rebuilds a state as one)."""
    model = QRNN(3, 4, num_layers=2) if module == "QRNN" else QRNNLayer(3, 4)
    layers = 2 if module == "QRNN" else 1
    shape = "(num_layers * num_directions, batch, hidden_size)" if module == "QRNN" else "(1, batch, hidden_size)"
    x, h = torch.rand(5, 2, 3), torch.zeros(layers, 2, 4)
    message = (f"hx must be a single state, got a pair of tensors of shapes ({layers}, 2, 4) and ({layers}, 2, 4), "
               "like nn.LSTM's (h_0, c_0): a QRNN carries a single state per layer (like nn.GRU), so pass h_0 alone, "
               f"of shape {shape}, or a qrnn.QRNNState")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        model(x, (h, h.clone()))
    state = model(x, QRNNState())[1]
    plain = (state.c, tuple(state.x_tails))
    assert torch.equal(model(x, plain)[0], model(x, state)[0])
    assert torch.equal(model(x, h)[0], model(x)[0])
