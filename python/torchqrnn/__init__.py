"""salesforce/pytorch-qrnn's package name on torch-qrnn: ``from torchqrnn import QRNN``
(and ``QRNNLayer``, ``ForgetMult``) runs code written for pytorch-qrnn unedited.

The classes are :mod:`qrnn.pytorch_qrnn`'s; its modules ``torchqrnn.qrnn`` and
``torchqrnn.forget_mult`` exist under their original names too.
"""

from qrnn.pytorch_qrnn import QRNN, ForgetMult, QRNNLayer

__all__ = ["ForgetMult", "QRNN", "QRNNLayer"]
