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
    "seq_len": "shape[1] if batch_first else shape[0]", "batch": "shape[0] if batch_first else shape[1]",
    "hidden": "hidden", "output_gate": "int(output_gate)", "gates": "view3(gates, batch_first)",
    "gate_stride": "hidden * gates.stride(2)", "forget_mask": "view3(forget_mask, batch_first)",
    "c0": "view2(c0)", "c0_dtype": "code if c0 is None else DTYPE_CODES[c0.dtype]",
    "lengths": "0 if lengths is None else lengths.data_ptr()",
    "lengths_stride": "1 if lengths is None else lengths.stride(0)", "reverse": "int(reverse)",
    "c_n_dtype": "DTYPE_CODES[state_dtype(gates.dtype)]",
}
_gates = probe(2, 3, 12)
_out = probe(2, 3, 4)
forward_args: Callable[..., tuple] = generate(
    "qrnn_gates_forward",
    "output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse",
    _GATES_PROLOGUE + "hidden = output.shape[2]",
    {**_GATES_COMMON, "output": "view3(output, batch_first)", "states": "view3(states, batch_first)",
     "c_n": "view2(c_n)"},
    [(_out, _out, probe(3, 4), _gates, None, None, None, 1.0, True, False, False)])
backward_args: Callable[..., tuple] = generate(
    "qrnn_gates_backward",
    "grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, "
    "output_gate, batch_first, reverse",
    _GATES_PROLOGUE + "hidden = shape[2] // (3 if output_gate else 2)",
    {**_GATES_COMMON, "states": "view3(states, batch_first)", "grad_output": "view3(grad_output, batch_first)",
     "grad_c_n": "view2(grad_c_n)", "grad_gates": "view3(grad_gates, batch_first)",
     "grad_gate_stride": "hidden * grad_gates.stride(2)", "grad_c0": "view2(grad_c0)"},
    [(_gates, None, _out, None, _gates, _out, None, None, torch.tensor([1, 2, 2]), 0.5, True, False, True)])
del _gates, _out


def outputs(gates: Tensor, output_gate: bool, batch_first: bool, need_states: bool = True) -> tuple:
    """Fresh (output, states or None, c_n) for a gates forward kernel."""
    shape = gates.shape
    hidden = shape[2] // gate_count(output_gate)
    output = gates.new_empty((shape[0], shape[1], hidden))  # new_empty: gates' device even if the default moved
    # The backward needs every c[t]; without an output gate that is the output itself.
    states = gates.new_empty((shape[0], shape[1], hidden)) if (output_gate and need_states) else None
    c_n = gates.new_empty((shape[0] if batch_first else shape[1], hidden), dtype=state_dtype(gates.dtype))
    return output, states, c_n


def _grads(gates: Tensor, c0: Optional[Tensor]) -> tuple:
    """Fresh (grad_gates, grad_c0 or None) for a gates backward kernel."""
    return empty_contiguous(gates), (empty_contiguous(c0) if c0 is not None else None)


# ---- CPU --------------------------------------------------------------------------------------


def cpu_forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                       need_states=True):
    output, states, c_n = outputs(gates, output_gate, batch_first, need_states)
    _C.qrnn_gates_forward(*forward_args(output, states, c_n, gates, c0, forget_mask, lengths,
                                                    forget_scale, output_gate, batch_first, reverse),
                          torch.get_num_threads())
    return output, c_n, or_empty(states, gates)


def cpu_backward(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                        batch_first, reverse):
    grad_gates, grad_c0 = _grads(gates, c0)
    _C.qrnn_gates_backward(*backward_args(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0,
                                                      forget_mask, lengths, forget_scale, output_gate, batch_first,
                                                      reverse), torch.get_num_threads())
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


def cuda_forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                       need_states=True):
    output, states, c_n = outputs(gates, output_gate, batch_first, need_states)
    _launch_forward(output, states, c_n, gates, c0, forget_mask, lengths, forget_scale, output_gate,
                               batch_first, reverse)
    return output, c_n, or_empty(states, gates)


def cuda_backward(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                        batch_first, reverse):
    grad_gates, grad_c0 = _grads(gates, c0)
    _launch_backward(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0, forget_mask, lengths,
                                forget_scale, output_gate, batch_first, reverse)
    return grad_gates, or_empty(grad_c0, gates)


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
