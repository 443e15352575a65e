"""ForgetMult on an NVIDIA GPU: the CUDA kernels against a device-to-device copy of the same
bytes (the memory roofline), float16 against float32, bfloat16 against float16, and float16
against the original one-thread-per-column float32 design (baseline kernels built for this
benchmark only, as qrnn.bench._baseline), and the float16 backward with an expanded grad_h (what
h.sum() hands it) against a dense one. The fused gate kernels' GPU figures are the layer area's
(qrnn.bench.layer.gpu). Every target is a ratio of times measured in this run;
cuda/NOTES.md gives the bytes and bandwidth floor of each shape.

Without a GPU (or without the CUDA kernels in this build) it prints why and returns nothing.
"""

from __future__ import annotations

import traceback

import torch

from .. import ops
from ..ops.core import cuda as ops_cuda
from ..ops.forget_mult import kernels as forget_mult_kernels
from . import forget_mult as forget_mult_bench
from .common import Result, measure_interleaved

try:  # built with the CUDA kernels only
    from . import _baseline  # type: ignore[attr-defined]  # compiled extension, no stub: mypy looks for an attribute
except ImportError:
    _baseline = None

AREA = "cuda"


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _inputs(T, B, H, dtype, device="cuda"):
    f = torch.rand(T, B, H, device=device).to(dtype)
    x = torch.randn(T, B, H, device=device).to(dtype)
    grad = torch.randn(T, B, H, device=device).to(dtype)
    return f, x, grad


def _fwd_bwd(f, x, grad):
    """One forward and backward through the ops, as autograd calls them (no autograd
    bookkeeping, so the figure is the kernels' plus the allocations of their outputs)."""
    h = ops.forget_mult_op(f, x, None, False)
    return ops.forget_mult_backward_op(grad, f, x, h, None, False)


def _gbs(nbytes, seconds):
    return nbytes / seconds / 1e9


def bandwidth(T=512, B=64, H=4096, quick=False) -> list:
    """fwd+bwd against a copy of the same bytes: forward reads f, x and writes h; backward
    reads f, x, h, grad_h and writes grad_f, grad_x: 9 arrays of T*B*H elements."""
    rounds = 3 if quick else 7
    inputs = {dtype: _inputs(T, B, H, dtype) for dtype in (torch.float16, torch.bfloat16, torch.float32)}
    copies = {}
    for dtype in (torch.float16, torch.float32):
        nbytes = 9 * T * B * H * torch.empty(0, dtype=dtype).element_size()
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_()
        copies[dtype] = (nbytes, src, torch.empty_like(src))
    fns = {
        "copy float16": lambda: copies[torch.float16][2].copy_(copies[torch.float16][1]),
        "float16": lambda: _fwd_bwd(*inputs[torch.float16]),
        "bfloat16": lambda: _fwd_bwd(*inputs[torch.bfloat16]),
        "copy float32": lambda: copies[torch.float32][2].copy_(copies[torch.float32][1]),
        "float32": lambda: _fwd_bwd(*inputs[torch.float32]),
    }
    t = measure_interleaved(fns, device="cuda", rounds=rounds, repeat=3 if quick else 5)
    shape = f"T={T} B={B} H={H}"
    results = []
    for dtype in (torch.float16, torch.float32):
        nbytes = copies[dtype][0]
        name, copy = _name(dtype), t[f"copy {_name(dtype)}"]
        fraction = copy / t[name]
        plan = forget_mult_kernels.forward_plan(*inputs[dtype][:1], *inputs[dtype][:2])  # h laid out like f
        results.append(Result(
            AREA, f"{name} fwd+bwd bandwidth vs device copy, {shape}", 100 * fraction, "%", ">= 80%",
            fraction >= 0.8,
            f"qrnn {t[name] * 1e3:.3f} ms = {_gbs(nbytes, t[name]):.0f} GB/s; copy {copy * 1e3:.3f} ms = "
            f"{_gbs(nbytes, copy):.0f} GB/s; forward plan (vector width, chunks) {plan}"))
    speedup = t["float32"] / t["float16"]
    results.append(Result(AREA, f"float16 vs float32 fwd+bwd speed, {shape}", speedup, "x", ">= 1.8x",
                          speedup >= 1.8, f"float16 {t['float16'] * 1e3:.3f} ms, float32 {t['float32'] * 1e3:.3f} ms"))
    slowdown = t["bfloat16"] / t["float16"]
    results.append(Result(AREA, f"bfloat16 time / float16 time fwd+bwd, {shape}", slowdown, "x", "<= 1.1x",
                          slowdown <= 1.1, f"bfloat16 {t['bfloat16'] * 1e3:.3f} ms"))
    return results


class _Baseline:
    """The original design (qrnn.bench._baseline): float32, an output buffer of T + 1 rows
    with h0 in row 0, one thread per column."""

    def __init__(self, f, x, grad):
        self.f, self.x, self.grad = f, x, grad
        T, B, H = f.shape
        self.shape = (T, B, H)
        self.h = torch.zeros(T + 1, B, H, device=f.device)  # row 0: h0 = 0
        self.grad_f, self.grad_x = torch.empty_like(f), torch.empty_like(f)
        self.grad_h0 = torch.empty(B, H, device=f.device)

    def __call__(self):
        device = self.f.device.index
        stream = ops_cuda.current_stream_handle(device)
        _baseline.forget_mult_forward(self.f.data_ptr(), self.x.data_ptr(), self.h.data_ptr(), *self.shape, stream,
                                      device)
        _baseline.forget_mult_backward(self.f.data_ptr(), self.x.data_ptr(), self.h.data_ptr(), self.grad.data_ptr(),
                                       self.grad_f.data_ptr(), self.grad_x.data_ptr(), self.grad_h0.data_ptr(),
                                       *self.shape, stream, device)


def _check_baseline(T, B, H):
    """The baseline must compute what our kernels compute, or its speed means nothing."""
    f, x, grad = _inputs(T, B, H, torch.float32)
    base = _Baseline(f, x, grad)
    base()
    grad_f, grad_x, _ = _fwd_bwd(f, x, grad)
    h = ops.forget_mult_op(f, x, None, False)
    for got, want, what in ((base.h[1:], h, "h"), (base.grad_f, grad_f, "grad_f"), (base.grad_x, grad_x, "grad_x")):
        if not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
            raise RuntimeError(f"baseline kernel disagrees with qrnn on {what}")


def _graph(calls) -> torch.cuda.CUDAGraph:
    """Capture `calls` (each a no-argument callable) in one CUDA graph, after a warm-up."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    keep = []
    with torch.cuda.graph(graph):
        for call in calls:
            keep.append(call())
    graph.keep = keep  # type: ignore[attr-defined]  # outputs stay distinct buffers for every replay
    return graph


def awd_shape(T=70, B=20, H=1550, quick=False) -> list:
    """The AWD-QRNN shape: latency, not bandwidth, decides. Each side is a CUDA graph of
    fwd+bwd over `sets` input sets (more bytes than the L2 cache holds, so every replay
    reads memory, and no launch gaps), timed by replaying it."""
    sets = 8
    _check_baseline(T, B, H)
    half = [_inputs(T, B, H, torch.float16) for _ in range(sets)]
    single = [_inputs(T, B, H, torch.float32) for _ in range(sets)]
    baselines = [_Baseline(*s) for s in single]
    graphs = {
        "float16": _graph([lambda s=s: _fwd_bwd(*s) for s in half]),
        "float32": _graph([lambda s=s: _fwd_bwd(*s) for s in single]),
        "baseline": _graph(baselines),
    }
    with ops_cuda.schedule("serial"):
        graphs["float16 serial"] = _graph([lambda s=s: _fwd_bwd(*s) for s in half])
    with ops_cuda.schedule("chunked"):
        graphs["float16 chunked"] = _graph([lambda s=s: _fwd_bwd(*s) for s in half])
    t = measure_interleaved({k: g.replay for k, g in graphs.items()}, device="cuda",
                            rounds=5 if quick else 9, repeat=5 if quick else 20)
    t = {k: v / sets for k, v in t.items()}
    shape = f"T={T} B={B} H={H}"
    us = {k: f"{v * 1e6:.1f} us" for k, v in t.items()}
    speedup = t["baseline"] / t["float16"]
    plan = forget_mult_kernels.forward_plan(half[0][0], *half[0][:2])  # h laid out like f
    nbytes = 9 * T * B * H * 2
    return [
        Result(AREA, f"float16 vs original float32 design fwd+bwd, {shape}", speedup, "x", ">= 3x", speedup >= 3,
               f"float16 {us['float16']} (plan {plan}, {_gbs(nbytes, t['float16']):.0f} GB/s), "
               f"baseline {us['baseline']}, our float32 {us['float32']}; CUDA graphs"),
        Result(AREA, f"float16 chunked vs serial schedule fwd+bwd, {shape}",
               t["float16 serial"] / t["float16 chunked"], "x", None, None,
               f"serial {us['float16 serial']}, chunked {us['float16 chunked']}, automatic {us['float16']}"),
    ]


def long_narrow(T=16384, B=1, H=512, quick=False) -> list:
    """A long sequence with few columns (streaming, batch 1): where the chunked schedule
    should pay. No target: it shows whether the size rule picks well on this GPU."""
    if quick:
        T = 4096
    f, x, grad = _inputs(T, B, H, torch.float16)
    fns = {}
    for name in ("serial", "chunked", "auto"):
        with ops_cuda.schedule(name):
            fns[name] = _graph([lambda: _fwd_bwd(f, x, grad)]).replay
    t = measure_interleaved(fns, device="cuda", rounds=5 if quick else 9, repeat=5)
    plan = forget_mult_kernels.forward_plan(f, f, x)  # h laid out like f
    return [Result(AREA, f"float16 chunked vs serial schedule fwd+bwd, T={T} B={B} H={H}",
                   t["serial"] / t["chunked"], "x", None, None,
                   f"serial {t['serial'] * 1e6:.0f} us, chunked {t['chunked'] * 1e6:.0f} us, automatic "
                   f"{t['auto'] * 1e6:.0f} us (plan {plan})")]


def broadcast_grad(T=512, B=64, H=4096, quick=False) -> list:
    """The float16 backward of h.sum(): autograd hands it a grad_h expanded with all strides
    0. Each array has its own access width, so the expanded grad_h (one element per pack)
    must not slow the others' 16-byte packs: against a dense grad_h of the same shape."""
    if quick:
        T, B, H = 128, 16, 1024
    f, x, dense = _inputs(T, B, H, torch.float16)
    h = ops.forget_mult_op(f, x, None, False)
    expanded = torch.ones((), dtype=torch.float16, device="cuda").expand(T, B, H)
    fns = {"dense": lambda: ops.forget_mult_backward_op(dense, f, x, h, None, False),
           "expanded": lambda: ops.forget_mult_backward_op(expanded, f, x, h, None, False)}
    t = measure_interleaved(fns, device="cuda", rounds=3 if quick else 7, repeat=3 if quick else 5)
    ratio = t["expanded"] / t["dense"]
    grads = [torch.empty_like(f) for _ in range(2)]
    plans = {k: forget_mult_kernels.backward_plan(grads[0], grads[1], None, g, f, x, h) for k, g in
             (("dense", dense), ("expanded", expanded))}
    return [Result(AREA, f"float16 backward with expanded grad_h (h.sum()) / dense grad_h time, T={T} B={B} H={H}",
                   ratio, "x", "<= 1.1x", ratio <= 1.1,
                   f"expanded {t['expanded'] * 1e3:.3f} ms (plan {plans['expanded']}), dense "
                   f"{t['dense'] * 1e3:.3f} ms (plan {plans['dense']})")]


def eager_overhead(quick=False) -> list:
    """The CPU figure's measure on the GPU: both calls are bound by the CPU side of a launch."""
    ratio, note = forget_mult_bench.eager_call_times("cuda", 1000 if quick else 5000, quick)
    return [Result(AREA, forget_mult_bench.EAGER_FIGURE, ratio, "x", None, None, note)]


def run(quick: bool = False) -> list:
    if not torch.cuda.is_available():
        print("cuda benchmarks skipped: no CUDA GPU here (torch.cuda.is_available() is False)")
        return []
    if not ops_cuda.AVAILABLE or _baseline is None:
        print("cuda benchmarks skipped: this build of qrnn has no CUDA kernels (rebuild with QRNN_CUDA=ON)")
        return []
    big = dict(T=128, B=16, H=1024) if quick else {}
    groups = [("bandwidth", lambda: bandwidth(**big, quick=quick)),
              ("AWD-QRNN shape", lambda: awd_shape(quick=quick)),
              ("long narrow", lambda: long_narrow(quick=quick)),
              ("broadcast grad_h", lambda: broadcast_grad(quick=quick)),
              ("eager overhead", lambda: eager_overhead(quick=quick))]
    results = []
    for name, group in groups:  # one failing group must not lose the others' figures
        try:
            results += group()
        except Exception as exc:  # noqa: BLE001 - reported as a failed figure, traceback printed
            traceback.print_exc()
            results.append(Result(AREA, f"{name}: benchmark failed", float("nan"), "", "runs", False,
                                  f"{type(exc).__name__}: {exc}"[:300]))
    return results
