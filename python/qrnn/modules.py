"""QRNN layers: :class:`QRNN`, a drop-in for ``torch.nn.GRU``, and the single-direction
:class:`QRNNLayer`, both on the functional layer :func:`qrnn.functional.qrnn_layer`
(the equations are there).

The carried state is c (before the output gate) and, for window k > 1, the last k - 1
inputs; both travel explicitly (:class:`QRNNState`), never as hidden module state, so
chunked truncated BPTT, ``torch.compile`` and DDP see plain inputs and outputs.

Weights use the layout of salesforce/pytorch-qrnn (``linear.weight`` of shape
``(gates * hidden, window * input)``, gate blocks Z, F, O, window inputs newest
first), so its unidirectional checkpoints load with ``load_state_dict``. Its own API
(inputs kept between calls, ready-made layer lists, its argument orders) is
:mod:`qrnn.pytorch_qrnn`, importable as ``torchqrnn``. How a layer is called and what its
call is given is checked by :mod:`qrnn.layer_calls`.
"""

from __future__ import annotations

import numbers
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence, Union, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .functional import (
    check_cu_seqlens,
    check_lengths,
    check_positive_int,
    check_probability,
    low_precision_dtype,
    qrnn_layer_with,
)
from .layer_calls import (
    _check_input,
    _check_packed_call,
    _check_state_device,
    _check_tail,
    _describe,
    _gemm_weight,
    _is_plain_linear,
    _layer_state,
    _StackedLayerState,
    _unhooked,
)
from .ops.core.dispatch import refuse_fx_proxy
from .ops.core.kernel_args import DTYPE_CODES, state_dtype
from .safe_globals import allow_weights_only

__all__ = ["QRNN", "QRNNLayer", "QRNNState"]


class QRNNState(NamedTuple):
    """Everything a QRNN carries from one chunk of a sequence to the next.

    ``c``: the cell state after the last step, ``(num_layers * num_directions, batch,
    hidden)`` ordered like ``nn.GRU``'s ``h_n``, float32 for 16-bit computation; or None
    for zeros. ``x_tails``: per layer, the last ``window - 1`` inputs of that layer
    (``(window - 1, batch, features)``, batch first when the model is; empty for window 1
    in a returned state), or None for zeros. ``QRNNState()`` is the all-zero start. A
    plain ``(c, x_tails)`` tuple of these fields is accepted wherever a QRNNState is.
    """

    c: Optional[Tensor] = None
    x_tails: tuple = ()

    def detach(self) -> "QRNNState":
        """The same state cut from the autograd graph (truncated BPTT between chunks)."""
        return QRNNState(None if self.c is None else self.c.detach(),
                         tuple(None if t is None else t.detach() for t in self.x_tails))


# ---- Modules ------------------------------------------------------------------------


def _is_plain_layer(layer: nn.Module) -> bool:
    """A layer whose call would only run ``QRNNLayer.forward`` (no hook, not compiled on its
    own with ``layer.compile()``, not a wrapper or a subclass with its own forward): QRNN then
    runs it directly, without Module.__call__'s cost, as calling it would."""
    return (type(layer).forward is QRNNLayer.forward and getattr(layer, "_compiled_call_impl", None) is None
            and _unhooked(layer))


# torch.jit.script calls __prepare_scriptable__ on every module before compiling it.
_SCRIPT_MESSAGE = ("{what}: torch.jit.script cannot compile qrnn's layers (TorchScript cannot compile their "
                   "Python argument handling); use torch.jit.trace (the traced graph records the qrnn ops; load "
                   "it where qrnn is imported), torch.export.export or torch.compile")
if TYPE_CHECKING:
    class _TypedCall(nn.Module):
        """What calling a QRNN layer returns, for type checkers (nn.Module.__call__ says Any)."""

        @overload
        def __call__(self, input: Tensor, hx: Optional[Tensor] = None, lengths: Optional[Tensor] = None,
                     cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor]: ...

        @overload
        def __call__(self, input: Tensor, hx: Union[QRNNState, tuple],
                     lengths: Optional[Tensor] = None) -> tuple[Tensor, QRNNState]: ...

        @overload  # QRNN only
        def __call__(self, input: PackedSequence, hx: Optional[Tensor] = None,
                     lengths: None = None) -> tuple[PackedSequence, Tensor]: ...

        def __call__(self, input, hx=None, lengths=None, cu_seqlens=None): ...
else:
    _TypedCall = nn.Module


class QRNNLayer(_TypedCall):
    """One single-direction QRNN layer, state-dict compatible with
    salesforce/pytorch-qrnn's ``QRNNLayer`` (``linear.weight``, ``linear.bias``).

    Args:
        input_size: features of each input step.
        hidden_size: features of the state and output (default: input_size).
        window: inputs each step reads, x[t], x[t-1], ... (>= 1; pytorch-qrnn allows 1 or 2).
        output_gate: h = sigmoid(O) * c when True (QRNN-fo), h = c when False (QRNN-f).
        zoneout: probability of keeping an element's previous state (see
            :func:`qrnn.functional.qrnn_layer`).
        bias: whether the gate GEMM has a bias.
        weight_drop: DropConnect on the gate weights in training (AWD-LSTM's WeightDrop):
            each forward multiplies ``linear.weight`` by a fresh Bernoulli(1 - p) mask,
            scaled by 1 / (1 - p); one masked copy per call, the fused path kept, the state
            dict unchanged. Nothing in evaluation.

    ``linear`` is called as a module: replace it with any module mapping ``window *
    input_size`` features to the gate pre-activations (a weight-dropped, parametrized,
    quantized or adapter linear); a plain ``nn.Linear`` takes a direct path.

    ``forward(input, hx=None, lengths=None, cu_seqlens=None)`` takes time-major ``(seq_len, batch,
    input_size)`` input (or unbatched ``(seq_len, input_size)``) and returns
    ``(output, h_n)`` with ``h_n`` of shape ``(1, batch, hidden)``, the cell state after
    the last step, like a one-layer ``nn.GRU`` and pytorch-qrnn's ``(H, C[-1:])``. ``hx``
    may be ``(1, batch, hidden)``, ``(batch, hidden)``, or a :class:`QRNNState` (or a
    plain ``(c, x_tails)`` tuple of its fields): then a QRNNState is returned, with the
    input tail for the next chunk. ``lengths`` (``(batch,)`` valid steps per sequence, each
    in ``0..seq_len``) zeroes the outputs past each end and makes ``h_n`` each sequence's
    state after its last valid step. ``cu_seqlens`` (``(N + 1,)`` offsets) runs ``N``
    sequences packed end to end in one ``(total, 1, input_size)`` row, as
    flash-linear-attention lays them out: each sequence starts from its own ``hx`` row (``hx``
    and ``h_n`` are ``(1, N, hidden)``) and its window reads zeros before its first step.

    Raises:
        ValueError: a size or window that is not a positive int, or a ``zoneout`` or
            ``weight_drop`` outside [0, 1) (constructor); from ``forward``, an input, ``hx``
            or ``lengths`` of the wrong shape, dtype or device, naming it.
    """

    def __init__(self, input_size: int, hidden_size: Optional[int] = None, window: int = 1,
                 output_gate: bool = True, zoneout: float = 0.0, bias: bool = True, *, weight_drop: float = 0.0,
                 device=None, dtype=None):
        super().__init__()
        self.input_size = check_positive_int("input_size", input_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size if hidden_size is not None else input_size)
        self.window = check_positive_int("window", window)
        self.output_gate = bool(output_gate)
        self.zoneout = check_probability("zoneout", zoneout)
        self.weight_drop = check_probability("weight_drop", weight_drop)
        gates = 3 if self.output_gate else 2
        self.linear = nn.Linear(self.window * self.input_size, gates * self.hidden_size, bias=bool(bias),
                                device=device, dtype=dtype)

    def extra_repr(self) -> str:
        """The constructor arguments shown in ``repr(layer)``."""
        s = f"{self.input_size}, {self.hidden_size}, window={self.window}, output_gate={self.output_gate}, " \
            f"zoneout={self.zoneout}"
        if self.weight_drop:
            s += f", weight_drop={self.weight_drop}"
        bias = getattr(self.linear, "bias", False)  # a wrapper in place of the Linear may have none
        if bias is None or isinstance(bias, Tensor):
            s += f", bias={bias is not None}"
        return s

    def __prepare_scriptable__(self):
        raise RuntimeError(_SCRIPT_MESSAGE.format(what="qrnn.QRNNLayer"))

    def run(self, input: Tensor, c0: Optional[Tensor] = None, x_tail: Optional[Tensor] = None, *,
            lengths: Optional[Tensor] = None, batch_first: bool = False, reverse: bool = False,
            cu_seqlens: Optional[Tensor] = None) -> tuple:
        """:func:`qrnn.functional.qrnn_layer` with this layer's weights and options:
        ``(output, c_n, x_tail_n)``. :class:`QRNN` calls each of its layers as a module, whose
        ``forward`` then runs this (a subclass may override it to change every call)."""
        linear = self.linear
        # getattr: a layer pickled by a version without weight drop has no such attribute.
        weight_drop = getattr(self, "weight_drop", 0.0) if self.training else 0.0
        if weight_drop or _is_plain_linear(linear):
            if weight_drop and not _is_plain_linear(linear):  # its hooks would be skipped
                raise ValueError(f"weight_drop={weight_drop} needs layer.linear to be a plain nn.Linear without "
                                 f"hooks, got {type(linear).__name__}: drop the weights inside that module instead")
            weight = F.dropout(linear.weight, weight_drop, training=True) if weight_drop else linear.weight
            return qrnn_layer_with(input, None, weight, linear.bias, c0, x_tail, self.window,
                                   self.output_gate, self.zoneout, self.training, lengths, batch_first, reverse,
                                   cu_seqlens)
        return qrnn_layer_with(input, linear, None, None, c0, x_tail, self.window, self.output_gate, self.zoneout,
                               self.training, lengths, batch_first, reverse, cu_seqlens)

    def forward(self, input: Tensor, hx: Union[Tensor, QRNNState, tuple, None] = None,
                lengths: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None):
        """Run the layer over ``input``: ``(output, h_n)``, or ``(output, QRNNState)`` when
        ``hx`` is a state (see the class description for the shapes)."""
        if type(hx) is _StackedLayerState:  # called by QRNN, which checked everything once
            return self.run(input, hx.c0, hx.x_tail, lengths=lengths, batch_first=hx.batch_first,
                            reverse=hx.reverse, **({} if hx.cu_seqlens is None else {"cu_seqlens": hx.cu_seqlens}))
        refuse_fx_proxy("qrnn.QRNNLayer", input, hx)
        if not isinstance(input, Tensor) or input.dim() not in (2, 3):
            raise ValueError("input must be a 3-D tensor (seq_len, batch, input_size) or 2-D (seq_len, input_size), "
                             f"got {_describe(input)}")
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1)
        if input.shape[-1] != self.input_size:
            raise ValueError(f"input must have input_size = {self.input_size} features, got {input.shape[-1]}")
        _check_input(input, _gemm_weight(self.linear), "qrnn.QRNNLayer")
        T, B = input.shape[0], input.shape[1]
        lengths = check_lengths(lengths, B, T, input.device)
        cu_seqlens = check_cu_seqlens(cu_seqlens, B, T, input.device)
        if cu_seqlens is not None:
            _check_packed_call(unbatched, lengths, hx)
            B = cu_seqlens.shape[0] - 1  # the states have a row per packed sequence
        c0: Optional[Tensor]
        x_tail: Optional[Tensor]
        if hx is not None and not isinstance(hx, Tensor):
            state = _as_state(hx, "(1, batch, hidden_size)")
            as_state = True
            c0, x_tail = state.c, (state.x_tails[0] if state.x_tails else None)
        else:
            as_state = False
            c0, x_tail = hx, None
        if c0 is not None:
            if unbatched and not as_state:
                c0 = c0.unsqueeze(-2)
            c0 = _layer_state(c0, B, self.hidden_size, "hx.c" if as_state else "hx")
            _check_state_device(c0, input.device, "hx.c" if as_state else "hx")
        if x_tail is not None:
            x_tail = _check_tail(x_tail, self.window, B, self.input_size, False, "hx.x_tails[0]", input.device)
        # cu_seqlens only when given: a subclass's run() written before it existed keeps working.
        packed_call: dict[str, Any] = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        output, c_n, x_tail_n = self.run(input, c0, x_tail, lengths=lengths, **packed_call)
        if unbatched:
            output = output.squeeze(1)
        if as_state:
            if x_tail_n is None:  # window 1: an empty tail, so the state is all tensors
                x_tail_n = input.new_empty((0, B, self.input_size))
            return output, QRNNState(c_n.unsqueeze(0), (x_tail_n,))
        h_n = c_n.unsqueeze(0)
        if low_precision_dtype(input.device.type) is None:
            h_n = h_n.to(output.dtype)
        return output, (h_n.squeeze(1) if unbatched else h_n)


def _as_state(hx, shape: str = "(num_layers * num_directions, batch, hidden_size)") -> "QRNNState":
    """A QRNNState from a QRNNState or a plain ``(c, x_tails)`` tuple or list of its fields
    (what generic code such as a recursive detach rebuilds from one); `shape`: the state
    tensor's shape, for the message to a caller passing nn.LSTM's ``(h_0, c_0)``."""
    if isinstance(hx, QRNNState):
        return hx
    if (type(hx) in (tuple, list) and len(hx) == 2 and (hx[0] is None or isinstance(hx[0], Tensor))
            and isinstance(hx[1], (tuple, list))):
        return QRNNState(hx[0], tuple(hx[1]))
    if type(hx) in (tuple, list) and len(hx) == 2 and all(isinstance(t, Tensor) for t in hx):
        # Two tensors, not a state's (c, x_tails): nn.LSTM's (h_0, c_0).
        raise ValueError(f"hx must be a single state, got a pair of tensors of shapes {tuple(hx[0].shape)} and "
                         f"{tuple(hx[1].shape)}, like nn.LSTM's (h_0, c_0): a QRNN carries a single state per layer "
                         f"(like nn.GRU), so pass h_0 alone, of shape {shape}, or a qrnn.QRNNState")
    raise ValueError("hx must be a Tensor, a QRNNState, a (c, x_tails) tuple of its fields, or None, "
                     f"got {_describe(hx)}")


class QRNN(_TypedCall):
    """A multi-layer Quasi-Recurrent Neural Network: a drop-in for ``torch.nn.GRU``.

    Same constructor arguments as ``nn.GRU`` plus the QRNN ones, same
    ``forward(input, hx=None) -> (output, h_n)`` with the same shapes, PackedSequence in
    and out, dropout between layers (not after the last), bidirectional layers stacked
    as ``nn.GRU`` stacks them (each layer reads both directions of the layer below).

    Args:
        input_size: features of each input step, as for ``nn.GRU``.
        hidden_size: features of each layer's state and output (per direction).
        num_layers: stacked layers.
        bias: whether the gate GEMMs have biases.
        batch_first: ``(batch, seq_len, features)`` input and output instead of
            ``(seq_len, batch, features)``.
        dropout: dropout between layers (not after the last), in training.
        bidirectional: a reverse direction in every layer.
        window: inputs each step reads (x[t], x[t-1], ...): an int for every layer, or
            one per layer (AWD-QRNN uses ``[2, 1, 1, 1]``).
        zoneout: probability of keeping an element's previous state (training: unscaled
            Bernoulli(1 - p) keep mask on f per element and step; evaluation: f * (1 - p)).
        output_gate: h = sigmoid(O) * c (True) or h = c (False).
        weight_drop: DropConnect on every layer's gate weights in training (see
            :class:`QRNNLayer`; awd-lstm-lm's ``--wdrop``).

    ``forward(input, hx=None, lengths=None, cu_seqlens=None)``:
        input: ``(seq_len, batch, input_size)`` (``(batch, seq_len, input_size)`` with
            ``batch_first``), unbatched ``(seq_len, input_size)``, or a PackedSequence.
        hx: ``(num_layers * num_directions, batch, hidden_size)`` initial cell states, or a
            :class:`QRNNState` or plain ``(c, x_tails)`` tuple of its fields (chunked BPTT:
            then the result's second element is the QRNNState to feed the next chunk, with
            each layer's input tail; an empty tensor for window 1).
        lengths: valid steps per sequence ``(batch,)`` for padded input: outputs past each
            end are zero, ``h_n`` is each sequence's state after its last valid step, and
            the reverse direction starts at each sequence's own end. Need not be sorted.
        cu_seqlens: ``(N + 1,)`` int offsets from 0 to ``total`` for packed input: ``N``
            documents end to end in one row, ``(total, 1, input_size)`` (``(1, total,
            input_size)`` with ``batch_first``), as flash-linear-attention's ``cu_seqlens``.
            Each sequence starts from its own state (``hx`` and ``h_n`` are
            ``(num_layers * num_directions, N, hidden_size)``), no step sees another
            sequence (the window reads zeros before a sequence's first step; the reverse
            direction starts at each sequence's end), and empty sequences keep their ``hx``.

    Returns ``(output, h_n)``: output ``(seq_len, batch, num_directions * hidden_size)`` (or
    a PackedSequence), h_n ``(num_layers * num_directions, batch, hidden_size)``, the cell
    state (before the output gate) after each sequence's last step. Output dtype: the
    input's, or the autocast dtype under ``torch.autocast`` (parameters and the carried
    state stay float32; h_n is then float32).

    Each layer is called as a module (``layers[i](x, hx, lengths)``), so forward hooks on it
    fire, a wrapper put in its place (activation checkpointing) runs, and FSDP2's
    ``fully_shard`` can be applied per layer; a plain layer that nothing hooks is run directly,
    which is the same call without Module.__call__'s cost. Inside the stack, ``hx`` is a record
    of that layer's already-checked state and the stack's layout (fields ``c0``, ``x_tail``,
    ``batch_first``, ``reverse``; ``hx._replace(...)`` changes one), and the layer returns
    :meth:`QRNNLayer.run`'s ``(output, c_n, x_tail_n)``.

    The state dict of a unidirectional model matches salesforce/pytorch-qrnn's ``QRNN``
    (``layers.{i}.linear.weight`` / ``.bias``). Bidirectional models keep layer ``l``
    direction ``d`` at ``layers.{l * 2 + d}``, the index of its state in ``h_n``.

    Raises:
        ValueError: a size or window that is not a positive int (or a window list of the
            wrong length), or a probability outside [0, 1) (constructor); from ``forward``,
            an input, ``hx`` or ``lengths`` of the wrong type, shape, dtype or device, or
            ``lengths`` given with a PackedSequence, naming it.
    """

    # The layer type __init__ stacks (a subclass may stack a subclass of QRNNLayer).
    layer_type: type = QRNNLayer

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 window: Union[int, Sequence[int]] = 1, zoneout: float = 0.0, output_gate: bool = True,
                 device=None, dtype=None, *, weight_drop: float = 0.0):
        super().__init__()
        self.input_size = check_positive_int("input_size", input_size)
        self.hidden_size = check_positive_int("hidden_size", hidden_size)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = check_probability("dropout", dropout)
        self.bidirectional = bool(bidirectional)
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.zoneout = check_probability("zoneout", zoneout)
        self.output_gate = bool(output_gate)
        # int named for the type checker, which does not see int as a numbers.Integral.
        windows = [window] * self.num_layers if isinstance(window, (int, numbers.Integral)) else list(window)
        if len(windows) != self.num_layers:
            raise ValueError(f"window must be an int or one per layer ({self.num_layers}), got {window!r}")
        self.windows = [check_positive_int("window", w) for w in windows]
        directions = 2 if self.bidirectional else 1
        self.layers = nn.ModuleList(
            self.layer_type(self.input_size if layer == 0 else self.hidden_size * directions, self.hidden_size,
                            window=self.windows[layer], output_gate=self.output_gate, zoneout=self.zoneout,
                            bias=self.bias, weight_drop=weight_drop, device=device, dtype=dtype)
            for layer in range(self.num_layers) for _ in range(directions))
        if self.dropout > 0 and self.num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last layer, so non-zero dropout expects "
                          f"num_layers greater than 1, but got dropout={self.dropout} and num_layers=1",
                          stacklevel=2)

    @property
    def num_directions(self) -> int:
        """2 for a bidirectional model, else 1."""
        return 2 if self.bidirectional else 1

    def extra_repr(self) -> str:
        """The constructor arguments shown in ``repr(model)``."""
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s + f", window={self.windows}, zoneout={self.zoneout}, output_gate={self.output_gate}"

    def __prepare_scriptable__(self):
        raise RuntimeError(_SCRIPT_MESSAGE.format(what="qrnn.QRNN"))

    def flatten_parameters(self) -> None:
        """No-op, for code written for cuDNN RNNs (the gate weights are already one GEMM each)."""

    def initial_state(self, batch_size: Optional[int] = None) -> QRNNState:
        """The all-zero carried state (for chunked BPTT: ``model(chunk, model.initial_state())``):
        None fields, or with ``batch_size`` zero tensors (on the parameters' device), which
        generic code that walks nested tuples of tensors (a recursive detach) can handle."""
        if batch_size is None:
            return QRNNState(None, (None,) * self.num_layers)
        batch = check_positive_int("batch_size", batch_size) if batch_size != 0 else 0
        like = next(self.parameters(), None)
        device, dtype = (like.device, like.dtype) if like is not None else (None, torch.get_default_dtype())
        c = torch.zeros(self.num_layers * self.num_directions, batch, self.hidden_size, device=device,
                        dtype=state_dtype(dtype) if dtype in DTYPE_CODES else dtype)
        tails = []
        for layer in range(self.num_layers):
            features = self.input_size if layer == 0 else self.hidden_size * self.num_directions
            steps = self.windows[layer] - 1
            shape = (batch, steps, features) if self.batch_first else (steps, batch, features)
            tails.append(torch.zeros(shape, device=device, dtype=dtype))
        return QRNNState(c, tuple(tails))

    def forward(self, input, hx: Union[Tensor, QRNNState, tuple, None] = None, lengths: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None):
        """Run the stack over ``input``: ``(output, h_n)``, or ``(output, QRNNState)`` when
        ``hx`` is a state (see the class description for the arguments and shapes)."""
        refuse_fx_proxy("qrnn.QRNN", input, hx)
        packed = isinstance(input, PackedSequence)
        if packed:
            if lengths is not None or cu_seqlens is not None:
                raise ValueError("lengths must be None for a PackedSequence input (it carries its own lengths), and "
                                 "so must cu_seqlens")
            sorted_indices, unsorted_indices = input.sorted_indices, input.unsorted_indices
            input, pack_lengths = pad_packed_sequence(input, batch_first=self.batch_first)  # original batch order
            lengths = pack_lengths  # the host copy packing needs, checked below like any lengths
        elif not isinstance(input, Tensor):
            raise ValueError(f"input must be a Tensor or PackedSequence, got {type(input).__name__}")
        if input.dim() not in (2, 3):
            layout = "(batch, seq_len, input_size)" if self.batch_first else "(seq_len, batch, input_size)"
            raise ValueError(f"input must be 3-D {layout} or 2-D (seq_len, input_size), got shape {tuple(input.shape)}")
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1 if not self.batch_first else 0)
        if input.shape[-1] != self.input_size:
            raise ValueError(f"input must have input_size = {self.input_size} features, got {input.shape[-1]}")
        first = self.layers[0]  # a wrapper (checkpoint, user module) in its place may have no `linear`
        _check_input(input, _gemm_weight(getattr(first, "linear", first)), "qrnn.QRNN")
        time_dim = 1 if self.batch_first else 0
        T, B = input.shape[time_dim], input.shape[1 - time_dim]
        lengths = check_lengths(lengths, B, T, input.device)
        cu_seqlens = check_cu_seqlens(cu_seqlens, B, T, input.device)
        if cu_seqlens is not None:
            _check_packed_call(unbatched, lengths, hx)
            B = cu_seqlens.shape[0] - 1  # the states have a row per packed sequence
        as_state = False
        if hx is not None and not isinstance(hx, Tensor):
            hx = _as_state(hx)
            as_state = True
        c0, tails = self._unpack_state(hx, B, unbatched, as_state, input.device)

        D = self.num_directions
        # cu_seqlens only when given: a subclass's run() written before it existed keeps working.
        packed_call: dict[str, Any] = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        # Listed once (indexing a ModuleList costs more than a layer's call); unchecked types: a
        # layer or whatever module was put in its place.
        layers: list = list(self.layers)
        states, new_tails = [], []
        x = input
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(D):
                index = layer * D + direction
                module, tail = layers[index], (tails[layer] if direction == 0 else None)
                layer_c0 = None if c0 is None else c0[index]
                if _is_plain_layer(module):
                    out, c_n, tail = module.run(x, layer_c0, tail, lengths=lengths, batch_first=self.batch_first,
                                                reverse=direction == 1, **packed_call)
                else:  # called as a module: its hooks, any wrapper in its place, FSDP2's unsharding take part
                    out, c_n, tail = module(x, _StackedLayerState(layer_c0, tail, self.batch_first, direction == 1,
                                                                  cu_seqlens), lengths)
                outputs.append(out)
                states.append(c_n)
                if direction == 0:
                    if tail is None and as_state:  # window 1: an empty tail, so the state is all tensors
                        tail = x.new_empty((B, 0, x.shape[-1]) if self.batch_first else (0, B, x.shape[-1]))
                    new_tails.append(tail)
            x = outputs[0] if D == 1 else torch.cat(outputs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        h_n = torch.stack(states)  # never empty: num_layers >= 1

        if packed:
            x = self._pack_like(x, pack_lengths, sorted_indices, unsorted_indices)
        elif unbatched:
            x = x.squeeze(time_dim ^ 1)
        if as_state:
            return x, QRNNState(h_n, tuple(new_tails))
        if low_precision_dtype(input.device.type) is None:
            h_n = h_n.to(x.data.dtype if packed else x.dtype)
        return x, (h_n.squeeze(1) if unbatched else h_n)

    def _unpack_state(self, hx, batch: int, unbatched: bool, as_state: bool, device: torch.device) -> tuple:
        """(c0 of shape (layers * directions, batch, hidden) or None, tails per layer), on the
        input's `device`."""
        expected = (self.num_layers * self.num_directions, batch, self.hidden_size)
        if as_state:
            c0, tails = hx.c, tuple(hx.x_tails) if hx.x_tails else (None,) * self.num_layers
            if len(tails) != self.num_layers:
                raise ValueError(f"hx.x_tails must have one entry per layer ({self.num_layers}), got {len(tails)}")
            checked = []
            for layer, tail in enumerate(tails):
                if tail is not None:
                    features = self.input_size if layer == 0 else self.hidden_size * self.num_directions
                    tail = _check_tail(tail, self.windows[layer], batch, features, self.batch_first,
                                       f"hx.x_tails[{layer}]", device)
                checked.append(tail)
            tails = tuple(checked)
            name = "hx.c"
        else:
            c0, tails, name = hx, (None,) * self.num_layers, "hx"
        if c0 is None:
            return None, tails
        if not isinstance(c0, Tensor):
            raise ValueError(f"{name} must be a Tensor, a QRNNState or None, got {type(c0).__name__}")
        if unbatched and not as_state:
            if c0.dim() != 2:
                raise ValueError(f"{name} must have shape {(expected[0], expected[2])} for unbatched input, "
                                 f"got {tuple(c0.shape)}")
            c0 = c0.unsqueeze(1)
        if tuple(c0.shape) != expected:
            raise ValueError(f"{name} must have shape (num_layers * num_directions, batch, hidden_size) = {expected}, "
                             f"got {tuple(c0.shape)}")
        _check_state_device(c0, device, name)
        return c0, tails

    def _pack_like(self, padded: Tensor, lengths: Tensor, sorted_indices, unsorted_indices) -> PackedSequence:
        """Pack the padded output with the input's batch sizes and orderings."""
        batch_dim = 0 if self.batch_first else 1
        if sorted_indices is not None:
            padded = padded.index_select(batch_dim, sorted_indices)
            lengths = lengths.index_select(0, sorted_indices.cpu())
        data, batch_sizes, _, _ = pack_padded_sequence(padded, lengths.cpu(), batch_first=self.batch_first)
        return PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices)


# torch.load(weights_only=True) rebuilds pickled models holding qrnn layers under the
# allowlist that works for nn.LSTM: qrnn's classes and the torch.nn containers they hold;
# set, because every nn.Module pickles one (_non_persistent_buffers_set) and torch < 2.5
# does not allow it by default. The qrnn package docstring lists what is added: keep both
# in step.
allow_weights_only([QRNN, QRNNLayer, QRNNState, nn.ModuleList, nn.Linear, set])
