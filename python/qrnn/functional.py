"""The functional QRNN layer, :func:`qrnn_layer`, and the argument checks the layers share.

A QRNN layer with window k computes, for each step t,

    G = W [x[t], x[t-1], ..., x[t-k+1]] + b,   split into Z, F, O (in that order)
    z = tanh(Z), f = sigmoid(F), o = sigmoid(O)
    c[t] = f * z + (1 - f) * c[t-1]
    h[t] = o * c[t]        (or c[t] without the output gate)

with one GEMM for every step at once, then the fused pointwise kernel
(:func:`qrnn.ops.qrnn_gates`) reading G where the GEMM wrote it. State in, state out:
the carried state (c before the output gate, and for k > 1 the last k - 1 inputs) is
passed explicitly, so chunked truncated BPTT, ``torch.compile`` and DDP see plain
inputs and outputs.
"""

from __future__ import annotations

import numbers
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import ops
from .ops.core.kernel_args import accepts_state_dtype, state_dtype
from .ops.core.sequences import sequence_of_steps

__all__ = ["qrnn_layer"]


def low_precision_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype when autocast is on for this device, else None."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type without autocast, e.g. meta (shape inference, deferred init)
        return None
    return torch.get_autocast_dtype(device_type) if enabled else None


def check_input_dtype(input: Tensor, dtype: Optional[torch.dtype]) -> None:
    # As nn.GRU: the input has the parameters' dtype, unless autocast casts both (None: a
    # module in place of the Linear without floating-point parameters checks for itself).
    if dtype is not None and input.dtype != dtype and low_precision_dtype(input.device.type) is None:
        raise ValueError(f"input must have the type {dtype} (the parameters'), got type {input.dtype}")


def _window_inputs(x: Tensor, x_tail: Optional[Tensor], window: int, lengths: Optional[Tensor],
                   time_dim: int, reverse: bool, cu_seqlens: Optional[Tensor] = None) -> tuple:
    """``concat(x[t], x[t-1], ..., x[t-window+1])`` on the feature axis (one copy), and the
    new input tail. In reverse the previous inputs are x[t+1], ..., zero past each end."""
    T = x.shape[time_dim]
    pad_shape = list(x.shape)
    pad_shape[time_dim] = window - 1
    if cu_seqlens is not None:
        return _packed_window_inputs(x, window, cu_seqlens, time_dim, reverse, pad_shape), None
    if reverse:
        if lengths is not None:  # inputs past a sequence's end are not part of it (even NaN)
            padding = torch.arange(T, device=x.device).unsqueeze(1) >= lengths.unsqueeze(0)  # (T, B)
            x = x.masked_fill((padding.t() if time_dim == 1 else padding).unsqueeze(-1), 0)
        padded = torch.cat([x, x.new_zeros(pad_shape)], time_dim)
        parts = [padded.narrow(time_dim, j, T) for j in range(window)]
        return torch.cat(parts, -1), None
    tail = x.new_zeros(pad_shape) if x_tail is None else x_tail.to(x.dtype)
    padded = torch.cat([tail, x], time_dim)
    parts = [padded.narrow(time_dim, window - 1 - j, T) for j in range(window)]
    if lengths is None:
        new_tail = padded.narrow(time_dim, T, window - 1).clone()
    else:  # each sequence's own last window - 1 inputs: padded rows lengths[b] .. lengths[b] + window - 2
        rows = lengths.unsqueeze(0) + torch.arange(window - 1, device=x.device).unsqueeze(1)  # (window-1, B)
        rows = rows.t() if time_dim == 1 else rows
        new_tail = padded.gather(time_dim, rows.unsqueeze(-1).expand(*rows.shape, x.shape[-1]))
    return torch.cat(parts, -1), new_tail


def _packed_window_inputs(x: Tensor, window: int, cu_seqlens: Tensor, time_dim: int, reverse: bool,
                          pad_shape: list) -> Tensor:
    """The window over packed sequences: a step never sees another sequence's inputs (those
    before its sequence's first step, or after its last in reverse, read as zeros)."""
    T = x.shape[time_dim]
    t = torch.arange(T, device=x.device)
    sequence = sequence_of_steps(cu_seqlens, T)
    # How many earlier (later, in reverse) steps of its own sequence each step has.
    room = (cu_seqlens[sequence + 1] - 1 - t) if reverse else (t - cu_seqlens[sequence])
    zeros = x.new_zeros(pad_shape)
    padded = torch.cat([x, zeros], time_dim) if reverse else torch.cat([zeros, x], time_dim)
    parts = [x]
    for j in range(1, window):
        part = padded.narrow(time_dim, j if reverse else window - 1 - j, T)
        outside = (room < j).view((1, T, 1) if time_dim == 1 else (T, 1, 1))
        parts.append(part.masked_fill(outside, 0))
    return torch.cat(parts, -1)


def qrnn_layer(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, c0: Optional[Tensor] = None,
               x_tail: Optional[Tensor] = None, *, window: int = 1, output_gate: bool = True,
               zoneout: float = 0.0, training: bool = False, lengths: Optional[Tensor] = None,
               batch_first: bool = False, reverse: bool = False, cu_seqlens: Optional[Tensor] = None) -> tuple:
    """One direction of one QRNN layer, functional: state in, state out.

    Args:
        input: ``(seq_len, batch, input_size)``, or ``(batch, seq_len, input_size)`` with
            ``batch_first``.
        weight: ``(gates * hidden, window * input_size)`` (gates = 3 with the output gate,
            else 2), blocks Z, F, O.
        bias: ``(gates * hidden,)``, or None.
        c0: initial cell state ``(batch, hidden)`` or None for zeros.
        x_tail: the ``window - 1`` inputs before ``input`` (oldest first, in input's
            layout), or None for zeros. Ignored in reverse, where the inputs "before"
            a step are the ones after it, zero past the sequence's end.
        window: how many inputs each step reads (>= 1).
        output_gate: h = sigmoid(O) * c when True (the weight has 3 blocks), h = c when
            False (2 blocks).
        zoneout: probability p of keeping an element's previous state: in training f is
            multiplied by an unscaled Bernoulli(1 - p) mask per element and step, at
            evaluation by 1 - p.
        training: whether zoneout draws masks (training) or scales f (evaluation).
        lengths: int64 ``(batch,)`` valid steps per sequence, each in ``0..seq_len``, or
            None for full sequences (see :func:`qrnn.qrnn_gates`); moved to the gates'
            device if needed.
        batch_first: the layout of ``input``, ``x_tail`` and the output.
        reverse: walk each sequence from its own last valid step back to step 0.
        cu_seqlens: int64 ``(N + 1,)`` offsets of ``N`` sequences packed in one row (batch
            1), as for :func:`qrnn.qrnn_gates`: ``c0`` and ``c_n`` are ``(N, hidden)``, the
            window reads zeros before each sequence's first step (no step sees another
            sequence's inputs), and ``x_tail`` must be None.

    Returns:
        ``(output, c_n, x_tail_n)``: the output in the GEMM's dtype (the autocast dtype
        under autocast), ``c_n`` each sequence's state after its last valid step (float32
        for 16-bit), and the input tail to pass to the next chunk (None for window 1 or
        in reverse).

    Raises:
        TypeError, ValueError: a ``window`` that is not a positive int, a ``zoneout``
            outside [0, 1), or (from ``F.linear`` and :func:`qrnn.qrnn_gates`) inputs,
            weights or states that do not fit together, naming the argument where qrnn
            checks it.
    """
    return qrnn_layer_with(input, None, weight, bias, c0, x_tail, window, output_gate, zoneout, training, lengths,
                           batch_first, reverse, cu_seqlens)


def qrnn_layer_with(input: Tensor, linear: Optional[nn.Module], weight: Optional[Tensor], bias: Optional[Tensor],
                    c0: Optional[Tensor], x_tail: Optional[Tensor], window: int, output_gate: bool, zoneout: float,
                    training: bool, lengths: Optional[Tensor], batch_first: bool, reverse: bool,
                    cu_seqlens: Optional[Tensor] = None) -> tuple:
    """:func:`qrnn_layer`, the GEMM being ``F.linear(source, weight, bias)`` when ``linear`` is
    None, else ``linear(source)`` (any module: a weight-dropped, parametrized, quantized or
    adapter linear), whose output the fused gate kernel then reads."""
    window = check_positive_int("window", window)
    zoneout = check_probability("zoneout", zoneout)
    time_dim = 1 if batch_first else 0
    if cu_seqlens is not None and x_tail is not None:
        raise ValueError("x_tail must be None with cu_seqlens: each packed sequence's window starts from zeros")
    if window > 1:
        low = low_precision_dtype(input.device.type)
        if low is not None and input.dtype == torch.float32:
            input = input.to(low)  # the GEMM casts anyway: cast once, before the window copy
        source, x_tail_n = _window_inputs(input, x_tail, window, lengths, time_dim, reverse, cu_seqlens)
    else:
        source, x_tail_n = input, None
    # Callers pass weight whenever linear is None (the checker cannot relate the two).
    gates = F.linear(source, weight, bias) if linear is None else linear(source)  # type: ignore[arg-type]
    if c0 is not None and not accepts_state_dtype(gates.dtype, c0.dtype):
        c0 = c0.to(state_dtype(gates.dtype))
    forget_mask, forget_scale = None, 1.0
    if zoneout > 0.0:
        if training:
            shape = gates.shape[:-1] + (gates.shape[-1] // (3 if output_gate else 2),)
            forget_mask = torch.empty(shape, dtype=gates.dtype, device=gates.device).bernoulli_(1.0 - zoneout)
        else:
            forget_scale = 1.0 - zoneout
    if lengths is not None and lengths.device != gates.device:
        lengths = lengths.to(gates.device)
    output, c_n = ops.qrnn_gates(gates, c0, output_gate=output_gate, forget_mask=forget_mask,
                                 forget_scale=forget_scale, lengths=lengths, batch_first=batch_first,
                                 reverse=reverse, cu_seqlens=cu_seqlens)
    return output, c_n, x_tail_n



# ---- Argument checks (shared with the modules) ----------------------------------------


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_probability(name: str, value) -> float:
    # typeshed's numbers.Real has no comparison with float (it holds at runtime for every Real).
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:  # type: ignore[operator]
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def check_lengths(lengths, batch: int, seq_len: int, device: torch.device) -> Optional[Tensor]:
    """lengths as int64 ``(batch,)`` on ``device`` (the input's), values in 0..seq_len.

    Never a host synchronisation on a GPU: host values are checked on the host and copied
    from pinned memory without blocking; values already on the device are checked there
    (an asynchronous device assert), never read back."""
    if lengths is None:
        return None
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.shape[0] != batch:
        raise ValueError(f"lengths must have shape (batch,) = ({batch},), got {tuple(lengths.shape)}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must hold integers, got {lengths.dtype}")
    lengths = lengths.to(torch.int64)
    if not lengths.is_cpu:
        if lengths.device != device:
            raise ValueError(f"lengths must be on the CPU or the input's device {device}, got {lengths.device}")
        if batch > 0:
            torch._assert_async(((lengths >= 0) & (lengths <= seq_len)).all(), "lengths must be in 0..seq_len")
        return lengths
    if batch > 0 and not torch.compiler.is_compiling():  # a traced graph cannot branch on values
        low, high = int(lengths.min()), int(lengths.max())
        if low < 0 or high > seq_len:
            raise ValueError(f"lengths must be in 0..seq_len ({seq_len}), got values from {low} to {high}")
    if device.type == "cpu":
        return lengths
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("lengths: a CUDA graph is being captured, and a copy from host memory cannot be part "
                             "of it; pass lengths as a tensor on the input's GPU")
        return lengths.pin_memory().to(device, non_blocking=True)
    return lengths.to(device)


def check_cu_seqlens(cu_seqlens, rows: int, seq_len: int, device: torch.device) -> Optional[Tensor]:
    """cu_seqlens as int64 ``(N + 1,)`` on ``device`` (the input's) for one packed row: 1-D
    integers from 0, nondecreasing, to ``seq_len`` (values checked here when on the CPU; on
    a GPU the ops check them)."""
    if cu_seqlens is None:
        return None
    if not isinstance(cu_seqlens, Tensor):
        cu_seqlens = torch.as_tensor(cu_seqlens)
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be 1-D (N + 1 offsets), got shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must hold integers, got {cu_seqlens.dtype}")
    if rows != 1:
        raise ValueError(f"input with cu_seqlens must be one packed row (batch 1), got batch {rows}")
    if not cu_seqlens.is_cpu and cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens must be on the CPU or the input's device {device}, got {cu_seqlens.device}")
    cu_seqlens = cu_seqlens.to(torch.int64)
    if cu_seqlens.is_cpu and not _is_fake(cu_seqlens):
        values = cu_seqlens.tolist()
        if values[0] != 0 or values[-1] != seq_len or any(b < a for a, b in zip(values, values[1:])):
            raise ValueError(f"cu_seqlens must rise from 0 to the packed length {seq_len}, got {values}")
    return cu_seqlens.to(device).contiguous()


def _is_fake(t: Tensor) -> bool:
    """Traced or without values: its values cannot (or must not) be read here."""
    return torch.compiler.is_compiling() or type(t) is not Tensor or t.is_meta

