"""salesforce/pytorch-qrnn's package name on torch-qrnn: ``from torchqrnn import QRNN``
(and ``QRNNLayer``, ``ForgetMult``) runs code written for pytorch-qrnn unedited.

The classes are :mod:`qrnn.pytorch_qrnn`'s; its modules ``torchqrnn.qrnn`` and
``torchqrnn.forget_mult`` exist under their original names too.

Importing ``torchqrnn`` (or :mod:`qrnn.pytorch_qrnn`) adds ``torchqrnn.QRNN``,
``torchqrnn.QRNNLayer`` and ``torchqrnn.ForgetMult`` to ``torch.serialization``'s safe
globals, beside what ``import qrnn`` adds (``qrnn.QRNN``, ``qrnn.QRNNLayer``,
``qrnn.QRNNState``, ``torch.nn.ModuleList``, ``torch.nn.Linear`` and ``set``), so
``torch.load(..., weights_only=True)`` rebuilds whole pickled models holding these layers.
"""

from qrnn.pytorch_qrnn import QRNN, ForgetMult, QRNNLayer

__all__ = ["ForgetMult", "QRNN", "QRNNLayer"]
