"""The QRNN layer from its definition, one sequence and one step at a time: the float64 ground
truth of the layer tests. Each op family's own reference lives beside it
(``qrnn.ops.<family>.reference``)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .ops.qrnn_gates.reference import qrnn_gates_reference, time_steps


def qrnn_layer_reference(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None, c0: Optional[Tensor] = None,
                         x_tail: Optional[Tensor] = None, *, window: int = 1, output_gate: bool = True,
                         forget_mask: Optional[Tensor] = None, forget_scale: float = 1.0,
                         lengths: Optional[Tensor] = None, batch_first: bool = False,
                         reverse: bool = False) -> tuple:
    """One direction of a QRNN layer from its definition, one sequence and one step at a
    time: each step's window of inputs (newest first, zeros or ``x_tail`` before the
    start, zeros past a reversed sequence's end) through the weights, then
    :func:`qrnn_gates_reference`. Returns ``(output, c_n, x_tail_n)``; x_tail_n is None for
    window 1 or in reverse."""
    if batch_first:
        x = x.transpose(0, 1)
        forget_mask = None if forget_mask is None else forget_mask.transpose(0, 1)
        x_tail = None if x_tail is None else x_tail.transpose(0, 1)
    T, B, n_in = x.shape
    gates = x.new_zeros(T, B, weight.shape[0])
    tails = []
    for b in range(B):
        # Inputs seen so far in walking order, most recent last; the tail comes first.
        seen = [] if (reverse or x_tail is None) else [x_tail[j, b] for j in range(window - 1)]
        seen = [x.new_zeros(n_in)] * (window - 1 - len(seen)) + seen
        for t in time_steps(T if lengths is None else int(lengths[b]), reverse):
            seen.append(x[t, b])
            source = torch.cat([seen[-1 - j] for j in range(window)])
            gates[t, b] = weight @ source + (0 if bias is None else bias)
        if window > 1:
            tails.append(torch.stack(seen[len(seen) - (window - 1):]))
    output, c_n = qrnn_gates_reference(gates, c0, output_gate=output_gate, forget_mask=forget_mask,
                                       forget_scale=forget_scale, lengths=lengths, reverse=reverse)
    x_tail_n = None
    if window > 1 and not reverse:
        x_tail_n = torch.stack(tails, 1) if B > 0 else x.new_zeros(window - 1, 0, n_in)
        x_tail_n = x_tail_n.transpose(0, 1) if batch_first else x_tail_n
    return (output.transpose(0, 1) if batch_first else output), c_n, x_tail_n
