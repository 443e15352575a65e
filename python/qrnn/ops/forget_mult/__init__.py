"""ForgetMult, ``h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1]``: the first op family.

- :mod:`.op`: the ``qrnn::forget_mult`` / ``qrnn::forget_mult_backward`` custom ops (schemas
  from the C++ manifest), their fake, autograd, vmap and forward-mode rules, and the native
  kernels registered per device type;
- :mod:`.kernels`: the CPU, CUDA and fallback backends and their argument tuples;
- :mod:`.checks`: its argument checks; :mod:`.sharding`: its DTensor rules; :mod:`.onnx`: its
  ONNX translation (loaded by :mod:`qrnn.onnx`);
- :mod:`.reference`: the plain PyTorch loop the tests, the fallback and the benchmarks use.
"""

# No `from __future__ import annotations`: the op modules' annotations are read as objects.
from typing import Literal, Optional, Union, overload

from torch import Tensor

from ..core.checks import check_scan_args
from ..core.dispatch import direct_call_allowed, refuse_legacy_onnx, use_autograd_function
from ..core.sequences import as_offsets, final_states
from ..core.sharding import check_sharded_args
from . import sharding  # noqa: F401  (adds the family's DTensor rules)
from .checks import FORGET_MULT_NAMES, check_forget_mult_args, check_forget_mult_backward_args
from .op import KERNELS, ForgetMultFunction, forget_mult_backward_op, forget_mult_op

__all__ = ["forget_mult", "forget_mult_op", "forget_mult_backward_op", "has_native_kernels", "KERNELS",
           "check_forget_mult_args", "check_forget_mult_backward_args"]


def has_native_kernels(device) -> bool:
    """Whether ``device`` runs qrnn's native ForgetMult (and linear_scan) kernels.

    Args:
        device (torch.device | str): a device or its type name (``"cpu"``, ``"cuda"``, ...);
            the index does not matter.

    Returns:
        True for the CPU, and for CUDA in builds with the CUDA kernels; False for any other
        device, which runs the ops' slower pure-PyTorch fallback.
    """
    return KERNELS.has(device)


@overload
def forget_mult(f: Tensor, x: Tensor, h0: Optional[Tensor] = ...,
        *, batch_first: bool = ..., reverse: bool = ..., lengths: Optional[Tensor] = ...,
        cu_seqlens: Optional[Tensor] = ...,
        output_final_state: Literal[False] = ...) -> Tensor: ...


@overload
def forget_mult(f: Tensor, x: Tensor, h0: Optional[Tensor] = ...,
        *, batch_first: bool = ..., reverse: bool = ..., lengths: Optional[Tensor] = ...,
        cu_seqlens: Optional[Tensor] = ...,
        output_final_state: Literal[True]) -> tuple[Tensor, Tensor]: ...


def forget_mult(f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *, batch_first: bool = False,
                reverse: bool = False, lengths: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                output_final_state: bool = False) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """ForgetMult: ``h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1]`` with ``h[-1] = h0``.

    The convention of the original pytorch-qrnn: ``f`` (the forget gate, usually a
    sigmoid output) weights the new candidate ``x``; ``1 - f`` keeps the old state.

    Args:
        f: forget gate, ``(seq_len, batch, hidden)`` (or ``(batch, seq_len, hidden)``
            with ``batch_first=True``); float32, float64, bfloat16 or float16, CPU or CUDA.
        x: candidate values, same shape, dtype and device as ``f``.
        h0: initial state ``(batch, hidden)`` (``(N, hidden)`` with ``cu_seqlens``), or None
            for zeros. Its dtype is ``f``'s, or float32 for 16-bit ``f`` (a float32 carried
            state).
        batch_first: whether dimension 0 is batch instead of time.
        reverse: run each sequence backwards, from its last step (``h[t+1]`` is the previous
            state); no copy is made.
        lengths: None, or ``(batch,)`` int32/int64 on ``f``'s device: row ``b`` has
            ``lengths[b]`` real steps; the later (padding) steps of ``h`` are 0 and get no
            gradient.
        cu_seqlens: None, or ``(N + 1,)`` int32/int64 offsets on ``f``'s device, from 0 to the
            packed length: ``N`` sequences packed end to end in one row (batch 1), sequence
            ``n`` being steps ``cu_seqlens[n]`` to ``cu_seqlens[n + 1] - 1``, each starting
            from its own ``h0[n]`` (flash-linear-attention's layout). Empty sequences are
            allowed.
        output_final_state: also return each sequence's final state.

    Returns:
        ``h``, every step's state, in ``f``'s shape, layout convention and dtype; with
        ``output_final_state``, ``(h, h_n)``: ``h_n`` is ``(batch, hidden)`` (``(N, hidden)``
        packed), the state after each sequence's last step (``h0``, or zeros, for an empty
        one) in ``f``'s dtype. Math and the carried state are float32 for 16-bit inputs
        (float64 for float64). Any strides are accepted without a copy. Differentiable in
        ``f``, ``x`` and ``h0``; works under ``torch.compile(fullgraph=True)``.

    Raises:
        TypeError: an argument of the wrong type or dtype (the message names it).
        ValueError: a wrong shape, device or layout (the message names the argument), bad
            ``lengths`` or ``cu_seqlens`` values, or a DTensor sharded along time.
        RuntimeError: under the TorchScript ONNX exporter (``dynamo=False``) or
            ``torch.fx.symbolic_trace``, which cannot capture the op.
    """
    if lengths is None and cu_seqlens is None and not reverse and not output_final_state:
        # The common call, with the fewest steps: the checks, not their wrapper (a call less).
        check_scan_args("forget_mult", FORGET_MULT_NAMES, f, x, h0, batch_first)
        return _call(f, x, h0, batch_first, None)
    lengths = as_offsets("lengths", "forget_mult", lengths)
    cu_seqlens = as_offsets("cu_seqlens", "forget_mult", cu_seqlens)
    check_forget_mult_args(f, x, h0, batch_first, lengths, cu_seqlens, reverse)
    h = _call(f, x, h0, batch_first, lengths if lengths is not None else cu_seqlens, lengths, cu_seqlens, reverse)
    if output_final_state:
        return h, final_states(h, h0, lengths, cu_seqlens, reverse, batch_first)
    return h


def _call(f, x, h0, batch_first, sequences, *more):
    """The op on checked arguments; ``more``: (lengths, cu_seqlens, reverse) or nothing."""
    if direct_call_allowed(f, x, h0, sequences):
        # Direct call: the dispatcher and autograd machinery would cost more than the kernel.
        kernel = KERNELS.cpu_forward if f.is_cpu else KERNELS.forward.get(f.device.type)
        if kernel is not None:  # none for meta tensors (the op's fake impl serves them) or the fallback's devices
            return kernel(f, x, h0, batch_first, *more)
    if type(f) is not Tensor or type(x) is not Tensor:  # a subclass, perhaps a DTensor
        check_sharded_args("forget_mult", batch_first, f=f, x=x)
    if use_autograd_function():
        return ForgetMultFunction.apply(f, x, h0, batch_first, *more)
    refuse_legacy_onnx()
    return forget_mult_op(f, x, h0, batch_first, *more)
