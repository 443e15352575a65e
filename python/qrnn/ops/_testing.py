"""Test-only: swap the native kernels a device type runs, for the eager paths and the ops'
per-device registrations alike. Not part of the API."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional, Tuple

# From-imports: the package's attributes forget_mult and qrnn_gates are the functions.
from .forget_mult import _set_native_kernels as _set_forget_mult_kernels
from .qrnn_gates import _set_native_kernels as _set_qrnn_gates_kernels

KernelPair = Optional[Tuple[Callable, Callable]]


@contextlib.contextmanager
def native_kernels(device: str, forget_mult: KernelPair, qrnn_gates: KernelPair) -> Iterator[None]:
    """Inside the block, ``device`` tensors run these ``(forward, backward)`` kernels of each
    family; None: none (ForgetMult's pure-PyTorch fallback, qrnn_gates unfused)."""
    swaps = ((_set_forget_mult_kernels, forget_mult), (_set_qrnn_gates_kernels, qrnn_gates))
    previous = [(set_kernels, set_kernels(device, *(pair or (None, None)))) for set_kernels, pair in swaps]
    try:
        yield
    finally:
        for set_kernels, pair in previous:
            set_kernels(device, *pair)
