"""qrnn.QRNN and qrnn.QRNNLayer over packed documents (``cu_seqlens``): each document as if
run alone (the window-2 convolution never reaches into the previous document), per-document
states in and out, both directions, gradients, compile and export, and bad input."""

import pytest
import torch

import qrnn

LENGTHS = [3, 0, 1, 6, 2, 1]


def _offsets(lengths):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist())


def _packed(total, features, batch_first, dtype=torch.float64):
    return torch.randn((1, total, features) if batch_first else (total, 1, features), dtype=dtype)


def _document(x, cu, n, batch_first):
    start, stop = int(cu[n]), int(cu[n + 1])
    return x[:, start:stop] if batch_first else x[start:stop]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_qrnn_packed_matches_each_document_alone(bidirectional, batch_first):
    """Outputs, h_n and the gradients of the input, hx and the weights, against a loop that
    runs each document by itself (an empty document keeps its hx)."""
    torch.manual_seed(0)
    model = qrnn.QRNN(5, 7, num_layers=2, window=[2, 1], bidirectional=bidirectional,
                      batch_first=batch_first).double()
    cu = _offsets(LENGTHS)
    directions = 2 if bidirectional else 1
    x = _packed(int(cu[-1]), 5, batch_first).requires_grad_()
    hx = torch.randn(2 * directions, len(LENGTHS), 7, dtype=torch.float64, requires_grad=True)
    out, h_n = model(x, hx, cu_seqlens=cu)
    assert h_n.shape == hx.shape
    (out.square().sum() + h_n.sum()).backward()
    packed_grads = [x.grad.clone(), hx.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    x.grad, hx.grad = None, None
    model.zero_grad()
    total = 0
    for n in range(len(LENGTHS)):
        if LENGTHS[n] == 0:
            torch.testing.assert_close(h_n[:, n], hx[:, n])
            total = total + hx[:, n].sum()  # its h_n is its hx
            continue
        o, h = model(_document(x, cu, n, batch_first), hx[:, n:n + 1])
        torch.testing.assert_close(_document(out, cu, n, batch_first), o)
        torch.testing.assert_close(h_n[:, n:n + 1], h)
        total = total + o.square().sum() + h.sum()
    total.backward()
    loop_grads = [x.grad, hx.grad] + [p.grad for p in model.parameters()]
    for got, expected in zip(packed_grads, loop_grads):
        torch.testing.assert_close(got, expected)


def test_the_window_never_reaches_into_the_previous_document():
    """Changing one document's inputs changes nothing in the others, including the first
    step of the next document, which a window of 2 would otherwise read."""
    torch.manual_seed(1)
    layer = qrnn.QRNNLayer(4, 6, window=2).double()
    cu = _offsets([3, 4])
    x = _packed(7, 4, False)
    out, _ = layer(x, cu_seqlens=cu)
    changed = x.clone()
    changed[2] += 10.0  # the last step of the first document
    out2, _ = layer(changed, cu_seqlens=cu)
    torch.testing.assert_close(out2[3:], out[3:])
    assert not torch.allclose(out2[2], out[2])


def test_qrnn_layer_packed_states():
    torch.manual_seed(2)
    layer = qrnn.QRNNLayer(4, 6, window=2).double()
    cu = _offsets(LENGTHS)
    x = _packed(int(cu[-1]), 4, False)
    hx = torch.randn(1, len(LENGTHS), 6, dtype=torch.float64)
    out, h_n = layer(x, hx, cu_seqlens=cu.to(torch.int32))
    assert h_n.shape == (1, len(LENGTHS), 6)
    for n, length in enumerate(LENGTHS):
        if length:
            o, h = layer(_document(x, cu, n, False), hx[:, n:n + 1])
            torch.testing.assert_close(_document(out, cu, n, False), o)
            torch.testing.assert_close(h_n[:, n:n + 1], h)


def test_gradcheck_float64():
    torch.manual_seed(3)
    model = qrnn.QRNN(3, 4, num_layers=1, window=2, bidirectional=True).double()
    cu = _offsets([2, 0, 3])
    x = _packed(5, 3, False).requires_grad_()
    hx = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, hx: model(x, hx, cu_seqlens=cu), (x, hx))


@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch < 2.13 specializes the packed length when exporting")
def test_compile_and_export_keep_packed_documents():
    torch.manual_seed(4)
    model = qrnn.QRNN(5, 8, num_layers=2, window=[2, 1], batch_first=True)
    cu = _offsets([4, 1, 3])
    x = _packed(8, 5, True, torch.float32)
    expected = model(x, cu_seqlens=cu)
    compiled = torch.compile(lambda x, cu: model(x, cu_seqlens=cu), fullgraph=True)(x, cu)
    for got, want in zip(compiled, expected):
        torch.testing.assert_close(got, want)

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qrnn = model

        def forward(self, x, cu_seqlens):
            return self.qrnn(x, cu_seqlens=cu_seqlens)

    total, documents = torch.export.Dim("total", min=2, max=2**20), torch.export.Dim("documents", min=2, max=4096)
    program = torch.export.export(Packed(), (x, cu), dynamic_shapes=({1: total}, {0: documents + 1}))
    x2, cu2 = _packed(11, 5, True, torch.float32), _offsets([2, 0, 6, 3])
    for got, want in zip(program.module()(x2, cu2), model(x2, cu_seqlens=cu2)):
        torch.testing.assert_close(got, want)


BAD = [
    (lambda m, x, cu: m(x[:, 0], cu_seqlens=cu), "2-D input"),
    (lambda m, x, cu: m(x.expand(-1, 2, -1), cu_seqlens=cu), "one packed row"),
    (lambda m, x, cu: m(x, cu_seqlens=torch.tensor([0, 2, 9])), "rise from 0 to the packed length 7"),
    (lambda m, x, cu: m(x, cu_seqlens=torch.tensor([0, 5, 2, 7])), "rise from 0"),
    (lambda m, x, cu: m(x, cu_seqlens=torch.tensor([0.0, 7.0])), "must hold integers"),
    (lambda m, x, cu: m(x, lengths=torch.tensor([7]), cu_seqlens=cu), "not both"),
    (lambda m, x, cu: m(x, torch.zeros(1, 3, 4), cu_seqlens=cu), r"shape \(1, batch, hidden\)|\(1, 2, 4\)"),
    (lambda m, x, cu: m(x, m.initial_state(2) if hasattr(m, "initial_state") else (torch.zeros(1, 2, 4), ()),
                        cu_seqlens=cu), "must be a tensor"),
]


@pytest.mark.parametrize("call, message", BAD, ids=[m for _, m in BAD])
def test_bad_packed_input(call, message):
    layer = qrnn.QRNNLayer(3, 4, window=2)
    x = torch.randn(7, 1, 3)
    with pytest.raises(ValueError, match=message):
        call(layer, x, _offsets([3, 4]))
