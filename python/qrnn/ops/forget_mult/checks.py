"""ForgetMult's argument checks, shared by its ops, its eager path and its CUDA launches into
given outputs."""

from __future__ import annotations

from ..core.checks import check_like, check_scan_args

__all__ = ["FORGET_MULT_NAMES", "check_forget_mult_args", "check_forget_mult_backward_args"]

FORGET_MULT_NAMES = ("f", "x")


def check_forget_mult_args(f, x, h0, batch_first, lengths=None, cu_seqlens=None, reverse=False) -> None:
    """Check the arguments of :func:`qrnn.forget_mult` (shared by every entry point: the
    function, the ops and the CUDA launches).

    Args:
        f (torch.Tensor): a strided (not sparse or nested) 3-D tensor: float32, float64,
            bfloat16 or float16.
        x (torch.Tensor): ``f``'s shape, dtype and device.
        h0 (torch.Tensor | None): None, or ``(batch, hidden)`` on their device, in their
            dtype (or float32 for 16-bit ``f``).
        batch_first (bool): which of ``f``'s first two dimensions is batch.
        lengths (torch.Tensor | None): int64 ``(batch,)`` real steps per row.
        cu_seqlens (torch.Tensor | None): int64 offsets of packed sequences
            (:mod:`qrnn.ops.core.sequences`); ``h0`` then has one row per sequence.
        reverse (bool): the direction.

    Returns:
        None when every argument is acceptable.

    Raises:
        TypeError: a wrong type or dtype; ValueError: a wrong shape, device or layout. The
            message names the argument.
    """
    check_scan_args("forget_mult", FORGET_MULT_NAMES, f, x, h0, batch_first, lengths, cu_seqlens)
    if reverse is not True and reverse is not False:
        raise TypeError(f"forget_mult: reverse must be a bool, got {type(reverse).__name__}")


def check_forget_mult_backward_args(grad_h, f, x, h, h0, batch_first, lengths=None, cu_seqlens=None,
                                    reverse=False) -> None:
    """Check the arguments of :func:`qrnn.ops.forget_mult_backward_op`: ``f``, ``x``,
    ``h0``, ``batch_first``, ``lengths``, ``cu_seqlens`` and ``reverse`` as
    :func:`check_forget_mult_args` does, and ``grad_h`` and ``h``, which must be tensors of
    ``f``'s shape, dtype and device.

    Returns:
        None when every argument is acceptable.

    Raises:
        TypeError, ValueError: as :func:`check_forget_mult_args`, naming the argument.
    """
    check_forget_mult_args(f, x, h0, batch_first, lengths, cu_seqlens, reverse)
    check_like("forget_mult_backward", "f", f, grad_h=grad_h, h=h)
