"""One registry of native kernels per op family: which ``(forward, backward)`` functions each
device type runs, for the eager direct path and the ops' per-device registrations alike."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ... import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub
from .dispatch import defer_dynamo_import, register_kernel


class NativeKernels:
    """A family's native kernels by device type. :meth:`set` registers them with the family's
    ops (after the family's argument checks) and keeps them for the direct path; None for both
    falls back to the ops' pure-PyTorch bodies."""

    def __init__(self, forward_op, backward_op, check_forward: Callable, check_backward: Callable,
                 fallback_forward: Callable, fallback_backward: Callable) -> None:
        self._ops = (forward_op, backward_op)
        self._checks = (check_forward, check_backward)
        self._fallbacks = (fallback_forward, fallback_backward)
        self.forward: dict[str, Callable] = {}
        self.backward: dict[str, Callable] = {}
        self.cpu_forward: Optional[Callable] = None  # forward.get("cpu"), one lookup cheaper per call

    def set(self, device: str, forward: Optional[Callable], backward: Optional[Callable]) -> tuple:
        """Make ``forward``/``backward`` the kernels of ``device`` tensors; returns the previous
        pair (None, None where there was none)."""
        previous = (self.forward.pop(device, None), self.backward.pop(device, None))
        if forward is not None and backward is not None:
            self.forward[device], self.backward[device] = forward, backward
        self.cpu_forward = self.forward.get("cpu")
        for op, check, kernel, fallback in zip(self._ops, self._checks, (forward, backward), self._fallbacks):
            register_kernel(op, device, check, kernel or fallback)
        return previous

    def has(self, device) -> bool:
        """Whether ``device`` (a torch.device or its type name) runs native kernels."""
        return getattr(device, "type", device) in self.forward


def native_kernels(forward_op, backward_op, check_forward: Callable, check_backward: Callable, kernels,
                   fallback_forward: Optional[Callable] = None,
                   fallback_backward: Optional[Callable] = None) -> NativeKernels:
    """A family's :class:`NativeKernels` with the kernels of its ``kernels`` module set:
    ``cpu_forward``/``cpu_backward`` for CPU tensors, ``cuda_forward``/``cuda_backward`` for
    CUDA ones where ``kernels.CUDA_AVAILABLE``. Other devices run ``fallback_forward`` /
    ``fallback_backward`` (by default the module's functions of those names)."""
    registry = NativeKernels(forward_op, backward_op, check_forward, check_backward,
                             fallback_forward or kernels.fallback_forward,
                             fallback_backward or kernels.fallback_backward)
    registry.set("cpu", kernels.cpu_forward, kernels.cpu_backward)
    if kernels.CUDA_AVAILABLE:
        registry.set("cuda", kernels.cuda_forward, kernels.cuda_backward)
    return registry


def manifest_schema(op: str) -> str:
    """The schema of ``qrnn::<op>`` from its family's C++ manifest, without the name, as
    ``torch.library.custom_op(schema=...)`` takes it: one definition for Python and C++."""
    full = _C.op_schemas()[op]
    if not full.startswith(op + "("):
        raise ImportError(f"qrnn._C's schema of {op} names another op: {full!r}")
    return full[len(op):]


def define_op(op: str) -> Callable[[Callable], Any]:
    """A decorator defining ``qrnn::<op>`` as ``torch.library.custom_op(..., mutates_args=(),
    schema=manifest_schema(op))`` on the decorated function (the body devices without a
    native kernel run). The op object keeps the function's docstring as its ``__doc__``
    (a ``CustomOpDef`` would otherwise show its class's), so ``help()`` and the API
    reference describe the op."""
    def define(fn: Callable) -> Any:
        defined = torch.library.custom_op(f"qrnn::{op}", mutates_args=(), schema=manifest_schema(op))(fn)
        defined.__doc__ = fn.__doc__
        defer_dynamo_import(defined)  # the body's wrapper (devices without a native kernel)
        return defined
    return define
