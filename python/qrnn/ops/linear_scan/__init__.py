"""linear_scan, ``h[t] = a[t] * h[t-1] + b[t]``: the third op family.

- :mod:`.op`: the ``qrnn::linear_scan`` / ``qrnn::linear_scan_backward`` custom ops (schemas
  from the C++ manifest), their fake, autograd, vmap and forward-mode rules, and the native
  kernels registered per device type;
- :mod:`.kernels`: the CPU, CUDA and fallback backends and their argument tuples;
- :mod:`.checks`: its argument checks; :mod:`.sharding`: its DTensor rules; :mod:`.onnx`: its
  ONNX translation (loaded by :mod:`qrnn.onnx`);
- :mod:`.reference`: the plain PyTorch loop the tests and the fallback use.
"""

from typing import Literal, Optional, Union, overload

from torch import Tensor

from ..core.dispatch import direct_call_allowed, refuse_legacy_onnx, use_autograd_function
from ..core.sequences import as_offsets, final_states
from ..core.sharding import check_sharded_args
from . import sharding  # noqa: F401  (adds the family's DTensor rules)
from .checks import check_args
from .op import KERNELS, LinearScanFunction, linear_scan_backward_op, linear_scan_op

__all__ = ["linear_scan", "linear_scan_op", "linear_scan_backward_op", "KERNELS"]


@overload
def linear_scan(a: Tensor, b: Tensor, h0: Optional[Tensor] = ...,
        *, reverse: bool = ..., batch_first: bool = ..., lengths: Optional[Tensor] = ...,
        cu_seqlens: Optional[Tensor] = ...,
        output_final_state: Literal[False] = ...) -> Tensor: ...


@overload
def linear_scan(a: Tensor, b: Tensor, h0: Optional[Tensor] = ...,
        *, reverse: bool = ..., batch_first: bool = ..., lengths: Optional[Tensor] = ...,
        cu_seqlens: Optional[Tensor] = ...,
        output_final_state: Literal[True]) -> tuple[Tensor, Tensor]: ...


def linear_scan(a: Tensor, b: Tensor, h0: Optional[Tensor] = None, *, reverse: bool = False,
                batch_first: bool = False, lengths: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                output_final_state: bool = False) -> Union[Tensor, tuple[Tensor, Tensor]]:
    """The diagonal linear recurrence ``h[t] = a[t] * h[t-1] + b[t]`` with ``h[-1] = h0``.

    The recurrence of RG-LRU (Griffin), LRU, HGRN, Mamba-style diagonal scans and minGRU in
    decay form (docs/RECIPES.md). Unlike :func:`qrnn.forget_mult`, the decay ``a`` is given as
    is, so decays close to 1 (long memory) lose nothing to a ``1 - a`` reformulation.

    Args:
        a: decays, ``(seq_len, batch, hidden)`` (``(batch, seq_len, hidden)`` with
            ``batch_first=True``); float32, float64, bfloat16 or float16, CPU or CUDA.
        b: inputs, same shape, dtype and device as ``a``.
        h0: initial state ``(batch, hidden)`` (``(N, hidden)`` with ``cu_seqlens``), or None
            for zeros; ``a``'s dtype, or float32 for 16-bit ``a``.
        reverse: run each sequence backwards, ``h[t] = a[t] * h[t+1] + b[t]`` from its last
            step (the backward direction of a bidirectional layer); no copy is made.
        batch_first: whether dimension 0 is batch instead of time.
        lengths: None, or ``(batch,)`` int32/int64 on ``a``'s device: row ``b`` has
            ``lengths[b]`` real steps; the later (padding) steps of ``h`` are 0 and get no
            gradient.
        cu_seqlens: None, or ``(N + 1,)`` int32/int64 offsets on ``a``'s device, from 0 to the
            packed length: ``N`` sequences packed end to end in one row (batch 1), sequence
            ``n`` being steps ``cu_seqlens[n]`` to ``cu_seqlens[n + 1] - 1``, each starting
            from its own ``h0[n]`` (flash-linear-attention's layout). Empty sequences are
            allowed.
        output_final_state: also return each sequence's final state.

    Returns:
        ``h``, every step's state, in ``a``'s shape, layout convention and dtype; with
        ``output_final_state``, ``(h, h_n)`` where ``h_n`` is ``(batch, hidden)`` (``(N,
        hidden)`` packed): the state after each sequence's last step (``h0``, or zeros, for an
        empty one), in ``a``'s dtype. Math and the carried state are float32 for 16-bit
        inputs. Any strides are accepted without a copy. Differentiable in ``a``, ``b`` and
        ``h0`` (backward, torch.func, and forward mode without sequences); works under
        ``torch.compile(fullgraph=True)`` and ``torch.export``.

    Raises:
        TypeError: an argument of the wrong type or dtype, or a ``reverse`` that is not a bool.
        ValueError: a wrong shape, device or layout (the message names the argument), bad
            ``lengths`` or ``cu_seqlens`` values, or a DTensor sharded along time.
        RuntimeError: under the TorchScript ONNX exporter (``dynamo=False``) or
            ``torch.fx.symbolic_trace``, which cannot capture the op.
    """
    if lengths is not None or cu_seqlens is not None:
        lengths, cu_seqlens = as_offsets("lengths", "linear_scan", lengths), as_offsets(
            "cu_seqlens", "linear_scan", cu_seqlens)
    check_args(a, b, h0, reverse, batch_first, lengths, cu_seqlens)
    h = _scan(a, b, h0, reverse, batch_first, lengths, cu_seqlens)
    if output_final_state:
        return h, final_states(h, h0, lengths, cu_seqlens, reverse, batch_first)
    return h


def _scan(a, b, h0, reverse, batch_first, lengths, cu_seqlens):
    if direct_call_allowed(a, b, h0, lengths if lengths is not None else cu_seqlens):
        # Direct call: the dispatcher and autograd machinery would cost more than the kernel.
        kernel = KERNELS.cpu_forward if a.is_cpu else KERNELS.forward.get(a.device.type)
        if kernel is not None:  # none for meta tensors (the fake impl serves them) or fallback devices
            return kernel(a, b, h0, reverse, batch_first, lengths, cu_seqlens)
    if type(a) is not Tensor or type(b) is not Tensor:  # a subclass, perhaps a DTensor
        check_sharded_args("linear_scan", batch_first, a=a, b=b)
    if use_autograd_function():
        return LinearScanFunction.apply(a, b, h0, reverse, batch_first, lengths, cu_seqlens)
    refuse_legacy_onnx()
    return linear_scan_op(a, b, h0, reverse, batch_first, lengths, cu_seqlens)
