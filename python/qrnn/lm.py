"""Alias of :mod:`qrnn.train.lm`, the language model of ``qrnn-train``: code and whole-model
pickles written before it moved there name ``qrnn.lm``."""

from .train.lm import *  # noqa: F403
from .train.lm import __all__  # noqa: F401
