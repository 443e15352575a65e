"""PyTorch ops over the torch-free kernels in ``qrnn._C``, one package per op family, each a
``torch.library.custom_op`` pair (forward, backward) defined from the family's C++ manifest,
with fake, autograd, vmap and forward-mode registrations, and an eager entry point that
skips the dispatcher when nothing is traced.

- :mod:`.forget_mult`: ``qrnn::forget_mult``, :func:`forget_mult`.
- :mod:`.qrnn_gates`: ``qrnn::qrnn_gates``, :func:`qrnn_gates`, :func:`qrnn_gates_unfused`
  (uses :mod:`.forget_mult`).
- :mod:`.linear_scan`: ``qrnn::linear_scan``, :func:`linear_scan` (``h = a h + b``).

Each family package holds ``op`` (the ops and their rules), ``kernels`` (CPU, CUDA and
fallback backends, argument tuples), ``checks`` and ``reference``. What every family shares
is :mod:`.core`: the direct-call rule and autograd helpers (``dispatch``), the native-kernel
registry and the manifest's schemas (``registry``), argument builders (``kernel_args``),
output allocation (``outputs``), argument checks (``checks``), CUDA streams and launches
(``cuda``) and DTensor sharding rules (``sharding``). Imports run one way: families import
the core, never the reverse.
"""

from .. import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub

# The qrnn:: operators have one owner per process (qrnn/torch_ops_owner.hpp): the C++
# torch library, when loaded before `import qrnn`, already defined them without the
# autograd, fake and fallback registrations defined below.
if _C.claim_torch_ops() == "torch_library":
    raise ImportError("the qrnn:: operators were registered by qrnn's C++ torch library (libqrnn_torch), loaded "
                      "into this process before `import qrnn`; import qrnn first (the library then leaves the "
                      "operators to it), or load the library only in processes without Python")

from .core.sharding import register_if_dtensor_loaded, register_sharding_rules
from .forget_mult import (
    check_forget_mult_args,
    check_forget_mult_backward_args,
    forget_mult,
    forget_mult_backward_op,
    forget_mult_op,
    has_native_kernels,
)
from .linear_scan import linear_scan, linear_scan_backward_op, linear_scan_op
from .qrnn_gates import (
    check_qrnn_gates_args,
    check_qrnn_gates_backward_args,
    has_fused_qrnn_gates,
    qrnn_gates,
    qrnn_gates_backward_op,
    qrnn_gates_op,
    qrnn_gates_unfused,
)

# The op families, one line each: CMake's QRNN_FAMILIES and qrnn/families.hpp list the same
# (tests/packaging/test_architecture.py compares the three).
FAMILIES = (
    "forget_mult",
    "qrnn_gates",
    "linear_scan",
)
"""The names of the op families, in definition order: each is a subpackage
``qrnn.ops.<family>`` and defines the operators ``qrnn::<family>`` and
``qrnn::<family>_backward``."""

# DTensor's rules for the ops, at once when this process already loaded DTensor (else at the
# first call given a tensor subclass after it is loaded: see .core.sharding).
register_if_dtensor_loaded()

__all__ = ["FAMILIES", "forget_mult", "qrnn_gates", "qrnn_gates_unfused", "linear_scan", "linear_scan_op",
           "linear_scan_backward_op", "has_native_kernels", "has_fused_qrnn_gates",
           "forget_mult_op", "forget_mult_backward_op", "qrnn_gates_op", "qrnn_gates_backward_op",
           "check_forget_mult_args", "check_forget_mult_backward_args", "check_qrnn_gates_args",
           "check_qrnn_gates_backward_args", "register_sharding_rules"]
