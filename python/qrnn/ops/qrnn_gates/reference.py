"""Plain PyTorch fused QRNN gates (``qrnn.qrnn_gates``), one sequence and one step at a time
through the ForgetMult reference: the tests' ground truth (in float64)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..forget_mult.reference import forget_mult_reference


def time_steps(valid: int, reverse: bool) -> list:
    """The time steps of a sequence with `valid` steps, in the order the recurrence visits them."""
    return list(range(valid - 1, -1, -1) if reverse else range(valid))


def qrnn_gates_reference(gates: Tensor, c0: Optional[Tensor] = None, *, output_gate: bool = True,
                         forget_mask: Optional[Tensor] = None, forget_scale: float = 1.0,
                         lengths: Optional[Tensor] = None, batch_first: bool = False,
                         reverse: bool = False) -> tuple:
    """The fused QRNN pointwise step (``qrnn.qrnn_gates``), one sequence at a time through
    :func:`forget_mult_reference` in the inputs' dtype: ``(output, c_n)``."""
    if batch_first:
        gates = gates.transpose(0, 1)
        forget_mask = None if forget_mask is None else forget_mask.transpose(0, 1)
    T, B = gates.shape[0], gates.shape[1]
    H = gates.shape[2] // (3 if output_gate else 2)
    output = gates.new_zeros(T, B, H)
    c_n = gates.new_zeros(B, H)
    for b in range(B):
        c = gates.new_zeros(H) if c0 is None else c0[b].to(gates.dtype)
        steps = time_steps(T if lengths is None else int(lengths[b]), reverse)
        if steps:
            g = gates[steps, b]
            z, f = torch.tanh(g[:, :H]), torch.sigmoid(g[:, H:2 * H]) * forget_scale
            if forget_mask is not None:
                f = f * forget_mask[steps, b]
            cs = forget_mult_reference(f.unsqueeze(1), z.unsqueeze(1), c.unsqueeze(0)).squeeze(1)
            output[steps, b] = torch.sigmoid(g[:, 2 * H:]) * cs if output_gate else cs
            c = cs[-1]
        c_n[b] = c
    return (output.transpose(0, 1) if batch_first else output), c_n
