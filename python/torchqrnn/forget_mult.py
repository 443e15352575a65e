"""pytorch-qrnn's ``torchqrnn.forget_mult``: :mod:`qrnn.pytorch_qrnn`'s ForgetMult."""

from qrnn.pytorch_qrnn import ForgetMult

__all__ = ["ForgetMult"]
