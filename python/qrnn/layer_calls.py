"""How qrnn's layers are called (:mod:`qrnn.modules`'s helpers): the record :class:`qrnn.QRNN`
passes each of its layers, whether a submodule's call can be made directly (no hook would
run), and the checks of a call's input and states (cell states, input tails, packed calls),
each failing with a ValueError that names the argument."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor, nn
from torch.nn.modules import module as _module_mod

from .functional import check_input_dtype


class _StackedLayerState(NamedTuple):
    """The ``hx`` :class:`QRNN` passes each of its layers: that layer's slice of the state,
    already checked once for the whole stack, and the stack's layout and direction. With
    it, ``QRNNLayer.forward`` skips its own parsing and returns :meth:`QRNNLayer.run`'s
    ``(output, c_n, x_tail_n)``. Passing it through ``nn.Module.__call__`` (rather than
    calling ``run``) is what makes forward hooks, checkpoint wrappers and FSDP2's per-layer
    unsharding see each layer's call; a hook may rebuild it with ``hx._replace(...)``."""

    c0: Optional[Tensor]
    x_tail: Optional[Tensor]
    batch_first: bool
    reverse: bool
    cu_seqlens: Optional[Tensor] = None


# Module hooks that a direct F.linear would skip (the global dicts are mutated in place, never
# rebound, so these references stay current; getattr: not every torch version has each one).
_GLOBAL_HOOKS = tuple(getattr(_module_mod, name, {}) for name in (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks", "_global_backward_hooks"))


def _unhooked(module: nn.Module) -> bool:
    """No module hook, its own or a global one, would run if ``module`` were called."""
    return not (module._forward_pre_hooks or module._forward_hooks or module._backward_pre_hooks
                or module._backward_hooks or any(_GLOBAL_HOOKS))


def _is_plain_linear(linear) -> bool:
    """A plain nn.Linear that no hook watches: F.linear on its weight is exactly its call,
    without Module.__call__'s cost. Anything else (a WeightDrop-style wrapper, a parametrized,
    quantized or adapter linear, a Linear subclass, hooks) is called as a module."""
    return type(linear) is nn.Linear and _unhooked(linear)


def _gemm_weight(linear) -> Optional[Tensor]:
    """The tensor whose dtype and device inputs must have for the gate GEMM: the weight of a
    plain Linear, else the first floating-point parameter or buffer of the module, None
    (unchecked) without one."""
    if type(linear) is nn.Linear:
        return linear.weight
    for t in linear.parameters():
        if t.is_floating_point():
            return t
    for t in linear.buffers():
        if t.is_floating_point():
            return t
    return None


def _check_input(input: Tensor, weight: Optional[Tensor], what: str) -> None:
    """The input has the parameters' dtype (as nn.GRU, unless autocast casts both) and device
    (one device comparison: what torch would otherwise report many frames deep)."""
    if weight is None:
        return
    check_input_dtype(input, weight.dtype)
    if input.device != weight.device:
        raise ValueError(f"input is on {input.device} but the parameters of {what} are on {weight.device}: move "
                         f"the input with input.to({str(weight.device)!r}), or the model with "
                         f"model.to({str(input.device)!r})")


def _check_state_device(state: Tensor, device: torch.device, name: str) -> None:
    if state.device != device:
        raise ValueError(f"{name} is on {state.device} but input is on {device}: pass {name} on the input's device "
                         f"({name}.to({str(device)!r}))")


def _check_packed_call(unbatched: bool, lengths, hx) -> None:
    """What a call with cu_seqlens cannot also have: its input is one 3-D packed row, its
    states a tensor with a row per sequence (each sequence's window starts from zeros)."""
    if unbatched:
        raise ValueError("input with cu_seqlens must be the 3-D packed row (total, 1, input_size) (or (1, total, "
                         "input_size) batch-first), got a 2-D input")
    if lengths is not None:
        raise ValueError("lengths and cu_seqlens: give one or the other, not both")
    if hx is not None and not isinstance(hx, Tensor):
        raise ValueError("hx with cu_seqlens must be a tensor (or None): each packed sequence's input window starts "
                         "from zeros, so a QRNNState's input tails do not apply")


def _describe(x) -> str:
    return f"shape {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__


def _layer_state(c0: Tensor, batch: int, hidden: int, name: str) -> Tensor:
    """A single layer's (batch, hidden) initial state from (1, batch, hidden) or (batch, hidden)."""
    if not isinstance(c0, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(c0).__name__}")
    if c0.dim() == 3 and c0.shape[0] == 1:
        c0 = c0[0]
    if tuple(c0.shape) != (batch, hidden):
        raise ValueError(f"{name} must have shape (1, batch, hidden) = (1, {batch}, {hidden}), got {tuple(c0.shape)}")
    return c0


def _check_tail(tail, window: int, batch: int, features: int, batch_first: bool, name: str,
                device: torch.device) -> Optional[Tensor]:
    """The tail to use (None for window 1, whose tail is empty), or ValueError."""
    expected = (batch, window - 1, features) if batch_first else (window - 1, batch, features)
    if not isinstance(tail, Tensor) or tuple(tail.shape) != expected:
        if window == 1:
            raise ValueError(f"{name}: a window-1 layer carries no input tail (None or an empty {expected} tensor), "
                             f"got {_describe(tail)}")
        raise ValueError(f"{name} must have shape {expected}, got {_describe(tail)}")
    if window == 1:
        return None
    _check_state_device(tail, device, name)
    return tail
