"""When the eager paths may skip the dispatcher, which route the others take, and how a
device's kernel is registered.

``qrnn.forget_mult`` and ``qrnn.qrnn_gates`` call a native kernel directly only when
:func:`direct_call_allowed` says so (one rule for both families): the op machinery costs
tens of microseconds per call, which dominates small shapes. Every other call goes where
PyTorch's machinery sees it: the custom op (autograd, torch.compile, torch.export, the
TorchScript tracer, modes), or, under torch.func transforms and forward-mode AD, an
``autograd.Function`` around the same op (:func:`use_autograd_function`)."""

from __future__ import annotations

import sys
from typing import Callable, Optional

import torch
from torch import Tensor
from torch.autograd import forward_ad as _forward_ad

torch_function_mode = torch._C._is_torch_function_mode_enabled
dispatch_modes = torch._C._len_torch_dispatch_stack
_tracing_state = torch._C._get_tracing_state
_is_compiling = torch.compiler.is_compiling
# Dynamo folds this one to True while it traces (a plain `return False` otherwise, cheaper than
# is_compiling); the other tracers (AOTAutograd, non-strict export) run under dispatch modes
# with fake tensors, which the direct-call rule refuses anyway.
_is_dynamo_compiling = getattr(torch.compiler, "is_dynamo_compiling", _is_compiling)
# Any torch.func transform (vmap, grad, jvp, ...) running; the peek is the same test on a
# torch without the one-call form.
_functorch_active: Callable[[], bool] = getattr(
    torch._C, "_are_functorch_transforms_active",
    lambda: torch._C._functorch.peek_interpreter_stack() is not None)

LEGACY_ONNX_MESSAGE = (
    "qrnn: torch.onnx.export(..., dynamo=False) (the TorchScript exporter) cannot export qrnn's ops, in any "
    "grad mode: use qrnn.onnx.export(model, args), or torch.onnx.export(model, args, dynamo=True, "
    "custom_translation_table=qrnn.onnx.custom_translation_table())")

DOUBLE_BACKWARD_MESSAGE = (
    "qrnn.{op}: double backward (a gradient of a gradient: create_graph=True then backward again, "
    "torch.autograd.gradgradcheck, torch.func.hessian, jacfwd of jacrev) is not supported; first derivatives "
    "are (backward, torch.func.grad/vjp/jacrev, and forward mode: jvp, jacfwd)")

FORWARD_MODE_MESSAGE = (
    "qrnn.{op}: no forward-mode AD rule (torch.func.jvp, jacfwd, forward_ad dual tensors) on this path; "
    "call qrnn.{op}, which computes the tangent")

FX_MESSAGE = (
    "{what}: torch.fx.symbolic_trace is unsupported for qrnn (its layers and ops check shapes and branch on their "
    "arguments, which FX proxies cannot answer). Use torch.export.export(model, args) or torch.compile, whose "
    "graphs hold the qrnn ops, or trace with a torch.fx.Tracer whose is_leaf_module returns True for "
    "qrnn.QRNN and qrnn.QRNNLayer (they then stay single call_module nodes)")


def direct_call_allowed(a: Tensor, b: Optional[Tensor], c: Optional[Tensor], d: Optional[Tensor], *,
                        _Tensor=Tensor, _compiling=_is_dynamo_compiling, _function_mode=torch_function_mode,
                        _dispatch_modes=dispatch_modes, _functorch=_functorch_active, _tracing=_tracing_state,
                        _forward_ad=_forward_ad, _grad_enabled=torch.is_grad_enabled) -> bool:
    """Whether a call may skip the dispatcher and run the native kernel on ``a``..``d``
    (None where absent): nothing traces it (torch.compile / torch.export, the TorchScript
    tracer, a TorchFunctionMode or TorchDispatchMode, a torch.func transform), nothing
    differentiates it (no tensor that autograd tracks, no forward-mode dual level), and each
    tensor is a plain ``torch.Tensor``: not a subclass (FakeTensor, FX or user subclasses),
    no negative-bit view (e.g. ``complex.conj().imag``: it stores -values, which the op path
    resolves and a raw pointer would not). Meta tensors have no kernel: the caller's lookup
    sends them to the op. Every test here is paid per call: the keyword-only defaults bind
    each lookup once (local names are cheaper than module globals); never pass them."""
    if (_compiling() or _function_mode() or _dispatch_modes() or _functorch()
            or _tracing() is not None or _forward_ad._current_level >= 0):
        return False
    if _grad_enabled():
        return (type(a) is _Tensor and not a.requires_grad and not a.is_neg()
                and (b is None or (type(b) is _Tensor and not b.requires_grad and not b.is_neg()))
                and (c is None or (type(c) is _Tensor and not c.requires_grad and not c.is_neg()))
                and (d is None or (type(d) is _Tensor and not d.requires_grad)))
    return (type(a) is _Tensor and not a.is_neg() and (b is None or (type(b) is _Tensor and not b.is_neg()))
            and (c is None or (type(c) is _Tensor and not c.is_neg())) and (d is None or type(d) is _Tensor))


def use_autograd_function() -> bool:
    """Whether a call that is not direct must go through the family's autograd.Function
    rather than the bare custom op: under torch.func transforms (whose autograd needs a
    setup_context, which custom_op's generated function lacks) and forward-mode AD (custom
    ops carry no tangent rule). Never while compiling or TorchScript tracing, whose graphs
    record the op itself."""
    return (not _is_compiling() and _tracing_state() is None
            and (_functorch_active() or _forward_ad._current_level >= 0))


def forward_mode_active() -> bool:
    """A forward-mode AD level is open (torch.autograd.forward_ad.dual_level, torch.func.jvp, jacfwd)."""
    return _forward_ad._current_level >= 0


def first_derivative_only(op_name: str, backward_op: Callable) -> type[torch.autograd.Function]:
    """A family's backward op as torch.func and forward mode see it (an autograd.Function,
    vmapped through the op's own rule); differentiating it again is refused, as the op's own
    registration (``backward_op.register_autograd(refuse_double_backward(op_name))``) does."""
    refuse = refuse_double_backward(op_name)

    class FirstDerivativeOnly(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(*args):
            return backward_op(*args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        backward = staticmethod(refuse)
        jvp = staticmethod(refuse)

    FirstDerivativeOnly.__name__ = FirstDerivativeOnly.__qualname__ = f"{op_name}_backward_first_derivative_only"
    return FirstDerivativeOnly


def refuse_vmap_of_sequences(op_name: str, lengths, cu_seqlens) -> None:
    """vmap folds the mapped dimension into the batch; a call with sequences has its own
    batch layout (lengths per row, or one packed row), so it is refused rather than misread."""
    if lengths is not None or cu_seqlens is not None:
        raise NotImplementedError(f"{op_name}: vmap over a call with lengths or cu_seqlens is not supported; pack "
                                  "the mapped sequences into cu_seqlens instead")


def refuse_double_backward(op_name: str) -> Callable:
    """A backward (or tangent) rule that raises the double-backward error naming ``op_name``."""
    def refuse(ctx, *grads):
        raise NotImplementedError(DOUBLE_BACKWARD_MESSAGE.format(op=op_name))
    return refuse


def refuse_legacy_onnx() -> None:
    """Raise :data:`LEGACY_ONNX_MESSAGE` under the TorchScript ONNX exporter
    (``dynamo=False``): it traces the custom op into a graph it cannot translate, and a no-grad
    trace would record the kernel's outputs as constants."""
    if _tracing_state() is not None and torch.onnx.is_in_onnx_export():
        raise RuntimeError(LEGACY_ONNX_MESSAGE)


def refuse_fx_proxy(what: str, *args) -> None:
    """A clear error for torch.fx.symbolic_trace, whose proxies stand in for the arguments."""
    if any(isinstance(arg, torch.fx.Proxy) for arg in args):
        raise RuntimeError(FX_MESSAGE.format(what=what))


def register_kernel(op, device: str, check: Callable[..., object], kernel: Callable) -> None:
    """Make ``kernel`` the op's implementation for ``device`` tensors, after ``check`` (the
    op can be called directly, and the kernels take shapes on trust). Registering again
    replaces the previous kernel."""

    def checked(*args):
        check(*args)
        return kernel(*args)

    op.register_kernel(device, checked)
    defer_dynamo_import(op)


def _disable_dynamo_code():
    """The code object of the wrapper ``torch._disable_dynamo`` puts around a function, or
    None on a torch without it."""
    wrap = getattr(torch, "_disable_dynamo", None)
    return None if wrap is None else getattr(wrap(lambda: None), "__code__", None)


_DISABLE_DYNAMO_CODE = _disable_dynamo_code()


def defer_dynamo_import(op) -> None:
    """Keep the custom op's kernels from importing ``torch._dynamo`` (seconds, with sympy and
    DTensor) at their first call while nothing in the process has imported it.

    torch (>= 2.5) wraps each kernel of a ``custom_op`` in ``torch._disable_dynamo``, whose
    first call imports torch._dynamo to build ``torch._dynamo.disable(kernel)`` and keeps it
    as the kernel's ``__dynamo_disable`` attribute. That wrapper only turns Dynamo's frame
    hook off around the kernel, and only torch._dynamo sets that hook: before it is imported
    the kernel runs unwrapped, which is the same call. So each wrapper gets a stand-in
    ``__dynamo_disable`` that calls the kernel while torch._dynamo is not in ``sys.modules``
    and, from the first call after it is, builds the real one and puts it in its own place.
    What the dispatcher, Dynamo and export see is unchanged. A torch whose wrapper looks
    otherwise (or that has none, 2.4) is left as it is."""
    backend_fns = getattr(op, "_backend_fns", None)
    if _DISABLE_DYNAMO_CODE is None or not isinstance(backend_fns, dict):
        return
    for wrapper in backend_fns.values():
        if getattr(wrapper, "__code__", None) is not _DISABLE_DYNAMO_CODE or not wrapper.__closure__:
            continue
        cells = dict(zip(wrapper.__code__.co_freevars, (cell.cell_contents for cell in wrapper.__closure__)))
        fn, recursive = cells.get("fn"), cells.get("recursive")
        if callable(fn) and isinstance(recursive, bool) and getattr(fn, "__dynamo_disable", None) is None:
            setattr(fn, "__dynamo_disable", _until_dynamo_loaded(fn, recursive))


def _until_dynamo_loaded(fn: Callable, recursive: bool) -> Callable:
    def call(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:  # no frame hook can be set: nothing to disable
            return fn(*args, **kwargs)
        import torch._dynamo

        disabled = torch._dynamo.disable(fn, recursive, wrapping=False)
        setattr(fn, "__dynamo_disable", disabled)  # what torch._disable_dynamo would have kept
        return disabled(*args, **kwargs)
    return call


def register_vmap(op, rule: Callable) -> bool:
    """Give the custom op ``op`` a vmap rule (its register_vmap, or torch.library's; the
    getattrs keep a torch without either importable: vmap then uses torch's per-example
    fallback, which is slow but correct). Returns whether it was registered."""
    method = getattr(op, "register_vmap", None)  # a custom_op's own method, where it has one
    if method is not None:
        method(rule)
        return True
    register = getattr(torch.library, "register_vmap", None)
    if register is None:
        return False
    register(op, rule)
    return True


def fold_batch(t: Optional[Tensor], in_dim: Optional[int], size: int, batch_dim: int) -> Optional[Tensor]:
    """A vmapped tensor with its vmapped dimension folded into its ``batch_dim``: the
    vmapped index becomes the slower part of the batch index (unbatched inputs are expanded
    first). None stays None."""
    if t is None:
        return None
    if in_dim is None:
        t = t.unsqueeze(batch_dim).expand(*t.shape[:batch_dim], size, *t.shape[batch_dim:])
    else:
        t = t.movedim(in_dim, batch_dim)
    return t.flatten(batch_dim, batch_dim + 1)


def unfold_batch(t: Tensor, size: int, batch_dim: int) -> Tensor:
    """The inverse of :func:`fold_batch` on an output: its vmapped dimension at ``batch_dim``."""
    return t.unflatten(batch_dim, (size, t.shape[batch_dim] // size))


def _scan_vmap_rule(op_name: str, op, backward: bool) -> Callable:
    """The vmap rule of a scan family's op (forward or backward): its sequences (the tensors
    before ``h0``) and ``h0`` folded into the batch, one call, the results unfolded."""
    schema = getattr(torch.ops.qrnn, f"{op_name}_backward" if backward else op_name).default._schema
    names = tuple(argument.name for argument in schema.arguments)
    state = names.index("h0")
    sequence_args = ("lengths", "cu_seqlens")

    def rule(info, in_dims, *args, **kwargs):
        given = {**dict(zip(names, args)), **kwargs}
        refuse_vmap_of_sequences(op_name, given.get("lengths"), given.get("cu_seqlens"))
        size, batch = info.batch_size, (0 if given["batch_first"] else 1)
        folded = [fold_batch(t, d, size, batch) for t, d in zip(args[:state], in_dims)]
        folded.append(fold_batch(args[state], in_dims[state], size, 0))
        # The flags as given, the (absent) sequences as None.
        flags = [None if name in sequence_args else value for name, value in zip(names[state + 1:], args[state + 1:])]
        named = {name: None if name in sequence_args else value for name, value in kwargs.items()}
        out = op(*folded, *flags, **named)
        if not backward:
            return unfold_batch(out, size, batch), batch
        grad_u, grad_v, grad_h0 = out
        grads = (unfold_batch(grad_u, size, batch), unfold_batch(grad_v, size, batch))
        if args[state] is None:
            return (*grads, grad_h0), (batch, batch, None)
        return (*grads, unfold_batch(grad_h0, size, 0)), (batch, batch, 0)

    return rule


def register_scan_vmap(op_name: str, forward_op, backward_op) -> bool:
    """vmap rules for a scan family's ops (``h = a h + b`` forms, whose kernels take any
    batch): the vmapped dimension joins the batch of the sequences and of ``h0``, so one
    kernel call serves the whole map. Calls with lengths or cu_seqlens are refused. Returns
    whether they were registered (:func:`register_vmap`)."""
    forward = register_vmap(forward_op, _scan_vmap_rule(op_name, forward_op, backward=False))
    backward = register_vmap(backward_op, _scan_vmap_rule(op_name, backward_op, backward=True))
    return forward and backward
