"""Every PyTorch transform over qrnn gives the eager answer or a clear error.

A matrix: each transform runs over four subjects (``qrnn.forget_mult``, ``qrnn.qrnn_gates``,
a ``QRNNLayer`` and a 2-layer bidirectional ``QRNN``) and is compared with eager on a fresh
input, never the one a tracer or compiler saw. The table in docs/guide/kernels.md ("PyTorch transforms")
lists the same rows."""

import contextlib
import inspect
import io
import os
import subprocess
import sys

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.func import functional_call, grad, jacfwd, jacrev, jvp, vjp, vmap
from torch.utils.flop_counter import FlopCounterMode

import qrnn
from conftest import TOLERANCES
from qrnn.ops._testing import native_kernels
from qrnn.ops.core.dispatch import register_scan_vmap
from qrnn.ops.forget_mult import kernels as forget_mult_kernels
from qrnn.ops.qrnn_gates import kernels as gate_kernels
from qrnn.ops.qrnn_gates.op import QrnnGatesFunction as _QrnnGates

DT = torch.float64
# torch 2.4 has neither torch.library.register_vmap nor CustomOpDef.register_vmap: vmap runs
# through torch's per-example fallback there (correct, checked by the other vmap tests).
VMAP_RULES = hasattr(torch.library, "register_vmap") or hasattr(qrnn.ops.forget_mult_op, "register_vmap")
ATOL, RTOL = TOLERANCES[DT]
T, B, F, H = 5, 2, 3, 4


def close(actual, expected, atol=ATOL, rtol=RTOL, what=""):
    actual = actual if isinstance(actual, (tuple, list)) else (actual,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    assert len(actual) == len(expected), what
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


class Subject:
    """A function of tensors (``fn``) with the inputs it takes; modules also expose ``module``."""

    module = None

    def __init__(self, dtype=DT):
        self.dtype = dtype

    def inputs(self, batch=B, steps=T):
        raise NotImplementedError

    def fn(self, *args):
        raise NotImplementedError


class ForgetMult(Subject):
    name = "forget_mult"

    def inputs(self, batch=B, steps=T):
        dtype = self.dtype
        return (torch.rand(steps, batch, H, dtype=dtype) * 0.8 + 0.1, torch.randn(steps, batch, H, dtype=dtype),
                torch.randn(batch, H, dtype=dtype))

    def fn(self, f, x, h0):
        return qrnn.forget_mult(f, x, h0)


class QrnnGates(Subject):
    name = "qrnn_gates"

    def inputs(self, batch=B, steps=T):
        dtype = self.dtype
        return torch.randn(steps, batch, 3 * H, dtype=dtype), torch.randn(batch, H, dtype=dtype)

    def fn(self, gates, c0):
        return qrnn.qrnn_gates(gates, c0)


class ModuleSubject(Subject):
    """A module called as ``module(x, hx)``, with ``states`` rows of hx."""

    states = 1

    def __init__(self, dtype=DT):
        super().__init__(dtype)
        self.module = self.build(dtype)

    def build(self, dtype):
        raise NotImplementedError

    def inputs(self, batch=B, steps=T):
        dtype = self.dtype
        return torch.randn(steps, batch, F, dtype=dtype), torch.randn(self.states, batch, H, dtype=dtype)

    def fn(self, x, hx):
        return self.module(x, hx)


class Layer(ModuleSubject):
    name = "QRNNLayer"

    def build(self, dtype):
        return qrnn.QRNNLayer(F, H, window=2, dtype=dtype)


class BiQRNN(ModuleSubject):
    name = "QRNN"
    states = 4

    def build(self, dtype):
        return qrnn.QRNN(F, H, num_layers=2, bidirectional=True, window=[2, 1], dtype=dtype)


SUBJECTS = [ForgetMult, QrnnGates, Layer, BiQRNN]
subjects = pytest.mark.parametrize("make", SUBJECTS, ids=lambda s: s.name)


def leaves(args):
    return tuple(a.detach().clone().requires_grad_(True) for a in args)


def eager_grads(s, args, cotangents):
    args = leaves(args)
    outs = s.fn(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return torch.autograd.grad(outs, args, cotangents)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


# ---- torch.func -----------------------------------------------------------------------------


@contextlib.contextmanager
def counted_kernels():
    """The CPU kernels of both families, counting their calls."""
    calls = {"forget_mult": 0, "qrnn_gates": 0}

    def counting(name, kernel):
        def run(*args, **kwargs):
            calls[name] += 1
            return kernel(*args, **kwargs)
        return run

    with native_kernels("cpu", (counting("forget_mult", forget_mult_kernels.cpu_forward),
                                forget_mult_kernels.cpu_backward),
                        (counting("qrnn_gates", gate_kernels.cpu_forward), gate_kernels.cpu_backward)):
        yield calls


@subjects
@pytest.mark.skipif(not VMAP_RULES, reason=f"torch {torch.__version__} has no register_vmap for custom ops")
def test_vmap_runs_the_kernel_once_on_the_folded_batch(make):
    s = make()
    stacked = [torch.stack(parts) for parts in zip(*(s.inputs() for _ in range(3)))]
    with counted_kernels() as calls:
        got = as_tuple(vmap(s.fn)(*stacked))
    per_example = [as_tuple(s.fn(*(t[i] for t in stacked))) for i in range(3)]
    close(got, [torch.stack(outs) for outs in zip(*per_example)], what="vmap")
    kernel_calls = calls["forget_mult"] + calls["qrnn_gates"]
    directions = 4 if make is BiQRNN else 1
    assert kernel_calls == directions, f"{calls}: a per-example loop would call the kernels 3 times as often"


@subjects
def test_vmap_with_unbatched_arguments(make):
    s = make()
    first, *rest = s.inputs()
    batched = torch.stack([first, torch.randn_like(first)])
    got = as_tuple(vmap(s.fn, in_dims=(0,) + (None,) * len(rest))(batched, *rest))
    for i in range(2):
        close([g[i] for g in got], as_tuple(s.fn(batched[i], *rest)), what=f"example {i}")


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("output_gate", [False, True])
def test_vmap_rules_cover_every_option(batch_first, output_gate):
    """Per-sample gradients through both ops with every option: lengths, zoneout mask and
    scale, reverse, layout, no output gate (an empty states output), forget_mult without h0."""
    gates_per = (3 if output_gate else 2) * H
    shape = (B, T) if batch_first else (T, B)
    gates = torch.randn(3, *shape, gates_per, dtype=DT)
    mask = torch.randint(0, 2, (3, *shape, H)).to(DT)
    lengths = torch.tensor([T, 2])
    f, x = torch.rand(3, *shape, H, dtype=DT), torch.randn(3, *shape, H, dtype=DT)

    def gates_loss(g, m):
        out, c_n = qrnn.qrnn_gates(g, output_gate=output_gate, forget_mask=m, forget_scale=0.7, lengths=lengths,
                                   batch_first=batch_first, reverse=True)
        return out.square().sum() + c_n.sum()

    def forget_mult_loss(f, x):
        return qrnn.forget_mult(f, x, batch_first=batch_first).square().sum()

    for loss, (a, b) in ((gates_loss, (gates, mask)), (forget_mult_loss, (f, x))):
        got = vmap(grad(loss))(a, b)
        for i in range(3):
            leaf = a[i].clone().requires_grad_(True)
            close(got[i], torch.autograd.grad(loss(leaf, b[i]), leaf)[0], what=f"{loss.__name__} sample {i}")


@subjects
def test_grad_vjp_jacrev_match_autograd(make):
    s = make()
    args = s.inputs()
    outs = as_tuple(s.fn(*args))
    cotangents = tuple(torch.randn_like(o) for o in outs)
    want = eager_grads(s, args, cotangents)

    def loss(*a):
        return sum((o * c).sum() for o, c in zip(as_tuple(s.fn(*a)), cotangents))

    close(grad(loss, argnums=tuple(range(len(args))))(*args), want, what="grad")
    _, pullback = vjp(lambda *a: as_tuple(s.fn(*a)), *args)
    close(pullback(cotangents), want, what="vjp")
    jac = jacrev(lambda a: as_tuple(s.fn(a, *args[1:]))[0])(args[0])
    eager_jac = torch.autograd.functional.jacobian(lambda a: as_tuple(s.fn(a, *args[1:]))[0], args[0])
    close(jac, eager_jac, what="jacrev")


@subjects
def test_per_sample_gradients(make):
    """vmap of grad (functorch's per-sample gradients) against one autograd call per sample."""
    s = make()
    samples = [s.inputs(batch=1) for _ in range(3)]
    stacked = [torch.stack(parts) for parts in zip(*samples)]

    def loss(*a):
        return as_tuple(s.fn(*a))[0].square().sum()

    got = vmap(grad(loss))(*stacked)
    for i, sample in enumerate(samples):
        a = leaves(sample)
        close(got[i], torch.autograd.grad(loss(*a), a[0])[0], what=f"sample {i}")


@subjects
def test_forward_mode_matches_reverse_mode(make):
    """jvp, jacfwd and forward_ad dual tensors: <u, J v> = <J^T u, v>, and jacfwd = jacrev."""
    s = make()
    args = s.inputs()
    tangents = tuple(torch.randn_like(a) for a in args)
    outs, out_tangents = jvp(lambda *a: as_tuple(s.fn(*a)), args, tangents)
    close(outs, as_tuple(s.fn(*args)), what="jvp primal")
    cotangents = tuple(torch.randn_like(o) for o in outs)
    lhs = sum((c * t).sum() for c, t in zip(cotangents, out_tangents))
    rhs = sum((g * t).sum() for g, t in zip(eager_grads(s, args, cotangents), tangents))
    close(lhs, rhs, what="<u, Jv> vs <J^T u, v>")
    with fwAD.dual_level():
        duals = [fwAD.make_dual(a, t) for a, t in zip(args, tangents)]
        dual_tangents = [fwAD.unpack_dual(o).tangent for o in as_tuple(s.fn(*duals))]
    assert all(t is not None for t in dual_tangents), "a dual tensor's tangent was dropped"
    close(dual_tangents, out_tangents, what="forward_ad")

    def first(a):
        return as_tuple(s.fn(a, *args[1:]))[0]

    close(jacfwd(first)(args[0]), jacrev(first)(args[0]), what="jacfwd vs jacrev")


def test_forward_mode_of_every_forget_mult_input_and_layout():
    """The tangent rule on each input alone, with and without h0, in both layouts."""
    for batch_first in (False, True):
        for with_h0 in (False, True):
            f, x, h0 = ForgetMult().inputs()
            if batch_first:
                f, x = f.transpose(0, 1), x.transpose(0, 1)
            args = (f, x, h0) if with_h0 else (f, x)

            def fn(*a, batch_first=batch_first):
                return qrnn.forget_mult(*a, batch_first=batch_first)

            for i in range(len(args)):
                tangents = tuple(torch.randn_like(a) if j == i else torch.zeros_like(a) for j, a in enumerate(args))
                _, tangent = jvp(fn, args, tangents)
                cotangent = torch.randn_like(tangent)
                a = leaves(args)
                pulled = torch.autograd.grad(fn(*a), a[i], cotangent)[0]
                close((cotangent * tangent).sum(), (pulled * tangents[i]).sum(), what=f"input {i} {batch_first}")


@pytest.mark.parametrize("make", [Layer, BiQRNN], ids=lambda s: s.name)
def test_functional_call(make):
    s = make()
    x, hx = s.inputs()
    params = {k: torch.randn_like(v) for k, v in s.module.named_parameters()}
    got = functional_call(s.module, params, (x, hx))
    with torch.no_grad():
        for k, v in s.module.named_parameters():
            v.copy_(params[k])
    close(got, s.fn(x, hx), what="functional_call")
    grads = grad(lambda p: functional_call(s.module, p, (x, hx))[0].sum())(params)
    s.module.zero_grad()
    s.fn(x, hx)[0].sum().backward()
    close([grads[k] for k in params], [p.grad for p in s.module.parameters()], what="grad of params")


@subjects
def test_double_backward_is_refused_clearly(make):
    s = make()
    args = leaves(s.inputs())
    out = as_tuple(s.fn(*args))[0]
    (g,) = torch.autograd.grad(out.square().sum(), args[0], create_graph=True)
    with pytest.raises(NotImplementedError, match=r"qrnn\.\w+: double backward"):
        g.sum().backward()
    with pytest.raises(NotImplementedError, match=r"qrnn\.\w+: double backward"):
        torch.autograd.gradgradcheck(s.fn, leaves(s.inputs()))
    with pytest.raises(NotImplementedError, match=r"qrnn\.\w+: double backward"):
        torch.func.hessian(lambda a: as_tuple(s.fn(a, *args[1:]))[0].sum())(args[0].detach())


def test_forward_mode_never_reaches_the_fused_gates_function():
    """qrnn_gates sends forward mode to its unfused form; the fused function refuses it clearly."""
    gates = torch.randn(T, B, 3 * H, dtype=DT)
    with pytest.raises(NotImplementedError, match=r"qrnn\.qrnn_gates: no forward-mode AD rule"):
        jvp(lambda g: _QrnnGates.apply(g, None, None, None, 1.0, True, False, False)[0], (gates,), (gates,))
    # Registering again replaces the rule (where this torch has vmap rules for custom ops).
    assert register_scan_vmap("forget_mult", qrnn.ops.forget_mult_op, qrnn.ops.forget_mult_backward_op) == VMAP_RULES


# ---- legacy tracers ---------------------------------------------------------------------------


def grad_modes():
    return pytest.mark.parametrize("mode", ["grad", "no_grad", "frozen"])


@contextlib.contextmanager
def in_mode(mode, module):
    """grad: parameters require grad; no_grad: torch.no_grad(); frozen: parameters need no grad."""
    if mode == "frozen" and module is not None:
        module.requires_grad_(False)
    with torch.no_grad() if mode == "no_grad" else contextlib.nullcontext():
        yield


@subjects
@grad_modes()
def test_jit_trace_records_the_qrnn_ops(make, mode, tmp_path):
    s = make(torch.float32)
    args = s.inputs()
    traced_fn = s.module if s.module is not None else s.fn
    with in_mode(mode, s.module):
        traced = torch.jit.trace(traced_fn, args, check_trace=False)
    assert "qrnn::" in str(traced.graph), "the trace recorded the kernel's outputs instead of the op"
    fresh = s.inputs()
    with torch.no_grad():
        want = as_tuple(s.fn(*fresh))
        close(as_tuple(traced(*fresh)), want, *TOLERANCES[torch.float32], what="traced")
    if s.module is None or mode != "no_grad":  # one round trip per module: a process start each
        return
    path = os.path.join(tmp_path, "traced.pt")
    torch.jit.save(traced, path)
    inputs = os.path.join(tmp_path, "inputs.pt")
    torch.save((fresh, want), inputs)
    code = ("import sys, torch, qrnn\n"
            f"m = torch.jit.load({path!r}); (args, want) = torch.load({inputs!r})\n"
            "got = m(*args)\n"
            "for g, w in zip(got, want): torch.testing.assert_close(g, w, atol=2e-5, rtol=2e-5)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("make", [Layer, BiQRNN], ids=lambda s: s.name)
def test_jit_script_is_refused_clearly(make):
    with pytest.raises(RuntimeError, match=r"qrnn\.QRNN\w*: torch\.jit\.script cannot compile .* torch\.jit\.trace"):
        torch.jit.script(make().module)


class _Holder(torch.nn.Module):
    """A user module holding a qrnn subject (the TorchScript exporter's common case)."""

    def __init__(self, s):
        super().__init__()
        self.s = s
        self.inner = s.module
        self.arity = len(s.inputs())
        self.multi = isinstance(s.fn(*s.inputs()), tuple)  # known before tracing: FX proxies cannot say

    def forward(self, a, b, c=None):  # named arguments: FX cannot trace *args
        out = self.s.fn(*((a, b, c) if self.arity == 3 else (a, b)))
        return out[0] if self.multi else out


@subjects
@pytest.mark.parametrize("mode", ["grad", "no_grad", "frozen", "inference_mode"])
def test_legacy_onnx_export_is_refused_in_every_grad_mode(make, mode):
    s = make(torch.float32)
    holder = _Holder(s)
    args = s.inputs()
    context = torch.inference_mode() if mode == "inference_mode" else in_mode(mode, s.module)
    # torch < 2.5 has no dynamo argument: its default is the TorchScript exporter.
    legacy = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    with context, pytest.raises(RuntimeError, match=r"qrnn\.onnx\.export"):
        torch.onnx.export(holder, args, io.BytesIO(), **legacy)


@subjects
def test_fx_symbolic_trace_is_refused_clearly(make):
    s = make()
    target = s.module if s.module is not None else _Holder(s)
    with pytest.raises(RuntimeError, match=r"qrnn\.\w+: torch\.fx\.symbolic_trace is unsupported .*torch\.export"):
        torch.fx.symbolic_trace(target)


@pytest.mark.parametrize("make", [Layer, BiQRNN], ids=lambda s: s.name)
def test_fx_tracer_with_qrnn_leaves(make):
    class LeafTracer(torch.fx.Tracer):
        def is_leaf_module(self, m, name):
            return isinstance(m, (qrnn.QRNN, qrnn.QRNNLayer)) or super().is_leaf_module(m, name)

    s = make()
    holder = _Holder(s)
    graph_module = torch.fx.GraphModule(holder, LeafTracer().trace(holder))
    assert any(n.op == "call_module" and n.target == "inner" for n in graph_module.graph.nodes)
    fresh = s.inputs()
    close(graph_module(*fresh), holder(*fresh), what="fx leaf")


# ---- everything else users apply to modules ------------------------------------------------------


@subjects
@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing(make, use_reentrant):
    s = make()
    args = s.inputs()
    outs = as_tuple(s.fn(*args))
    cotangents = tuple(torch.randn_like(o) for o in outs)
    want = eager_grads(s, args, cotangents)
    a = leaves(args)
    got_outs = as_tuple(torch.utils.checkpoint.checkpoint(s.fn, *a, use_reentrant=use_reentrant))
    torch.autograd.backward(got_outs, cotangents)  # the reentrant form supports backward(), not grad()
    close([t.grad for t in a], want, what="checkpoint")


@subjects
def test_inference_mode_and_anomaly_detection(make):
    s = make()
    args = s.inputs()
    with torch.no_grad():
        want = as_tuple(s.fn(*args))
    with torch.inference_mode():
        close(as_tuple(s.fn(*args)), want, what="inference_mode")
    outs = as_tuple(s.fn(*args))
    cotangents = tuple(torch.randn_like(o) for o in outs)
    want_grads = eager_grads(s, args, cotangents)
    with torch.autograd.detect_anomaly():
        close(eager_grads(s, args, cotangents), want_grads, what="anomaly detection")


@subjects
def test_flop_counter_counts_the_gemms(make):
    s = make()
    args = s.inputs()
    with torch.no_grad():
        want = as_tuple(s.fn(*args))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        got = as_tuple(s.fn(*args))
    close(got, want, what="under FlopCounterMode")
    if s.module is not None:
        gemm_flops = sum(2 * T * B * p.shape[0] * p.shape[1] for n, p in s.module.named_parameters()
                         if n.endswith("weight"))
        assert counter.get_total_flops() >= gemm_flops


@subjects
def test_fake_tensor_mode_and_meta_device(make):
    s = make()
    args = s.inputs()
    want = as_tuple(s.fn(*args))
    with FakeTensorMode():  # shape inference: the module and its inputs built under the mode
        fake = make()
        got = as_tuple(fake.fn(*fake.inputs()))
    assert all(isinstance(g, FakeTensor) for g in got)
    assert [(g.shape, g.dtype) for g in got] == [(w.shape, w.dtype) for w in want]
    if s.module is not None:
        s.module.to("meta")
    meta = as_tuple(s.fn(*(a.to("meta") for a in args)))
    assert [(m.shape, m.dtype, m.device.type) for m in meta] == [(w.shape, w.dtype, "meta") for w in want]


@subjects
def test_deterministic_algorithms(make):
    s = make()
    args = s.inputs()
    want = as_tuple(s.fn(*args))
    outs_cot = tuple(torch.randn_like(o) for o in want)
    want_grads = eager_grads(s, args, outs_cot)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            close(as_tuple(s.fn(*args)), want, atol=0, rtol=0, what="deterministic")
            close(eager_grads(s, args, outs_cot), want_grads, atol=0, rtol=0, what="deterministic grads")
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.slow
@subjects
def test_torch_compile_fullgraph_with_and_without_grad_and_dynamic_shapes(make):
    torch._dynamo.reset()
    s = make()
    compiled = torch.compile(s.fn, fullgraph=True, dynamic=True, backend="aot_eager")
    trace_args = s.inputs()
    with torch.no_grad():
        compiled(*trace_args)
    for batch, steps in ((3, 7), (1, 2)):  # fresh inputs, other shapes
        fresh = s.inputs(batch=batch, steps=steps)
        with torch.no_grad():
            close(as_tuple(compiled(*fresh)), as_tuple(s.fn(*fresh)), what=f"no grad {batch}x{steps}")
        a = leaves(fresh)
        outs = as_tuple(compiled(*a))
        cotangents = tuple(torch.randn_like(o) for o in outs)
        close(torch.autograd.grad(outs, a, cotangents), eager_grads(s, fresh, cotangents), what="grad")


@pytest.mark.slow
def test_torch_export_and_aot_inductor():
    """torch.export of the bidirectional QRNN, compiled by AOTInductor and run in this process."""
    aoti_compile = getattr(torch._inductor, "aoti_compile_and_package", None)
    if aoti_compile is None:
        pytest.skip(f"torch {torch.__version__} has no torch._inductor.aoti_compile_and_package")
    s = BiQRNN(torch.float32)
    s.module.eval()
    args = s.inputs()
    program = torch.export.export(s.module, args)
    assert any("qrnn" in str(n.target) for n in program.graph.nodes)
    fresh = s.inputs()
    with torch.no_grad():
        want = s.fn(*fresh)
    close(program.module()(*fresh), want, *TOLERANCES[torch.float32], what="exported")
    package = aoti_compile(program)
    loaded = torch._inductor.aoti_load_package(package)
    close(loaded(*fresh), want, *TOLERANCES[torch.float32], what="AOTInductor")
