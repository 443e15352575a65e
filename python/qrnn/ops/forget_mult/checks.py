"""ForgetMult's argument checks, shared by its ops, its eager path and its CUDA launches into
given outputs."""

from __future__ import annotations

from ..core.checks import check_like, check_scan_args

__all__ = ["FORGET_MULT_NAMES", "check_forget_mult_args", "check_forget_mult_backward_args"]

FORGET_MULT_NAMES = ("f", "x")


def check_forget_mult_args(f, x, h0, batch_first) -> None:
    """Raise TypeError/ValueError naming the bad argument; shared by every entry point."""
    check_scan_args("forget_mult", FORGET_MULT_NAMES, f, x, h0, batch_first)


def check_forget_mult_backward_args(grad_h, f, x, h, h0, batch_first) -> None:
    """The forward checks plus grad_h and h: same shape, dtype and device as f."""
    check_scan_args("forget_mult", FORGET_MULT_NAMES, f, x, h0, batch_first)
    check_like("forget_mult_backward", "f", f, grad_h=grad_h, h=h)
