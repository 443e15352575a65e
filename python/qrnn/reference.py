"""Plain PyTorch reference implementations, beside the kernels they check.

Slow on purpose (one expression per time step) and differentiable by autograd; tests run
them in float64 as ground truth, benchmarks use them as the original per-timestep path.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def forget_mult_reference(f: Tensor, x: Tensor, h0: Optional[Tensor] = None, *,
                          batch_first: bool = False) -> Tensor:
    """``h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1]``, computed in the inputs' dtype."""
    if batch_first:
        f, x = f.transpose(0, 1), x.transpose(0, 1)
    h = f.new_zeros(f.shape[1:]) if h0 is None else h0.to(f.dtype)
    steps = []
    for t in range(f.shape[0]):
        h = f[t] * x[t] + (1 - f[t]) * h
        steps.append(h)
    out = torch.stack(steps) if steps else torch.empty_like(f)
    return out.transpose(0, 1) if batch_first else out


def forget_mult_backward_reference(grad_h: Tensor, f: Tensor, x: Tensor, h: Tensor,
                                   h0: Optional[Tensor] = None, *, batch_first: bool = False):
    """Gradients (grad_f, grad_x, grad_h0) of :func:`forget_mult_reference`, by the
    explicit reverse-time loop rather than autograd (fast enough for long sequences)."""
    if batch_first:
        grad_h, f, x, h = (t.transpose(0, 1) for t in (grad_h, f, x, h))
    g = f.new_zeros(f.shape[1:])
    grad_f, grad_x = torch.empty_like(f), torch.empty_like(x)
    for t in range(f.shape[0] - 1, -1, -1):
        g = g + grad_h[t]
        h_prev = h[t - 1] if t > 0 else (h0.to(f.dtype) if h0 is not None else torch.zeros_like(g))
        grad_x[t] = f[t] * g
        grad_f[t] = (x[t] - h_prev) * g
        g = g - f[t] * g
    if batch_first:
        grad_f, grad_x = grad_f.transpose(0, 1), grad_x.transpose(0, 1)
    return grad_f, grad_x, (g if h0 is not None else None)


# ---- QRNN layer (layers) --------------------------------------------------------------


def _walk(valid: int, reverse: bool) -> list:
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
        steps = _walk(T if lengths is None else int(lengths[b]), reverse)
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
        for t in _walk(T if lengths is None else int(lengths[b]), reverse):
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
