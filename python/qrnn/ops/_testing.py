"""Test-only: swap the native kernels a device type runs, for the eager paths and the ops'
per-device registrations alike. Not part of the API."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional, Tuple

from .forget_mult.op import KERNELS as _FORGET_MULT
from .linear_scan.op import KERNELS as _LINEAR_SCAN
from .qrnn_gates.op import KERNELS as _QRNN_GATES

_UNCHANGED = object()

KernelPair = Optional[Tuple[Callable, Callable]]


@contextlib.contextmanager
def native_kernels(device: str, forget_mult: KernelPair, qrnn_gates: KernelPair,
                   linear_scan=_UNCHANGED) -> Iterator[None]:
    """Inside the block, ``device`` tensors run these ``(forward, backward)`` kernels of each
    family; None: none (the pure-PyTorch fallback; qrnn_gates unfused); linear_scan's are
    left as they are unless given."""
    swaps = [(_FORGET_MULT, forget_mult), (_QRNN_GATES, qrnn_gates)]
    if linear_scan is not _UNCHANGED:
        swaps.append((_LINEAR_SCAN, linear_scan))
    previous = [(registry, registry.set(device, *(pair or (None, None)))) for registry, pair in swaps]
    try:
        yield
    finally:
        for registry, pair in previous:
            registry.set(device, *pair)
