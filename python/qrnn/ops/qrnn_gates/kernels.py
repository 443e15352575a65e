"""The fused gates' kernels per backend: qrnn._C's CPU entry points and its CUDA launchers (in
builds with them; also their launches into given outputs and their vector widths, for tests
and benchmarks), each writing fresh outputs; and the kernels' argument tuples. Devices
without a fused kernel run :func:`qrnn.ops.qrnn_gates_unfused` instead."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ... import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub
from ..core import cuda as _cuda
from ..core.kernel_args import generate, probe, state_dtype
from ..core.outputs import empty_contiguous, or_empty
from ..core.sequences import check_offset_values, sequence_count
from .checks import check_qrnn_gates_args, check_qrnn_gates_backward_args, gate_count

__all__ = ["forward_args", "backward_args", "outputs", "cpu_forward", "cpu_backward", "CUDA_AVAILABLE",
           "cuda_forward", "cuda_backward", "forward_into", "backward_into", "forward_width", "backward_width"]

# ---- Argument tuples, from the fields qrnn._C exports (cpp/include/qrnn/qrnn_gates.hpp) ---------
# Views reorder their strides to time-major.

_GATES_PROLOGUE = """
code = DTYPE_CODES[gates.dtype]
shape = gates.shape
"""
_GATES_COMMON = {
    "forget_scale": "forget_scale", "dtype": "code",
    "seq_len": "shape[1] if batch_first else shape[0]",
    "hidden": "hidden", "output_gate": "int(output_gate)", "gates": "view3(gates, batch_first)",
    "gate_stride": "hidden * gates.stride(2)", "forget_mask": "view3(forget_mask, batch_first)",
    "c0": "view2(c0)", "c0_dtype": "code if c0 is None else DTYPE_CODES[c0.dtype]",
    "lengths": "0 if lengths is None else lengths.data_ptr()",
    "lengths_stride": "1 if lengths is None else lengths.stride(0)",
    "cu_seqlens": "0 if cu_seqlens is None else cu_seqlens.data_ptr()", "reverse": "int(reverse)",
    "c_n_dtype": "DTYPE_CODES[state_dtype(gates.dtype)]",
    "batch": "(shape[0] if batch_first else shape[1]) if cu_seqlens is None else cu_seqlens.shape[0] - 1",
}
_gates = probe(2, 3, 12)
_out = probe(2, 3, 4)
forward_args: Callable[..., tuple] = generate(
    "qrnn_gates_forward",
    "output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, "
    "cu_seqlens=None",
    _GATES_PROLOGUE + "hidden = output.shape[2]",
    {**_GATES_COMMON, "output": "view3(output, batch_first)", "states": "view3(states, batch_first)",
     "c_n": "view2(c_n)"},
    [(_out, _out, probe(3, 4), _gates, None, None, None, 1.0, True, False, False)])
backward_args: Callable[..., tuple] = generate(
    "qrnn_gates_backward",
    "grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, "
    "output_gate, batch_first, reverse, cu_seqlens=None",
    _GATES_PROLOGUE + "hidden = shape[2] // (3 if output_gate else 2)",
    {**_GATES_COMMON, "states": "view3(states, batch_first)", "grad_output": "view3(grad_output, batch_first)",
     "grad_c_n": "view2(grad_c_n)", "grad_gates": "view3(grad_gates, batch_first)",
     "grad_gate_stride": "hidden * grad_gates.stride(2)", "grad_c0": "view2(grad_c0)"},
    [(_gates, None, _out, None, _gates, _out, None, None, torch.tensor([1, 2, 2]), 0.5, True, False, True)])
del _gates, _out


def outputs(gates: Tensor, output_gate: bool, batch_first: bool, need_states: bool = True,
            cu_seqlens: Optional[Tensor] = None) -> tuple:
    """Fresh (output, states or None, c_n) for a gates forward kernel."""
    shape = gates.shape
    hidden = shape[2] // gate_count(output_gate)
    output = gates.new_empty((shape[0], shape[1], hidden))  # new_empty: gates' device even if the default moved
    # The backward needs every c[t]; without an output gate that is the output itself.
    states = gates.new_empty((shape[0], shape[1], hidden)) if (output_gate and need_states) else None
    rows = sequence_count(shape[0] if batch_first else shape[1], cu_seqlens)
    c_n = gates.new_empty((rows, hidden), dtype=state_dtype(gates.dtype))
    return output, states, c_n


def _grads(gates: Tensor, c0: Optional[Tensor]) -> tuple:
    """Fresh (grad_gates, grad_c0 or None) for a gates backward kernel."""
    return empty_contiguous(gates), (empty_contiguous(c0) if c0 is not None else None)


# ---- CPU --------------------------------------------------------------------------------------


def cpu_forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, cu_seqlens=None,
                need_states=True):
    output, states, c_n = outputs(gates, output_gate, batch_first, need_states, cu_seqlens)
    _C.qrnn_gates_forward(*forward_args(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale,
                                        output_gate, batch_first, reverse, cu_seqlens), torch.get_num_threads())
    return output, c_n, or_empty(states, gates)


def cpu_backward(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                 batch_first, reverse, cu_seqlens=None):
    grad_gates, grad_c0 = _grads(gates, c0)
    _C.qrnn_gates_backward(*backward_args(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0,
                                          forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                                          cu_seqlens), torch.get_num_threads())
    return grad_gates, or_empty(grad_c0, gates)


# ---- CUDA (builds with the CUDA kernels) ------------------------------------------------------

CUDA_AVAILABLE: bool = hasattr(_C, "cuda_qrnn_gates_forward")


def _launch_forward(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                               batch_first, reverse) -> None:
    _cuda.launch_by_name("cuda_qrnn_gates_forward", gates.device,
            forward_args(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                                     batch_first, reverse), schedule=False)


def _launch_backward(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                forget_scale, output_gate, batch_first, reverse) -> None:
    _cuda.launch_by_name("cuda_qrnn_gates_backward", gates.device,
            backward_args(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask,
                                      lengths, forget_scale, output_gate, batch_first, reverse), schedule=False)


def _cuda_dense_forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                        need_states=True):
    output, states, c_n = outputs(gates, output_gate, batch_first, need_states)
    _launch_forward(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                               batch_first, reverse)
    return output, c_n, or_empty(states, gates)


def _cuda_dense_backward(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                         batch_first, reverse):
    grad_gates, grad_c0 = _grads(gates, c0)
    _launch_backward(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                forget_scale, output_gate, batch_first, reverse)
    return grad_gates, or_empty(grad_c0, gates)


def cuda_forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse, cu_seqlens=None,
                 need_states=True):
    if cu_seqlens is not None:  # the CUDA kernels walk padded rows: packed sequences are padded for them
        return packed_forward(_cuda_dense_forward, gates, c0, forget_mask, forget_scale, output_gate, batch_first,
                              reverse, cu_seqlens)
    return _cuda_dense_forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                               need_states)


def cuda_backward(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                  batch_first, reverse, cu_seqlens=None):
    if cu_seqlens is not None:
        return packed_backward(_cuda_dense_backward, grad_output, grad_c_n, gates, states, c0, forget_mask,
                               forget_scale, output_gate, batch_first, reverse, cu_seqlens)
    return _cuda_dense_backward(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                output_gate, batch_first, reverse)


def forward_into(output: Tensor, states: Optional[Tensor], c_n: Optional[Tensor], gates: Tensor,
                       c0: Optional[Tensor] = None, forget_mask: Optional[Tensor] = None,
                       lengths: Optional[Tensor] = None, *, forget_scale: float = 1.0, output_gate: bool = True,
                       batch_first: bool = False, reverse: bool = False) -> Tensor:
    """The fused gates forward writing into given (any-strided) ``output``, ``states`` and
    ``c_n`` (None: not written), as ForgetMult's ``forward_into`` does."""
    check_qrnn_gates_args(gates, c0, forget_mask, forget_scale, lengths, output_gate, batch_first)
    _launch_forward(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                               batch_first, reverse)
    return output


def backward_into(grad_gates: Tensor, grad_c0: Optional[Tensor], grad_output: Optional[Tensor],
                        grad_c_n: Optional[Tensor], gates: Tensor, states: Tensor, c0: Optional[Tensor] = None,
                        forget_mask: Optional[Tensor] = None, lengths: Optional[Tensor] = None, *,
                        forget_scale: float = 1.0, output_gate: bool = True, batch_first: bool = False,
                        reverse: bool = False) -> Tensor:
    """The fused gates backward writing into given ``grad_gates`` and ``grad_c0`` (None: not written)."""
    check_qrnn_gates_backward_args(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale,
                                   output_gate, batch_first)
    _launch_backward(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                forget_scale, output_gate, batch_first, reverse)
    return grad_gates


def forward_width(args: tuple) -> int:
    """Hidden units per thread that the gates forward launches for :func:`forward_args`
    (host-only, so CPU tensors answer too)."""
    return _C.cuda_qrnn_gates_forward_width(*args)[0]


def backward_width(args: tuple) -> int:
    """As :func:`gates_forward_width`, for ``kernel_args.qrnn_gates_backward``."""
    return _C.cuda_qrnn_gates_backward_width(*args)[0]


# ---- Packed sequences on kernels of padded rows (the CUDA kernels) -----------------------------------


def _padding(cu_seqlens: Tensor, steps: int) -> tuple:
    """(index (N, L) into the packed row, real (N, L) mask, lengths (N,)) of the padded layout."""
    check_offset_values("qrnn_gates", steps, None, cu_seqlens)
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    longest = int(lengths.max()) if lengths.numel() else 0
    t = torch.arange(longest, device=cu_seqlens.device)
    real = t.unsqueeze(0) < lengths.unsqueeze(1)
    index = (cu_seqlens[:-1].unsqueeze(1) + t.unsqueeze(0)).clamp(max=max(steps - 1, 0))
    return index, real, lengths


def _pad(row: Optional[Tensor], index: Tensor, batch_first: bool) -> Optional[Tensor]:
    """A packed (1, T, C) or (T, 1, C) row as padded (N, L, C) rows."""
    if row is None:
        return None
    flat = row[0] if batch_first else row[:, 0]
    return flat[index] if flat.shape[0] else flat.new_zeros(*index.shape, flat.shape[-1])


def _unpad(padded: Tensor, real: Tensor, batch_first: bool) -> Tensor:
    flat = padded[real]  # the real steps, sequence after sequence: the packed order
    return (flat.unsqueeze(0) if batch_first else flat.unsqueeze(1)).contiguous()


def packed_forward(dense_forward, gates, c0, forget_mask, forget_scale, output_gate, batch_first, reverse,
                   cu_seqlens):
    """The gates over packed sequences through ``dense_forward``, a kernel of padded rows with
    lengths: the sequences are gathered into padded rows and the results scattered back."""
    steps = gates.shape[1 if batch_first else 0]
    index, real, lengths = _padding(cu_seqlens, steps)
    output, c_n, states = dense_forward(_pad(gates, index, batch_first), c0, _pad(forget_mask, index, batch_first),
                                        lengths, forget_scale, output_gate, True, reverse)
    return (_unpad(output, real, batch_first), c_n,
            _unpad(states, real, batch_first) if output_gate else gates.new_empty(0))


def packed_backward(dense_backward, grad_output, grad_c_n, gates, states, c0, forget_mask, forget_scale, output_gate,
                    batch_first, reverse, cu_seqlens):
    """The gradients of :func:`packed_forward` through ``dense_backward``."""
    steps = gates.shape[1 if batch_first else 0]
    index, real, lengths = _padding(cu_seqlens, steps)
    grad_gates, grad_c0 = dense_backward(
        _pad(grad_output, index, batch_first), grad_c_n, _pad(gates, index, batch_first),
        _pad(states, index, batch_first), c0, _pad(forget_mask, index, batch_first), lengths, forget_scale,
        output_gate, True, reverse)
    return _unpad(grad_gates, real, batch_first), grad_c0
