"""ONNX export of calls with sequences: lengths, packed cu_seqlens (empty and length-1
sequences included) and reverse, for every family and for qrnn.QRNN on packed input; the
exported graph run in onnxruntime matches PyTorch on the traced inputs and on fresh ones."""

import contextlib
import io
import warnings

import pytest
import torch
from torch import nn

import qrnn

ort = pytest.importorskip("onnxruntime", reason="ONNX export needs onnxruntime")
pytest.importorskip("onnxscript", reason="ONNX export needs onnxscript")
import qrnn.onnx  # noqa: E402


def _check(model, args, fresh, tolerance=1e-5):
    """Export ``model`` on ``args``; the ONNX graph must match PyTorch on ``args`` and on
    ``fresh`` (other values, and other offsets with the same shapes)."""
    model.eval()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = qrnn.onnx.export(model, args)
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for inputs in (args, fresh):
        with torch.no_grad():
            want = torch.utils._pytree.tree_leaves(model(*inputs))
        feeds = [t for t in inputs if isinstance(t, torch.Tensor)]
        got = session.run(None, {n: t.numpy() for n, t in zip(names, feeds)})
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            torch.testing.assert_close(torch.from_numpy(g), w, atol=tolerance, rtol=tolerance)


class Scan(nn.Module):
    def __init__(self, family, reverse, sequences):
        super().__init__()
        self.family, self.reverse, self.sequences = family, reverse, sequences

    def forward(self, a, b, h0, offsets):
        call = qrnn.forget_mult if self.family == "forget_mult" else qrnn.linear_scan
        return call(torch.sigmoid(a), b, h0, reverse=self.reverse, output_final_state=True,
                    **{self.sequences: offsets})


@pytest.mark.parametrize("family", ["forget_mult", "linear_scan"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forwards", "reversed"])
def test_packed_scans(family, reverse):
    torch.manual_seed(3)
    cu = torch.tensor([0, 4, 4, 5, 11])  # an empty and a length-1 sequence
    other = torch.tensor([0, 1, 7, 7, 11])
    args = (torch.randn(11, 1, 6), torch.randn(11, 1, 6), torch.randn(4, 6), cu)
    fresh = (torch.randn(11, 1, 6), torch.randn(11, 1, 6), torch.randn(4, 6), other)
    _check(Scan(family, reverse, "cu_seqlens"), args, fresh)


@pytest.mark.parametrize("family", ["forget_mult", "linear_scan"])
@pytest.mark.parametrize("reverse", [False, True], ids=["forwards", "reversed"])
def test_lengths_scans(family, reverse):
    torch.manual_seed(4)
    args = (torch.randn(7, 3, 5), torch.randn(7, 3, 5), torch.randn(3, 5), torch.tensor([7, 0, 3]))
    fresh = (torch.randn(7, 3, 5), torch.randn(7, 3, 5), torch.randn(3, 5), torch.tensor([1, 7, 5]))
    _check(Scan(family, reverse, "lengths"), args, fresh)


class Packed(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.rnn = qrnn.QRNN(5, 6, **kwargs)

    def forward(self, x, h0, cu):
        return self.rnn(x, h0, cu_seqlens=cu)


@pytest.mark.parametrize("kwargs", [dict(num_layers=2, window=2), dict(bidirectional=True, window=2),
                                    dict(output_gate=False)], ids=str)
def test_packed_qrnn(kwargs):
    torch.manual_seed(5)
    model = Packed(**kwargs)
    directions = 2 if kwargs.get("bidirectional") else 1
    layers = kwargs.get("num_layers", 1) * directions
    cu, other = torch.tensor([0, 3, 3, 4, 9]), torch.tensor([0, 5, 6, 9, 9])
    args = (torch.randn(9, 1, 5), torch.randn(layers, 4, 6), cu)
    fresh = (torch.randn(9, 1, 5), torch.randn(layers, 4, 6), other)
    _check(model, args, fresh)


def test_packed_qrnn_dynamic_total_and_count():
    """One graph for any packed length and any number of sequences (torch.export's dynamic
    shapes carried into ONNX)."""
    torch.manual_seed(6)
    model = Packed(window=2).eval()
    total, count = torch.export.Dim("total", min=2), torch.export.Dim("count", min=2)
    args = (torch.randn(9, 1, 5), torch.randn(1, 4, 6), torch.tensor([0, 3, 3, 4, 9]))
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = qrnn.onnx.export(model, args, dynamic_shapes=({0: total}, {1: count}, {0: count + 1}))
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for cu in ([0, 1, 1, 13], [0, 2, 5, 5, 6, 13, 13]):
        inputs = (torch.randn(13, 1, 5), torch.randn(1, len(cu) - 1, 6), torch.tensor(cu))
        with torch.no_grad():
            want = torch.utils._pytree.tree_leaves(model(*inputs))
        got = session.run(None, {n: t.numpy() for n, t in zip(names, inputs)})
        for g, w in zip(got, want):
            torch.testing.assert_close(torch.from_numpy(g), w, atol=1e-5, rtol=1e-5)
