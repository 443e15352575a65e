"""The API of salesforce/pytorch-qrnn (``torchqrnn``) on qrnn's kernels and layers.

Code written for pytorch-qrnn (its README, awd-lstm-lm) runs unedited through the
``torchqrnn`` package, which re-exports this module: ``QRNNLayer`` and ``QRNN`` with
their original signatures and positional orders, ``save_prev_x`` (the last
``window - 1`` inputs kept between calls until ``reset()``), ``use_cuda`` (accepted and
ignored: the device follows the tensors), ``layers=``, the ``hidden=`` keyword, and
``ForgetMult()(f, x, hidden_init=None, use_cuda=True)``. Beyond the original: any
window, zoneout, bidirectional and batch-first stacks, every dtype and device qrnn has.

The classes are subclasses of :class:`qrnn.QRNNLayer` and :class:`qrnn.QRNN`, with the
same state dict keys, so checkpoints move freely between the two APIs.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union, cast

import torch
from torch import Tensor, nn

from . import modules
from .modules import QRNNState
from .ops.forget_mult import forget_mult
from .safe_globals import allow_weights_only

__all__ = ["ForgetMult", "QRNN", "QRNNLayer"]

# torch < 2.5 has no is_exporting: there, any trace (export or compile) keeps no inputs
# (export forbids the module mutation; a compiled model is then as if save_prev_x were off).
_is_exporting = getattr(torch.compiler, "is_exporting", torch.compiler.is_compiling)

_State = Union[Tensor, QRNNState, tuple, None]

# The id of the backward pass running on this thread (-1 outside one): a layer's forward run
# during backward is activation checkpointing recomputing it.
_backward_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)

RECOMPUTED_MESSAGE = (
    "torchqrnn.QRNNLayer(save_prev_x=True) was run again in backward (activation checkpointing recomputes "
    "its forward) after it had kept newer inputs, so the rerun would read inputs other than the first run's "
    "and give wrong gradients. Carry the inputs explicitly instead: save_prev_x=False and the QRNNState a call "
    "returns passed to the next (model(chunk, state) from model.initial_state()), which a rerun reads as given")


def _hidden_keyword(hx: _State, hidden: _State, what: str) -> _State:
    """pytorch-qrnn's ``hidden=`` keyword, the same argument as ``hx``."""
    if hidden is None:
        return hx
    if hx is not None:
        raise TypeError(f"{what} got both hx and hidden (the same argument)")
    return hidden


class QRNNLayer(modules.QRNNLayer):
    """pytorch-qrnn's ``QRNNLayer(input_size, hidden_size=None, save_prev_x=False,
    zoneout=0, window=1, output_gate=True, use_cuda=True)``, plus the keywords ``bias``,
    ``weight_drop``, ``device`` and ``dtype``. Everything else is :class:`qrnn.QRNNLayer`.

    save_prev_x: after each call keep the last ``window - 1`` inputs (detached, in
        ``prevX``) and read them before the next call's first step, until :meth:`reset`.
        ``torch.export`` graphs neither read nor keep them (pass a QRNNState instead).
    use_cuda: accepted and ignored: the device follows the tensors.

    Raises:
        ValueError: as :class:`qrnn.QRNNLayer`, and when the inputs kept by ``save_prev_x``
            do not fit a call's batch (call :meth:`reset` first).
        RuntimeError: when activation checkpointing reruns a ``save_prev_x`` layer in
            backward (the rerun would read other inputs); carry a QRNNState instead.
    """

    def __init__(self, input_size: int, hidden_size: Optional[int] = None, save_prev_x: bool = False,
                 zoneout: float = 0.0, window: int = 1, output_gate: bool = True, use_cuda: bool = True, *,
                 bias: bool = True, weight_drop: float = 0.0, device=None, dtype=None):
        super().__init__(input_size, hidden_size, window, output_gate, zoneout, bias, weight_drop=weight_drop,
                         device=device, dtype=dtype)
        self.save_prev_x = bool(save_prev_x)
        self.use_cuda = bool(use_cuda)
        self.prevX: Optional[Tensor] = None

    def extra_repr(self) -> str:
        """:meth:`qrnn.QRNNLayer.extra_repr`, plus ``save_prev_x=True`` when set."""
        return super().extra_repr() + (", save_prev_x=True" if self.save_prev_x else "")

    def reset(self) -> None:
        """Forget the inputs kept by ``save_prev_x`` (call at the start of a new sequence)."""
        self.prevX = None

    def run(self, input: Tensor, c0: Optional[Tensor] = None, x_tail: Optional[Tensor] = None, *,
            lengths: Optional[Tensor] = None, batch_first: bool = False, reverse: bool = False,
            cu_seqlens: Optional[Tensor] = None) -> tuple:
        """:meth:`qrnn.QRNNLayer.run`, reading and keeping the inputs ``save_prev_x`` carries
        (forward direction only, not across packed sequences; an explicit ``x_tail`` wins over
        the kept one)."""
        carries = (self.save_prev_x and self.window > 1 and not reverse and cu_seqlens is None
                   and not _is_exporting())
        if carries and _backward_task_id() != -1:
            raise RuntimeError(RECOMPUTED_MESSAGE)
        if carries and x_tail is None and self.prevX is not None:
            x_tail = self._kept_inputs(input, batch_first)
        output, c_n, x_tail_n = super().run(input, c0, x_tail, lengths=lengths, batch_first=batch_first,
                                            reverse=reverse, cu_seqlens=cu_seqlens)
        if carries and x_tail_n is not None:
            self.prevX = x_tail_n.detach()
        return output, c_n, x_tail_n

    def _kept_inputs(self, input: Tensor, batch_first: bool) -> Tensor:
        """``prevX``, checked against this call's batch."""
        tail = self.prevX
        assert tail is not None
        batch, features = input.shape[0 if batch_first else 1], input.shape[-1]
        expected = (batch, self.window - 1, features) if batch_first else (self.window - 1, batch, features)
        if tuple(tail.shape) != expected:
            raise ValueError(f"the inputs kept by save_prev_x have shape {tuple(tail.shape)}, this call needs "
                             f"{expected}: call reset() before a new sequence or batch size")
        return tail

    def forward(self, input: Tensor, hx: _State = None, lengths: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None, *, hidden: _State = None):
        """:meth:`qrnn.QRNNLayer.forward`; ``hidden`` is pytorch-qrnn's name for ``hx``
        (TypeError when both are given)."""
        return super().forward(input, _hidden_keyword(hx, hidden, "QRNNLayer.forward"), lengths, cu_seqlens)


class QRNN(modules.QRNN):
    """pytorch-qrnn's ``QRNN(input_size, hidden_size, num_layers=1, bias=True,
    batch_first=False, dropout=0, bidirectional=False, layers=None, **kwargs)``, the
    keywords being those of :class:`QRNNLayer` (``save_prev_x``, ``zoneout``, ``window``
    — an int or one per layer —, ``output_gate``, ``use_cuda``) and ``device``, ``dtype``.
    Everything else is :class:`qrnn.QRNN`.

    layers: ready-made unidirectional :class:`qrnn.QRNNLayer`s to stack (each keeps its own
        window, zoneout, output gate, save_prev_x); their hidden sizes must agree (``h_n``
        stacks them) and each must read the one below.

    Raises:
        ValueError: as :class:`qrnn.QRNN`, and for ``layers`` that are empty, hold anything
            but :class:`qrnn.QRNNLayer` instances, have mismatched sizes, or come with
            ``bidirectional=True``.
    """

    layer_type = QRNNLayer

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 layers: Optional[Sequence[modules.QRNNLayer]] = None, *, window: Union[int, Sequence[int]] = 1,
                 zoneout: float = 0.0, output_gate: bool = True, save_prev_x: bool = False, use_cuda: bool = True,
                 device=None, dtype=None):
        if layers is None:
            super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, window,
                             zoneout, output_gate, device, dtype)
            for layer in self.layers:
                cast(QRNNLayer, layer).save_prev_x = bool(save_prev_x)
        else:
            given = list(layers)
            if not given or not all(isinstance(layer, modules.QRNNLayer) for layer in given):
                raise ValueError("layers must be a non-empty sequence of qrnn.QRNNLayer")
            if bidirectional:
                raise ValueError("layers cannot be combined with bidirectional=True (the given layers are one "
                                 "direction)")
            # The options are checked and recorded once, by qrnn.QRNN: its own layers are built
            # on the meta device (no memory) and replaced by the given ones.
            super().__init__(input_size, hidden_size, len(given), bias, batch_first, dropout, False,
                             [layer.window for layer in given], given[0].zoneout, given[0].output_gate, "meta")
            for i, layer in enumerate(given):
                if layer.hidden_size != self.hidden_size:
                    raise ValueError(f"layers[{i}] has hidden_size {layer.hidden_size}, expected hidden_size = "
                                     f"{self.hidden_size} (h_n stacks every layer's state)")
                expected = self.input_size if i == 0 else self.hidden_size
                if layer.input_size != expected:
                    raise ValueError(f"layers[{i}] has input_size {layer.input_size}, expected {expected}")
            self.layers = nn.ModuleList(given)
        self.use_cuda = bool(use_cuda)

    def reset(self) -> None:
        """Forget the inputs each layer kept with ``save_prev_x`` (a wrapped layer's too)."""
        for module in self.modules():
            if isinstance(module, QRNNLayer):
                module.reset()

    def forward(self, input, hx: _State = None, lengths: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                *, hidden: _State = None):
        """:meth:`qrnn.QRNN.forward`; ``hidden`` is pytorch-qrnn's name for ``hx`` (TypeError
        when both are given)."""
        return super().forward(input, _hidden_keyword(hx, hidden, "QRNN.forward"), lengths, cu_seqlens)


class ForgetMult(nn.Module):
    """pytorch-qrnn's ForgetMult module: ``ForgetMult()(f, x, hidden_init=None,
    use_cuda=True)`` returns ``h[t] = f[t] * x[t] + (1 - f[t]) * h[t-1]`` for every step
    of ``(seq_len, batch, hidden)`` inputs, ``h[-1] = hidden_init`` (``(batch, hidden)``
    or ``(1, batch, hidden)``; zeros when None). :func:`qrnn.forget_mult`, differentiable
    in all three; ``use_cuda`` is accepted and ignored (the device follows the tensors)."""

    def forward(self, f: Tensor, x: Tensor, hidden_init: Optional[Tensor] = None, use_cuda: bool = True) -> Tensor:
        """``h`` for every step (see the class description); raises TypeError or ValueError
        naming a bad argument, as :func:`qrnn.forget_mult` does."""
        if isinstance(hidden_init, Tensor) and hidden_init.dim() == 3 and hidden_init.shape[0] == 1:
            hidden_init = hidden_init[0]  # a layer's (1, batch, hidden) state, as QRNNLayer passed it
        return forget_mult(f, x, hidden_init)


# torch.load(weights_only=True) rebuilds pickled models holding these classes, beside the
# ones qrnn.modules allows (the torchqrnn package docstring lists both sets); entries that a
# user's safe_globals block does not remove.
allow_weights_only([QRNN, QRNNLayer, ForgetMult])
