"""Former home of :mod:`qrnn.ops.kernel_args`: its public names, re-exported."""

from .ops.kernel_args import (
    DTYPE_CODES,
    HALF_DTYPES,
    KernelArgsError,
    forget_mult_backward,
    forget_mult_forward,
    qrnn_gates_backward,
    qrnn_gates_forward,
    state_dtype,
)

__all__ = ["DTYPE_CODES", "HALF_DTYPES", "KernelArgsError", "forget_mult_forward", "forget_mult_backward",
           "qrnn_gates_forward", "qrnn_gates_backward", "state_dtype"]
