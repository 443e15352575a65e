"""Alias of :mod:`qrnn.train.data`, the corpora and batches of ``qrnn-train``, for code written
before it moved there."""

from .train.data import *  # noqa: F403
from .train.data import __all__  # noqa: F401
