"""The CPU kernels behind the ops: qrnn._C's CPU entry points writing fresh outputs, on as
many threads as torch uses."""

from __future__ import annotations

import torch

from .. import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub
from ._outputs import forget_mult_grads, or_empty, qrnn_gates_grads, qrnn_gates_outputs
from .kernel_args import forget_mult_backward as _forget_mult_backward_args
from .kernel_args import forget_mult_forward as _forget_mult_forward_args
from .kernel_args import qrnn_gates_backward as _qrnn_gates_backward_args
from .kernel_args import qrnn_gates_forward as _qrnn_gates_forward_args

__all__ = ["forget_mult_forward", "forget_mult_backward", "qrnn_gates_forward", "qrnn_gates_backward"]


def forget_mult_forward(f, x, h0, batch_first):
    # _outputs.empty_contiguous inlined: the eager path's cost at small shapes is mostly calls.
    h = torch.empty_like(f) if f.is_contiguous() else torch.empty_like(f, memory_format=torch.contiguous_format)
    _C.forget_mult_forward(*_forget_mult_forward_args(h, f, x, h0, batch_first), torch.get_num_threads())
    return h


def forget_mult_backward(grad_h, f, x, h, h0, batch_first):
    grad_f, grad_x, grad_h0 = forget_mult_grads(f, h0)
    _C.forget_mult_backward(*_forget_mult_backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first),
                            torch.get_num_threads())
    return grad_f, grad_x, or_empty(grad_h0, f)


def qrnn_gates_forward(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse,
                       need_states=True):
    output, states, c_n = qrnn_gates_outputs(gates, output_gate, batch_first, need_states)
    _C.qrnn_gates_forward(*_qrnn_gates_forward_args(output, states, c_n, gates, c0, forget_mask, lengths,
                                                    forget_scale, output_gate, batch_first, reverse),
                          torch.get_num_threads())
    return output, c_n, or_empty(states, gates)


def qrnn_gates_backward(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                        batch_first, reverse):
    grad_gates, grad_c0 = qrnn_gates_grads(gates, c0)
    _C.qrnn_gates_backward(*_qrnn_gates_backward_args(grad_gates, grad_c0, grad_output, grad_c_n, gates, states, c0,
                                                      forget_mask, lengths, forget_scale, output_gate, batch_first,
                                                      reverse), torch.get_num_threads())
    return grad_gates, or_empty(grad_c0, gates)
