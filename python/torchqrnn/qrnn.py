"""pytorch-qrnn's ``torchqrnn.qrnn``: :mod:`qrnn.pytorch_qrnn`'s layers."""

from qrnn.pytorch_qrnn import QRNN, ForgetMult, QRNNLayer

__all__ = ["ForgetMult", "QRNN", "QRNNLayer"]
