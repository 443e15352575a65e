"""When the eager paths may skip the dispatcher, and how a device's kernel is registered.

``qrnn.forget_mult`` and ``qrnn.qrnn_gates`` call a native kernel directly when nothing is
traced and no gradient is needed: the op machinery costs tens of microseconds per call,
which dominates small shapes. Otherwise they call the custom op, whose per-device
registrations (made through :func:`register_kernel`) run the same kernels."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

torch_function_mode = torch._C._is_torch_function_mode_enabled
dispatch_modes = torch._C._len_torch_dispatch_stack


def nothing_to_trace() -> bool:
    """True when no compiler, torch-function mode or dispatch mode needs to see a call
    (forget_mult inlines the same test: a function call is a visible share of its cost)."""
    return not (torch.compiler.is_compiling() or torch_function_mode() or dispatch_modes())


def plain(t: Optional[Tensor], grad_enabled: bool) -> bool:
    """A plain tensor (no subclass) that autograd does not need to track, or None."""
    return t is None or (type(t) is Tensor and not (grad_enabled and t.requires_grad))


def any_negative_bit(a: Tensor, b: Optional[Tensor], c: Optional[Tensor]) -> bool:
    # A negative-bit view (e.g. complex.conj().imag) stores -values: the dispatcher resolves
    # it on the op path, the raw pointer of the direct path would not.
    return a.is_neg() or (b is not None and b.is_neg()) or (c is not None and c.is_neg())


def register_kernel(op, device: str, check: Callable[..., object], kernel: Callable) -> None:
    """Make ``kernel`` the op's implementation for ``device`` tensors, after ``check`` (the
    op can be called directly, and the kernels take shapes on trust). Registering again
    replaces the previous kernel."""

    def checked(*args):
        check(*args)
        return kernel(*args)

    op.register_kernel(device, checked)
