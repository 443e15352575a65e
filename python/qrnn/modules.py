"""QRNN layers: :class:`QRNN`, a drop-in for ``torch.nn.GRU``, the single-direction
:class:`QRNNLayer`, and the functional form :func:`qrnn_layer` they are built on.

A QRNN layer with window k computes, for each step t,

    G = W [x[t], x[t-1], ..., x[t-k+1]] + b,   split into Z, F, O (in that order)
    z = tanh(Z), f = sigmoid(F), o = sigmoid(O)
    c[t] = f * z + (1 - f) * c[t-1]
    h[t] = o * c[t]        (or c[t] without the output gate)

with one GEMM for every step at once, then the fused pointwise kernel
(:func:`qrnn.ops.qrnn_gates`) reading G where the GEMM wrote it. The carried state is
c (before the output gate) and, for k > 1, the last k - 1 inputs; both travel
explicitly (:class:`QRNNState`), never as hidden module state, so chunked truncated
BPTT, ``torch.compile`` and DDP see plain inputs and outputs.

Weights use the layout of salesforce/pytorch-qrnn (``linear.weight`` of shape
``(gates * hidden, window * input)``, gate blocks Z, F, O, window inputs newest
first), so its unidirectional checkpoints load with ``load_state_dict``.
"""

from __future__ import annotations

import numbers
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence, Union, cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as _module_mod
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from . import ops
from .ops._dispatch import refuse_fx_proxy
from .ops.kernel_args import DTYPE_CODES, HALF_DTYPES, state_dtype

__all__ = ["QRNN", "QRNNLayer", "QRNNState", "qrnn_layer"]


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


# ---- The functional layer -----------------------------------------------------------


def _low_precision_dtype(device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype when autocast is on for this device, else None."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type without autocast, e.g. meta (shape inference, deferred init)
        return None
    return torch.get_autocast_dtype(device_type) if enabled else None


def _check_input_dtype(input: Tensor, dtype: Optional[torch.dtype]) -> None:
    # As nn.GRU: the input has the parameters' dtype, unless autocast casts both (None: a
    # module in place of the Linear without floating-point parameters checks for itself).
    if dtype is not None and input.dtype != dtype and _low_precision_dtype(input.device.type) is None:
        raise ValueError(f"input must have the type {dtype} (the parameters'), got type {input.dtype}")


def _window_inputs(x: Tensor, x_tail: Optional[Tensor], window: int, lengths: Optional[Tensor],
                   time_dim: int, reverse: bool) -> tuple:
    """``concat(x[t], x[t-1], ..., x[t-window+1])`` on the feature axis (one copy), and the
    new input tail. In reverse the previous inputs are x[t+1], ..., zero past each end."""
    T = x.shape[time_dim]
    pad_shape = list(x.shape)
    pad_shape[time_dim] = window - 1
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


def qrnn_layer(input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, c0: Optional[Tensor] = None,
               x_tail: Optional[Tensor] = None, *, window: int = 1, output_gate: bool = True,
               zoneout: float = 0.0, training: bool = False, lengths: Optional[Tensor] = None,
               batch_first: bool = False, reverse: bool = False) -> tuple:
    """One direction of one QRNN layer, functional: state in, state out.

    Args:
        input: ``(seq_len, batch, input_size)``, or ``(batch, seq_len, input_size)`` with
            ``batch_first``.
        weight, bias: ``(gates * hidden, window * input_size)`` and ``(gates * hidden,)``
            (gates = 3 with the output gate, else 2), blocks Z, F, O.
        c0: initial cell state ``(batch, hidden)`` or None for zeros.
        x_tail: the ``window - 1`` inputs before ``input`` (oldest first, in input's
            layout), or None for zeros. Ignored in reverse, where the inputs "before"
            a step are the ones after it, zero past the sequence's end.
        window: how many inputs each step reads (>= 1).
        zoneout: probability p of keeping an element's previous state: in training f is
            multiplied by an unscaled Bernoulli(1 - p) mask per element and step, at
            evaluation by 1 - p.
        lengths: int64 ``(batch,)`` valid steps per sequence (values already checked).
        reverse: walk each sequence from its own last valid step back to step 0.

    Returns:
        ``(output, c_n, x_tail_n)``: the output in the GEMM's dtype (the autocast dtype
        under autocast), ``c_n`` each sequence's state after its last valid step (float32
        for 16-bit), and the input tail to pass to the next chunk (None for window 1 or
        in reverse).
    """
    return _qrnn_layer(input, None, weight, bias, c0, x_tail, window, output_gate, zoneout, training, lengths,
                       batch_first, reverse)


def _qrnn_layer(input: Tensor, linear: Optional[nn.Module], weight: Optional[Tensor], bias: Optional[Tensor],
                c0: Optional[Tensor], x_tail: Optional[Tensor], window: int, output_gate: bool, zoneout: float,
                training: bool, lengths: Optional[Tensor], batch_first: bool, reverse: bool) -> tuple:
    """:func:`qrnn_layer`, the GEMM being ``F.linear(source, weight, bias)`` when ``linear`` is
    None, else ``linear(source)`` (any module: a weight-dropped, parametrized, quantized or
    adapter linear), whose output the fused gate kernel then reads."""
    window = _check_positive_int("window", window)
    zoneout = _check_probability("zoneout", zoneout)
    time_dim = 1 if batch_first else 0
    if window > 1:
        low = _low_precision_dtype(input.device.type)
        if low is not None and input.dtype == torch.float32:
            input = input.to(low)  # the GEMM casts anyway: cast once, before the window copy
        source, x_tail_n = _window_inputs(input, x_tail, window, lengths, time_dim, reverse)
    else:
        source, x_tail_n = input, None
    # Callers pass weight whenever linear is None (the checker cannot relate the two).
    gates = F.linear(source, weight, bias) if linear is None else linear(source)  # type: ignore[arg-type]
    if c0 is not None and c0.dtype != gates.dtype and not (gates.dtype in HALF_DTYPES
                                                             and c0.dtype == torch.float32):
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
                                 reverse=reverse)
    return output, c_n, x_tail_n


# ---- Argument checks ----------------------------------------------------------------


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_probability(name: str, value) -> float:
    # typeshed's numbers.Real has no comparison with float (it holds at runtime for every Real).
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:  # type: ignore[operator]
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return float(value)


def _check_lengths(lengths, batch: int, seq_len: int, device: torch.device) -> Optional[Tensor]:
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


# ---- Modules ------------------------------------------------------------------------


# Module hooks that a direct F.linear would skip (the global dicts are mutated in place, never
# rebound, so these references stay current; getattr: not every torch version has each one).
_GLOBAL_HOOKS = tuple(getattr(_module_mod, name, {}) for name in (
    "_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks", "_global_backward_hooks"))


def _is_plain_linear(linear) -> bool:
    """A plain nn.Linear that no hook watches: F.linear on its weight is exactly its call,
    without Module.__call__'s cost. Anything else (a WeightDrop-style wrapper, a parametrized,
    quantized or adapter linear, a Linear subclass, hooks) is called as a module."""
    return (type(linear) is nn.Linear and not (linear._forward_pre_hooks or linear._forward_hooks
                                               or linear._backward_pre_hooks or linear._backward_hooks)
            and not any(_GLOBAL_HOOKS))


def _gemm_dtype(linear) -> Optional[torch.dtype]:
    """The dtype inputs must have for the gate GEMM: the weight's for a plain Linear, else the
    first floating-point parameter or buffer of the module, None (unchecked) without one."""
    if type(linear) is nn.Linear:
        return linear.weight.dtype
    for t in linear.parameters():
        if t.is_floating_point():
            return t.dtype
    for t in linear.buffers():
        if t.is_floating_point():
            return t.dtype
    return None


# torch < 2.5 has no is_exporting: there, any trace (export or compile) keeps no inputs
# (export forbids the module mutation; a compiled model is then as if save_prev_x were off).
_is_exporting = getattr(torch.compiler, "is_exporting", torch.compiler.is_compiling)

# torch.jit.script calls __prepare_scriptable__ on every module before compiling it.
_SCRIPT_MESSAGE = ("{what}: torch.jit.script cannot compile qrnn's layers (TorchScript cannot compile their "
                   "Python argument handling); use torch.jit.trace (the traced graph records the qrnn ops; load "
                   "it where qrnn is imported), torch.export.export or torch.compile")

class _Default:
    """A keyword's default that also tells whether the caller passed the keyword (the two
    positional orders need that); shown as its value by help() and inspect.signature."""

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


_UNSET = object()  # an attribute a wrapper in place of the Linear may lack
# Positional order of today's QRNNLayer after (input_size, hidden_size), and of pytorch-qrnn's
# (its third argument, save_prev_x, is a bool, which is never a valid window).
_LAYER_ORDER = ("window", "output_gate", "zoneout", "bias")
_ORIGINAL_LAYER_ORDER = ("save_prev_x", "zoneout", "window", "output_gate", "use_cuda")
_LAYER_DEFAULTS: dict[str, Any] = {name: _Default(value) for name, value in
                   dict(window=1, output_gate=True, zoneout=0.0, bias=True, save_prev_x=False, use_cuda=True).items()}


if TYPE_CHECKING:
    class _TypedCall(nn.Module):
        """What calling a QRNN layer returns, for type checkers (nn.Module.__call__ says Any)."""

        @overload
        def __call__(self, input: Tensor, hx: Optional[Tensor] = None, lengths: Optional[Tensor] = None, *,
                     hidden: Optional[Tensor] = None) -> tuple[Tensor, Tensor]: ...

        @overload
        def __call__(self, input: Tensor, hx: Union[QRNNState, tuple], lengths: Optional[Tensor] = None, *,
                     hidden: None = None) -> tuple[Tensor, QRNNState]: ...

        @overload  # QRNN only
        def __call__(self, input: PackedSequence, hx: Optional[Tensor] = None, lengths: None = None, *,
                     hidden: Optional[Tensor] = None) -> tuple[PackedSequence, Tensor]: ...

        def __call__(self, input, hx=None, lengths=None, *, hidden=None): ...
else:
    _TypedCall = nn.Module


class QRNNLayer(_TypedCall):
    """One single-direction QRNN layer, state-dict compatible with
    salesforce/pytorch-qrnn's ``QRNNLayer`` (``linear.weight``, ``linear.bias``).

    ``QRNNLayer(input_size, hidden_size=None, window=1, output_gate=True, zoneout=0.0,
    bias=True, *, save_prev_x=False, use_cuda=True, device=None, dtype=None)``; the
    pytorch-qrnn order ``QRNNLayer(input_size, hidden_size, save_prev_x, zoneout, window,
    output_gate, use_cuda)`` is accepted too (recognised by a bool third argument).

    Args:
        input_size: features of each input step.
        hidden_size: features of the state and output (default: input_size).
        window: inputs each step reads, x[t], x[t-1], ... (>= 1; pytorch-qrnn had 1 or 2).
        output_gate: h = sigmoid(O) * c when True (QRNN-fo), h = c when False (QRNN-f).
        zoneout: probability of keeping an element's previous state (see :func:`qrnn_layer`).
        bias: whether the gate GEMM has a bias.
        save_prev_x: pytorch-qrnn's stateful carry: after each call keep the last
            ``window - 1`` inputs (detached) and read them before the next call's first
            step, until :meth:`reset`. Without it the carry travels in a :class:`QRNNState`.
            (``torch.export`` graphs neither read nor keep them: pass a QRNNState instead.)
        use_cuda: accepted for pytorch-qrnn code and ignored: the device follows the tensors.

    ``linear`` is called as a module: replace it with any module mapping ``window *
    input_size`` features to the gate pre-activations (a weight-dropped, parametrized,
    quantized or adapter linear); a plain ``nn.Linear`` takes a direct path.

    ``forward(input, hx=None, lengths=None)`` takes time-major ``(seq_len, batch,
    input_size)`` input (or unbatched ``(seq_len, input_size)``) and returns
    ``(output, h_n)`` with ``h_n`` of shape ``(1, batch, hidden)``, the cell state after
    the last step, like a one-layer ``nn.GRU`` and pytorch-qrnn's ``(H, C[-1:])``. ``hx``
    may be ``(1, batch, hidden)``, ``(batch, hidden)``, or a :class:`QRNNState` (or a
    plain ``(c, x_tails)`` tuple of its fields): then a QRNNState is returned, with the
    input tail for the next chunk.
    """

    # Class-level defaults: layers pickled before these attributes existed still run.
    save_prev_x = False
    prevX = None
    use_cuda = True

    def __init__(self, input_size: int, hidden_size: Optional[int] = None, *args,
                 window: int = _LAYER_DEFAULTS["window"], output_gate: bool = _LAYER_DEFAULTS["output_gate"],
                 zoneout: float = _LAYER_DEFAULTS["zoneout"], bias: bool = _LAYER_DEFAULTS["bias"],
                 save_prev_x: bool = _LAYER_DEFAULTS["save_prev_x"], use_cuda: bool = _LAYER_DEFAULTS["use_cuda"],
                 device=None, dtype=None):
        super().__init__()
        options = dict(window=window, output_gate=output_gate, zoneout=zoneout, bias=bias,
                       save_prev_x=save_prev_x, use_cuda=use_cuda)
        order = _ORIGINAL_LAYER_ORDER if args and isinstance(args[0], bool) else _LAYER_ORDER
        if len(args) > len(order):
            raise TypeError(f"QRNNLayer takes at most {2 + len(order)} positional arguments in this order "
                            f"(input_size, hidden_size, {', '.join(order)}), got {2 + len(args)}")
        for name, value in zip(order, args):
            if not isinstance(options[name], _Default):
                raise TypeError(f"QRNNLayer got multiple values for argument '{name}'")
            options[name] = value
        options = {k: v.value if isinstance(v, _Default) else v for k, v in options.items()}
        self.input_size = _check_positive_int("input_size", input_size)
        self.hidden_size = _check_positive_int("hidden_size", hidden_size if hidden_size is not None else input_size)
        self.window = _check_positive_int("window", options["window"])
        self.output_gate = bool(options["output_gate"])
        self.zoneout = _check_probability("zoneout", options["zoneout"])
        self.save_prev_x = bool(options["save_prev_x"])
        self.use_cuda = bool(options["use_cuda"])
        self.prevX = None
        gates = 3 if self.output_gate else 2
        self.linear = nn.Linear(self.window * self.input_size, gates * self.hidden_size, bias=bool(options["bias"]),
                                device=device, dtype=dtype)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, window={self.window}, output_gate={self.output_gate}, " \
            f"zoneout={self.zoneout}"
        bias = getattr(self.linear, "bias", _UNSET)  # a wrapper in place of the Linear may have none
        if bias is None or isinstance(bias, Tensor):
            s += f", bias={bias is not None}"
        return s + (", save_prev_x=True" if self.save_prev_x else "")

    def reset(self) -> None:
        """Forget the inputs kept by ``save_prev_x`` (call at the start of a new sequence)."""
        self.prevX = None

    def __prepare_scriptable__(self):
        raise RuntimeError(_SCRIPT_MESSAGE.format(what="qrnn.QRNNLayer"))

    def run(self, input: Tensor, c0: Optional[Tensor] = None, x_tail: Optional[Tensor] = None, *,
            lengths: Optional[Tensor] = None, batch_first: bool = False, reverse: bool = False) -> tuple:
        """:func:`qrnn_layer` with this layer's weights and options: ``(output, c_n, x_tail_n)``.
        (``save_prev_x`` is applied by ``forward`` and :class:`QRNN`, not here.)"""
        linear = self.linear
        if _is_plain_linear(linear):
            return _qrnn_layer(input, None, linear.weight, linear.bias, c0, x_tail, self.window, self.output_gate,
                               self.zoneout, self.training, lengths, batch_first, reverse)
        return _qrnn_layer(input, linear, None, None, c0, x_tail, self.window, self.output_gate, self.zoneout,
                           self.training, lengths, batch_first, reverse)

    def _saved_tail(self, batch: int, features: int, batch_first: bool) -> Optional[Tensor]:
        """The inputs ``save_prev_x`` kept, checked against this call's batch."""
        tail = self.prevX
        if tail is not None and _is_exporting():
            return None  # an exported graph is a pure function: no inputs baked in from an earlier call
        if tail is not None:
            expected = (batch, self.window - 1, features) if batch_first else (self.window - 1, batch, features)
            if tuple(tail.shape) != expected:
                raise ValueError(f"the inputs kept by save_prev_x have shape {tuple(tail.shape)}, this call needs "
                                 f"{expected}: call reset() before a new sequence or batch size")
        return tail

    def _keep_tail(self, tail: Optional[Tensor]) -> None:
        if self.save_prev_x and self.window > 1 and tail is not None and not _is_exporting():
            self.prevX = tail.detach()

    def forward(self, input: Tensor, hx: Union[Tensor, QRNNState, tuple, None] = None,
                lengths: Optional[Tensor] = None, *, hidden: Union[Tensor, QRNNState, tuple, None] = None):
        refuse_fx_proxy("qrnn.QRNNLayer", input, hx, hidden)
        if hidden is not None:  # pytorch-qrnn's name for hx
            if hx is not None:
                raise TypeError("QRNNLayer.forward got both hx and hidden (the same argument)")
            hx = hidden
        if not isinstance(input, Tensor) or input.dim() not in (2, 3):
            raise ValueError("input must be a 3-D tensor (seq_len, batch, input_size) or 2-D (seq_len, input_size), "
                             f"got {_describe(input)}")
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1)
        if input.shape[-1] != self.input_size:
            raise ValueError(f"input must have input_size = {self.input_size} features, got {input.shape[-1]}")
        _check_input_dtype(input, _gemm_dtype(self.linear))
        T, B = input.shape[0], input.shape[1]
        lengths = _check_lengths(lengths, B, T, input.device)
        c0: Optional[Tensor]
        x_tail: Optional[Tensor]
        if hx is not None and not isinstance(hx, Tensor):
            state = _as_state(hx)
            as_state = True
            c0, x_tail = state.c, (state.x_tails[0] if state.x_tails else None)
        else:
            as_state = False
            c0, x_tail = hx, None
        if c0 is not None:
            if unbatched and not as_state:
                c0 = c0.unsqueeze(-2)
            c0 = _layer_state(c0, B, self.hidden_size, "hx.c" if as_state else "hx")
        if x_tail is not None:
            x_tail = _check_tail(x_tail, self.window, B, self.input_size, False, "hx.x_tails[0]")
        elif self.save_prev_x and self.window > 1:
            x_tail = self._saved_tail(B, self.input_size, False)
        output, c_n, x_tail_n = self.run(input, c0, x_tail, lengths=lengths)
        if self.save_prev_x:
            self._keep_tail(x_tail_n)
        if unbatched:
            output = output.squeeze(1)
        if as_state:
            if x_tail_n is None:  # window 1: an empty tail, so the state is all tensors
                x_tail_n = input.new_empty((0, B, self.input_size))
            return output, QRNNState(c_n.unsqueeze(0), (x_tail_n,))
        h_n = c_n.unsqueeze(0)
        if _low_precision_dtype(input.device.type) is None:
            h_n = h_n.to(output.dtype)
        return output, (h_n.squeeze(1) if unbatched else h_n)


def _as_state(hx) -> "QRNNState":
    """A QRNNState from a QRNNState or a plain ``(c, x_tails)`` tuple or list of its fields
    (what generic code such as a recursive detach rebuilds from one)."""
    if isinstance(hx, QRNNState):
        return hx
    if (type(hx) in (tuple, list) and len(hx) == 2 and (hx[0] is None or isinstance(hx[0], Tensor))
            and isinstance(hx[1], (tuple, list))):
        return QRNNState(hx[0], tuple(hx[1]))
    raise ValueError("hx must be a Tensor, a QRNNState, a (c, x_tails) tuple of its fields, or None, "
                     f"got {_describe(hx)}")


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


def _check_tail(tail, window: int, batch: int, features: int, batch_first: bool, name: str) -> Optional[Tensor]:
    """The tail to use (None for window 1, whose tail is empty), or ValueError."""
    expected = (batch, window - 1, features) if batch_first else (window - 1, batch, features)
    if not isinstance(tail, Tensor) or tuple(tail.shape) != expected:
        if window == 1:
            raise ValueError(f"{name}: a window-1 layer carries no input tail (None or an empty {expected} tensor), "
                             f"got {_describe(tail)}")
        raise ValueError(f"{name} must have shape {expected}, got {_describe(tail)}")
    return tail if window > 1 else None


class QRNN(_TypedCall):
    """A multi-layer Quasi-Recurrent Neural Network: a drop-in for ``torch.nn.GRU``.

    Same constructor arguments as ``nn.GRU`` plus the QRNN ones, same
    ``forward(input, hx=None) -> (output, h_n)`` with the same shapes, PackedSequence in
    and out, dropout between layers (not after the last), bidirectional layers stacked
    as ``nn.GRU`` stacks them (each layer reads both directions of the layer below).

    Args:
        input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional:
            as for ``nn.GRU``.
        window: inputs each step reads (x[t], x[t-1], ...): an int for every layer, or
            one per layer (AWD-QRNN uses ``[2, 1, 1, 1]``).
        zoneout: probability of keeping an element's previous state (training: unscaled
            Bernoulli(1 - p) keep mask on f per element and step; evaluation: f * (1 - p)).
        output_gate: h = sigmoid(O) * c (True) or h = c (False).
        layers: pytorch-qrnn's list of ready-made unidirectional :class:`QRNNLayer`s to
            stack (each keeps its own window, zoneout, output gate, save_prev_x); their
            hidden sizes must agree (``h_n`` stacks them) and each must read the one below.
        save_prev_x: each layer keeps its last ``window - 1`` inputs between calls, as in
            pytorch-qrnn, until :meth:`reset`. use_cuda: accepted and ignored.

    ``forward(input, hx=None, lengths=None)``:
        input: ``(seq_len, batch, input_size)`` (``(batch, seq_len, input_size)`` with
            ``batch_first``), unbatched ``(seq_len, input_size)``, or a PackedSequence.
        hx: ``(num_layers * num_directions, batch, hidden_size)`` initial cell states, or a
            :class:`QRNNState` or plain ``(c, x_tails)`` tuple of its fields (chunked BPTT:
            then the result's second element is the QRNNState to feed the next chunk, with
            each layer's input tail; an empty tensor for window 1).
        lengths: valid steps per sequence ``(batch,)`` for padded input: outputs past each
            end are zero, ``h_n`` is each sequence's state after its last valid step, and
            the reverse direction starts at each sequence's own end. Need not be sorted.

    Returns ``(output, h_n)``: output ``(seq_len, batch, num_directions * hidden_size)`` (or
    a PackedSequence), h_n ``(num_layers * num_directions, batch, hidden_size)``, the cell
    state (before the output gate) after each sequence's last step. Output dtype: the
    input's, or the autocast dtype under ``torch.autocast`` (parameters and the carried
    state stay float32; h_n is then float32).

    The state dict of a unidirectional model matches salesforce/pytorch-qrnn's ``QRNN``
    (``layers.{i}.linear.weight`` / ``.bias``). Bidirectional models keep layer ``l``
    direction ``d`` at ``layers.{l * 2 + d}``, the index of its state in ``h_n``.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 window: Union[int, Sequence[int]] = 1, zoneout: float = 0.0, output_gate: bool = True,
                 device=None, dtype=None, *, layers: Optional[Sequence[QRNNLayer]] = None,
                 save_prev_x: bool = False, use_cuda: bool = True):
        super().__init__()
        if layers is None and isinstance(window, (list, tuple, nn.ModuleList)) and window \
                and all(isinstance(w, nn.Module) for w in window):
            layers, window = window, 1  # pytorch-qrnn's eighth positional argument: layers
        self.input_size = _check_positive_int("input_size", input_size)
        self.hidden_size = _check_positive_int("hidden_size", hidden_size)
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = _check_probability("dropout", dropout)
        self.bidirectional = bool(bidirectional)
        self.use_cuda = bool(use_cuda)
        if layers is not None:
            self._init_from_layers(list(layers))
        else:
            self.num_layers = _check_positive_int("num_layers", num_layers)
            self.zoneout = _check_probability("zoneout", zoneout)
            self.output_gate = bool(output_gate)
            # int named for the type checker, which does not see int as a numbers.Integral.
            windows = [window] * self.num_layers if isinstance(window, (int, numbers.Integral)) else list(window)
            if len(windows) != self.num_layers:
                raise ValueError(f"window must be an int or one per layer ({self.num_layers}), got {window!r}")
            self.windows = [_check_positive_int("window", w) for w in windows]
            directions = 2 if self.bidirectional else 1
            self.layers = nn.ModuleList(
                QRNNLayer(self.input_size if layer == 0 else self.hidden_size * directions, self.hidden_size,
                          window=self.windows[layer], output_gate=self.output_gate, zoneout=self.zoneout,
                          bias=self.bias, save_prev_x=save_prev_x, device=device, dtype=dtype)
                for layer in range(self.num_layers) for _ in range(directions))
        if self.dropout > 0 and self.num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last layer, so non-zero dropout expects "
                          f"num_layers greater than 1, but got dropout={self.dropout} and num_layers=1",
                          stacklevel=2)

    def _init_from_layers(self, layers: list) -> None:
        if not layers or not all(isinstance(layer, QRNNLayer) for layer in layers):
            raise ValueError("layers must be a non-empty sequence of qrnn.QRNNLayer")
        if self.bidirectional:
            raise ValueError("layers cannot be combined with bidirectional=True (the given layers are one direction)")
        for i, layer in enumerate(layers):
            if layer.hidden_size != self.hidden_size:
                raise ValueError(f"layers[{i}] has hidden_size {layer.hidden_size}, expected hidden_size = "
                                 f"{self.hidden_size} (h_n stacks every layer's state)")
            expected = self.input_size if i == 0 else self.hidden_size
            if layer.input_size != expected:
                raise ValueError(f"layers[{i}] has input_size {layer.input_size}, expected {expected}")
        self.num_layers = len(layers)
        self.windows = [layer.window for layer in layers]
        self.zoneout = layers[0].zoneout  # for extra_repr; each layer applies its own
        self.output_gate = layers[0].output_gate
        self.layers = nn.ModuleList(layers)

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def extra_repr(self) -> str:
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

    def reset(self) -> None:
        """Forget the inputs each layer kept with ``save_prev_x`` (pytorch-qrnn's reset)."""
        for layer in self.layers:
            cast(QRNNLayer, layer).reset()

    def initial_state(self, batch_size: Optional[int] = None) -> QRNNState:
        """The all-zero carried state (for chunked BPTT: ``model(chunk, model.initial_state())``):
        None fields, or with ``batch_size`` zero tensors (on the parameters' device), which
        generic code that walks nested tuples of tensors (a recursive detach) can handle."""
        if batch_size is None:
            return QRNNState(None, (None,) * self.num_layers)
        batch = _check_positive_int("batch_size", batch_size) if batch_size != 0 else 0
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
                *, hidden: Union[Tensor, QRNNState, tuple, None] = None):
        refuse_fx_proxy("qrnn.QRNN", input, hx, hidden)
        if hidden is not None:  # pytorch-qrnn's name for hx
            if hx is not None:
                raise TypeError("QRNN.forward got both hx and hidden (the same argument)")
            hx = hidden
        packed = isinstance(input, PackedSequence)
        if packed:
            if lengths is not None:
                raise ValueError("lengths must be None for a PackedSequence input (it carries its own lengths)")
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
        _check_input_dtype(input, _gemm_dtype(self.layers[0].linear))
        time_dim = 1 if self.batch_first else 0
        T, B = input.shape[time_dim], input.shape[1 - time_dim]
        lengths = _check_lengths(lengths, B, T, input.device)
        as_state = False
        if hx is not None and not isinstance(hx, Tensor):
            hx = _as_state(hx)
            as_state = True
        c0, tails = self._unpack_state(hx, B, unbatched, as_state)

        D = self.num_directions
        states, new_tails = [], []
        x = input
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(D):
                index = layer * D + direction
                # A local annotation costs nothing at run time (ModuleList items are typed Module).
                module: QRNNLayer = self.layers[index]  # type: ignore[assignment]
                tail = tails[layer] if direction == 0 else None
                if tail is None and direction == 0 and module.save_prev_x and module.window > 1:
                    tail = module._saved_tail(B, x.shape[-1], self.batch_first)
                out, c_n, tail = module.run(x, None if c0 is None else c0[index], tail, lengths=lengths,
                                            batch_first=self.batch_first, reverse=direction == 1)
                outputs.append(out)
                states.append(c_n)
                if direction == 0:
                    if module.save_prev_x:
                        module._keep_tail(tail)
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
        if _low_precision_dtype(input.device.type) is None:
            h_n = h_n.to(x.data.dtype if packed else x.dtype)
        return x, (h_n.squeeze(1) if unbatched else h_n)

    def _unpack_state(self, hx, batch: int, unbatched: bool, as_state: bool) -> tuple:
        """(c0 of shape (layers * directions, batch, hidden) or None, tails per layer)."""
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
                                       f"hx.x_tails[{layer}]")
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
        return c0, tails

    def _pack_like(self, padded: Tensor, lengths: Tensor, sorted_indices, unsorted_indices) -> PackedSequence:
        """Pack the padded output with the input's batch sizes and orderings."""
        batch_dim = 0 if self.batch_first else 1
        if sorted_indices is not None:
            padded = padded.index_select(batch_dim, sorted_indices)
            lengths = lengths.index_select(0, sorted_indices.cpu())
        data, batch_sizes, _, _ = pack_padded_sequence(padded, lengths.cpu(), batch_first=self.batch_first)
        return PackedSequence(data, batch_sizes, sorted_indices, unsorted_indices)


def _register_safe_globals() -> None:
    """Let ``torch.load(weights_only=True)`` rebuild pickled models holding qrnn layers under
    the allowlist that works for nn.LSTM: register qrnn's classes and the torch.nn containers
    they hold (torch >= 2.4 has add_safe_globals; older versions load with weights_only=False)."""
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is not None:
        # set: every nn.Module pickles one (_non_persistent_buffers_set); torch < 2.5 does
        # not allow it by default.
        add_safe_globals([QRNN, QRNNLayer, QRNNState, nn.ModuleList, nn.Linear, set])


_register_safe_globals()
