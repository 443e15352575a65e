"""Variable-length and packed sequences, the same for every op family (the C++ side:
cpp/include/qrnn/view.hpp, "Sequences").

- ``lengths``: dense rows, row ``b`` has ``lengths[b]`` real steps; later steps are padding
  (outputs and gradients written as zeros), the final state is the state after the last real
  step.
- ``cu_seqlens``: packed sequences as in flash-linear-attention: the sequences lie end to end
  in one batch row of ``total`` steps, sequence ``n`` being steps ``cu_seqlens[n]`` to
  ``cu_seqlens[n + 1] - 1``; initial and final states have one row per sequence, ``(N, hidden)``.
- ``reverse``: each sequence runs from its last real step back to its first.

Here: the argument checks, the final states read off the outputs, and the dense-rows form of
a call with sequences, which the devices whose kernels walk whole rows (CUDA, the fallback)
run: a sequence's first step resets the state (decay 0, the initial state folded into the
input), padding steps have decay and input 0.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import torch
from torch import Tensor

__all__ = ["check_sequences", "as_offsets", "sequence_count", "sequence_of_steps", "final_states", "Walk", "walk_of",
           "dense_scan_forward", "dense_scan_backward", "check_offset_values"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def as_offsets(name: str, op: str, t) -> Optional[Tensor]:
    """``lengths`` or ``cu_seqlens`` as the ops take them: 1-D int64 (int32 is converted)."""
    if t is None:
        return None
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{op}: {name} must be an int32 or int64 tensor, got {t.dtype}")
    return t.to(torch.int64).contiguous()


def check_sequences(op: str, batch: int, device: torch.device, lengths, cu_seqlens) -> int:
    """Shapes, dtypes and devices of ``lengths`` (int64, ``(batch,)``) and ``cu_seqlens`` (int64,
    ``(N + 1,)``, with ``batch == 1``); returns the number of sequences, the states' rows. Values
    are checked where they are read (:func:`check_offset_values`, and the CPU kernels)."""
    if lengths is not None and cu_seqlens is not None:
        raise ValueError(f"{op}: give lengths or cu_seqlens, not both")
    for name, t in (("lengths", lengths), ("cu_seqlens", cu_seqlens)):
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.dtype is not torch.int64:
            raise TypeError(f"{op}: {name} must be an int64 tensor here (qrnn's functions convert int32), "
                            f"got {t.dtype}")
        if t.dim() != 1:
            raise ValueError(f"{op}: {name} must be 1-D, got shape {tuple(t.shape)}")
        if t.layout is not torch.strided or t.is_nested:
            raise TypeError(f"{op}: {name} must be a dense (strided) tensor")
        if t.numel() > 1 and t.stride(0) != 1:
            raise ValueError(f"{op}: {name} must be contiguous")
        if t.device != device:
            raise ValueError(f"{op}: {name} must be on the input's device {device}, got {t.device}")
    if lengths is not None and lengths.shape[0] != batch:
        raise ValueError(f"{op}: lengths must have shape (batch,) = ({batch},), got {tuple(lengths.shape)}")
    if cu_seqlens is None:
        return batch
    if batch != 1:
        raise ValueError(f"{op}: with cu_seqlens the input must be one packed row (batch 1), got batch {batch}")
    if cu_seqlens.shape[0] < 1:
        raise ValueError(f"{op}: cu_seqlens must hold N + 1 offsets (at least the 0), got an empty tensor")
    return cu_seqlens.shape[0] - 1


def sequence_count(batch: int, cu_seqlens: Optional[Tensor]) -> int:
    return batch if cu_seqlens is None else cu_seqlens.shape[0] - 1


def check_offset_values(op: str, seq_len: int, lengths: Optional[Tensor], cu_seqlens: Optional[Tensor]) -> None:
    """The values, where a kernel does not check them itself (it reads them on the host):
    lengths in 0..seq_len; cu_seqlens from 0, nondecreasing, to seq_len. Synchronises with a
    GPU."""
    if lengths is not None and lengths.numel() and bool(((lengths < 0) | (lengths > seq_len)).any()):
        raise ValueError(f"{op}: lengths must be in 0..seq_len ({seq_len}), got {lengths.tolist()}")
    if cu_seqlens is not None:
        values = cu_seqlens.tolist()
        if values[0] != 0:
            raise ValueError(f"{op}: cu_seqlens[0] must be 0, got {values[0]}")
        if any(b < a for a, b in zip(values, values[1:])):
            raise ValueError(f"{op}: cu_seqlens must be nondecreasing, got {values}")
        if values[-1] != seq_len:
            raise ValueError(f"{op}: cu_seqlens[-1] must be the packed length {seq_len}, got {values[-1]}")


def final_states(h: Tensor, h0: Optional[Tensor], lengths: Optional[Tensor], cu_seqlens: Optional[Tensor],
                 reverse: bool, batch_first: bool) -> Tensor:
    """Each sequence's state after its last real step, ``(N, hidden)``, read off ``h`` (``h0``,
    or zeros, for an empty sequence), in ``h``'s dtype. Differentiable (plain indexing)."""
    hm = h.transpose(0, 1) if batch_first else h  # (T, rows, H)
    steps, rows, hidden = hm.shape
    if cu_seqlens is None and lengths is None:
        if steps == 0:
            return h0.to(h.dtype) if h0 is not None else h.new_zeros(rows, hidden)
        return hm[0 if reverse else steps - 1]
    if cu_seqlens is not None:
        # The last step walked: the last of the sequence (or its first, reversed).
        at = cu_seqlens[:-1] if reverse else cu_seqlens[1:] - 1
        count = cu_seqlens[1:] - cu_seqlens[:-1]
        picked = hm[:, 0].index_select(0, at.clamp(0, max(steps - 1, 0))) if steps else h.new_zeros(count.shape[0],
                                                                                                      hidden)
    else:
        assert lengths is not None
        count = lengths
        at = torch.zeros_like(lengths) if reverse else (lengths - 1).clamp(min=0)
        picked = (hm.gather(0, at.view(1, rows, 1).expand(1, rows, hidden)).squeeze(0) if steps
                  else h.new_zeros(rows, hidden))
    fallback = h0.to(h.dtype) if h0 is not None else torch.zeros_like(picked)
    return torch.where((count > 0).unsqueeze(1), picked, fallback)


def sequence_of_steps(cu_seqlens: Tensor, steps: int) -> Tensor:
    """The packed sequence each of ``steps`` steps belongs to, int64 ``(steps,)``: how many
    sequences start at or before it, less one. Counting (a scatter-add of the starts, then a
    cumulative sum) rather than ``searchsorted``: O(steps + N), and ONNX has both."""
    starts = torch.zeros(steps + 1, dtype=torch.int64, device=cu_seqlens.device)
    inner = cu_seqlens[1:-1]  # sequence 0 starts at 0; a start at `steps` is an empty sequence's
    starts = starts.scatter_add(0, inner, torch.ones_like(inner))
    return starts.cumsum(0)[:steps]


class Walk(NamedTuple):
    """Where the sequences are in a (time, rows) grid: each sequence's first walked step, the
    real (not padding) steps, and the sequence each step belongs to."""

    start: Tensor  # bool (T, rows)
    real: Tensor  # bool (T, rows)
    sequence: Tensor  # int64 (T, rows)


def walk_of(steps: int, rows: int, lengths: Optional[Tensor], cu_seqlens: Optional[Tensor], reverse: bool,
            device) -> Walk:
    t = torch.arange(steps, device=device)
    if cu_seqlens is not None:
        sequence = sequence_of_steps(cu_seqlens, steps)
        first = cu_seqlens[sequence + 1] - 1 if reverse else cu_seqlens[sequence]
        start = (t == first).view(steps, 1)
        return Walk(start, torch.ones_like(start), sequence.view(steps, 1))
    rows_index = torch.arange(rows, device=device).expand(steps, rows)
    if lengths is None:
        start = (t == (steps - 1 if reverse else 0)).view(steps, 1).expand(steps, rows)
        return Walk(start, torch.ones_like(start), rows_index)
    real = t.view(steps, 1) < lengths.view(1, rows)
    first = (lengths - 1) if reverse else torch.zeros_like(lengths)
    start = real & (t.view(steps, 1) == first.view(1, rows))
    return Walk(start, real, rows_index)


def _initial_at(h0: Optional[Tensor], walk: Walk, like: Tensor) -> Optional[Tensor]:
    if h0 is None:
        return None
    return h0.to(like.dtype)[walk.sequence]  # (T, rows, H)


def dense_scan_forward(scan: Callable[[Tensor, Tensor, bool], Tensor], a: Tensor, b: Tensor, h0: Optional[Tensor],
                       walk: Walk, reverse: bool) -> Tensor:
    """``h = a h + b`` with sequences, time-major, through ``scan(a, b, reverse)``: a dense
    scan of whole rows with no initial state."""
    start, real = walk.start.unsqueeze(-1), walk.real.unsqueeze(-1)
    zero = a.new_zeros(())
    initial = _initial_at(h0, walk, a)
    first_input = b if initial is None else b + a * initial
    b_dense = torch.where(real, torch.where(start, first_input, b), zero)
    a_dense = torch.where(start | ~real, zero, a)
    return scan(a_dense, b_dense, reverse)


def dense_scan_backward(scan_backward: Callable[[Tensor, Tensor, Tensor, bool], tuple], grad_h: Tensor, a: Tensor,
                        h: Tensor, h0: Optional[Tensor], walk: Walk, reverse: bool, states: int) -> tuple:
    """The gradients ``(grad_a, grad_b, grad_h0 or None)`` of :func:`dense_scan_forward` from
    ``scan_backward(grad_h, a, h, reverse) -> (grad_a, grad_b)`` of the dense scan."""
    start, real = walk.start.unsqueeze(-1), walk.real.unsqueeze(-1)
    zero = a.new_zeros(())
    a_dense = torch.where(start | ~real, zero, a)
    grad_a_dense, grad_b_dense = scan_backward(grad_h, a_dense, h, reverse)
    grad_b = torch.where(real, grad_b_dense, zero)
    initial = _initial_at(h0, walk, a)
    at_start = grad_b_dense * initial if initial is not None else zero
    grad_a = torch.where(real, torch.where(start, at_start, grad_a_dense), zero)
    grad_h0 = None
    if h0 is not None:
        hidden = a.shape[-1]
        contribution = torch.where(start, grad_b_dense * a, zero).reshape(-1, hidden)
        grad_h0 = a.new_zeros(states, hidden).index_add_(0, walk.sequence.reshape(-1), contribution).to(h0.dtype)
    return grad_a, grad_b, grad_h0
