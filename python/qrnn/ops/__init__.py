"""PyTorch ops over the torch-free kernels in ``qrnn._C``: three op families, each a
``torch.library.custom_op`` pair (forward, backward) with fake and autograd registrations
and an eager entry point that skips the dispatcher when nothing is traced.

Imports run one way: the family modules import the backends, never the reverse.

- :mod:`.forget_mult`: ``qrnn::forget_mult`` / ``qrnn::forget_mult_backward``, :func:`forget_mult`.
- :mod:`.linear_scan` (a package: op, kernels, reference): ``qrnn::linear_scan`` /
  ``qrnn::linear_scan_backward``, :func:`linear_scan`.
- :mod:`.qrnn_gates`: ``qrnn::qrnn_gates`` / ``qrnn::qrnn_gates_backward``, :func:`qrnn_gates`,
  :func:`qrnn_gates_unfused` (uses :mod:`.forget_mult`).
- backends: :mod:`.cpu` and :mod:`.cuda` (``qrnn._C``'s native kernels, registered per device
  type by the families), :mod:`.fallback` (pure PyTorch, the ops' default bodies).
- :mod:`.sharding`: the ops' DTensor sharding rules (batch or hidden sharded, replicated; never
  time sharded), :func:`register_sharding_rules`.
- shared below them: :mod:`.checks` (argument checks), :mod:`.kernel_args` (the kernels'
  argument tuples), ``_outputs`` (output allocation), ``_dispatch`` (eager-path tests,
  per-device registration).
"""

from .. import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub

# The qrnn:: operators have one owner per process (qrnn/torch_ops_owner.hpp): the C++
# torch library, when loaded before `import qrnn`, already defined them without the
# autograd, fake and fallback registrations defined below.
if _C.claim_torch_ops() == "torch_library":
    raise ImportError("the qrnn:: operators were registered by qrnn's C++ torch library (libqrnn_torch), loaded "
                      "into this process before `import qrnn`; import qrnn first (the library then leaves the "
                      "operators to it), or load the library only in processes without Python")

from .checks import (
    check_forget_mult_args,
    check_forget_mult_backward_args,
    check_qrnn_gates_args,
    check_qrnn_gates_backward_args,
)
from .forget_mult import (
    FORGET_MULT_BACKWARD_KERNELS,
    FORGET_MULT_FORWARD_KERNELS,
    forget_mult,
    forget_mult_backward_op,
    forget_mult_op,
    has_native_kernels,
)
from .linear_scan import linear_scan, linear_scan_backward_op, linear_scan_op
from .qrnn_gates import (
    QRNN_GATES_BACKWARD_KERNELS,
    QRNN_GATES_FORWARD_KERNELS,
    has_fused_qrnn_gates,
    qrnn_gates,
    qrnn_gates_backward_op,
    qrnn_gates_op,
    qrnn_gates_unfused,
)
from .sharding import register_if_dtensor_loaded, register_sharding_rules

# The op families, one line each: CMake's QRNN_FAMILIES and qrnn/families.hpp list the same
# (tests/packaging/test_architecture.py compares the three).
FAMILIES = (
    "forget_mult",
    "qrnn_gates",
    "linear_scan",
)

# DTensor's rules for the ops, at once when this process already loaded DTensor (else at the
# first call given a tensor subclass after it is loaded: see .sharding).
register_if_dtensor_loaded()

__all__ = ["FAMILIES", "forget_mult", "qrnn_gates", "qrnn_gates_unfused", "linear_scan", "linear_scan_op",
           "linear_scan_backward_op", "has_native_kernels", "has_fused_qrnn_gates",
           "forget_mult_op", "forget_mult_backward_op", "qrnn_gates_op", "qrnn_gates_backward_op",
           "check_forget_mult_args", "check_forget_mult_backward_args", "check_qrnn_gates_args",
           "check_qrnn_gates_backward_args", "FORGET_MULT_FORWARD_KERNELS", "FORGET_MULT_BACKWARD_KERNELS",
           "QRNN_GATES_FORWARD_KERNELS", "QRNN_GATES_BACKWARD_KERNELS", "register_sharding_rules"]
