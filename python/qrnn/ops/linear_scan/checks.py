"""linear_scan's argument checks, shared by its ops and its eager path."""

from __future__ import annotations

from ..core.checks import check_like, check_scan_args

__all__ = ["check_args", "check_backward_args"]

_NAMES = ("a", "b")


def check_args(a, b, h0, reverse, batch_first, lengths=None, cu_seqlens=None) -> None:
    """TypeError/ValueError naming the bad argument."""
    check_scan_args("linear_scan", _NAMES, a, b, h0, batch_first, lengths, cu_seqlens)
    if reverse is not True and reverse is not False:
        raise TypeError(f"linear_scan: reverse must be a bool, got {type(reverse).__name__}")


def check_backward_args(grad_h, a, h, h0, reverse, batch_first, lengths=None, cu_seqlens=None) -> None:
    check_args(a, a, h0, reverse, batch_first, lengths, cu_seqlens)
    check_like("linear_scan_backward", "a", a, grad_h=grad_h, h=h)
