"""ForgetMult on the CPU: our kernels against the original per-timestep PyTorch loop and
against a plain copy of the same bytes (the memory roofline), plus eager per-call overhead."""

from __future__ import annotations

import torch

import qrnn

from .. import _C
from ..ops.forget_mult import kernels as forget_mult_kernels
from .common import Result, measure_interleaved

AREA = "forget-mult"


def torch_loop(f, x, h0=None):
    """The original CPU path: one PyTorch expression per time step, autograd through all."""
    h = torch.zeros_like(f[0]) if h0 is None else h0
    out = []
    for t in range(f.shape[0]):
        h = f[t] * x[t] + (1 - f[t]) * h
        out.append(h)
    return torch.stack(out)


def _fwd_bwd(fn, f, x, grad):
    f.grad = x.grad = None
    fn(f, x).backward(grad)


def _kernels_into(outputs, f, x, grad):
    """Forward and backward kernels writing into preallocated outputs (no autograd)."""
    h, grad_f, grad_x = outputs
    threads = torch.get_num_threads()
    _C.forget_mult_forward(*forget_mult_kernels.forward_args(h, f, x, None, False), threads)
    _C.forget_mult_backward(*forget_mult_kernels.backward_args(grad_f, grad_x, None, grad, f, x, h, None, False),
                            threads)


def copy_of(nbytes: int):
    """A copy of ``nbytes`` (half read, half written) into a warm buffer: the roofline that the
    "bandwidth vs copy" figures divide by (also the linear-scan area's)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8).random_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def _inputs(T, B, H, dtype):
    f = torch.rand(T, B, H).to(dtype).requires_grad_()
    x = torch.randn(T, B, H).to(dtype).requires_grad_()
    grad = torch.randn(T, B, H).to(dtype)
    return f, x, grad


def forward_backward(T=70, B=20, H=1550, quick=False) -> list:
    results = []
    rounds = 3 if quick else 9
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        f, x, grad = _inputs(T, B, H, dtype)
        # Forward reads f, x and writes h; backward reads f, x, h, dh and writes df, dx.
        arrays_moved = 9
        nbytes = arrays_moved * f.numel() * f.element_size()
        copy = copy_of(nbytes)
        warm = [torch.empty_like(f) for _ in range(3)]  # h, grad_f, grad_x
        # Default arguments bind this iteration's tensors (the lambdas run within it anyway).
        fns = {
            "qrnn": lambda f=f, x=x, grad=grad: _fwd_bwd(qrnn.forget_mult, f, x, grad),
            "kernels": lambda warm=warm, f=f, x=x, grad=grad: _kernels_into(warm, f.detach(), x.detach(), grad),
            "copy": copy,
        }
        if dtype == torch.float32:
            fns["loop"] = lambda f=f, x=x, grad=grad: _fwd_bwd(torch_loop, f, x, grad)
        t = measure_interleaved(fns, rounds=rounds, repeat=3)
        times[dtype] = t["qrnn"]
        shape = f"T={T} B={B} H={H} {str(dtype).replace('torch.', '')}"
        fraction = (nbytes / t["qrnn"]) / (nbytes / t["copy"])
        note = (f"qrnn {t['qrnn'] * 1e3:.2f} ms = {nbytes / t['qrnn'] / 1e9:.1f} GB/s; "
                f"copy {t['copy'] * 1e3:.2f} ms = {nbytes / t['copy'] / 1e9:.1f} GB/s")
        bandwidth = {"qrnn (GB/s)": nbytes / t["qrnn"] / 1e9, "copy roofline (GB/s)": nbytes / t["copy"] / 1e9}
        if dtype == torch.float32:
            speedup = t["loop"] / t["qrnn"]
            results.append(Result(AREA, f"fwd+bwd vs per-timestep loop, {shape}", speedup, "x", ">= 20x",
                                  speedup >= 20, f"loop {t['loop'] * 1e3:.1f} ms, qrnn {t['qrnn'] * 1e3:.2f} ms"))
            results.append(Result(AREA, f"fwd+bwd bandwidth vs copy, {shape}", 100 * fraction, "%", ">= 70%",
                                  fraction >= 0.7, note, series=bandwidth))
        else:
            results.append(Result(AREA, f"fwd+bwd bandwidth vs copy, {shape}", 100 * fraction, "%", None, None, note,
                                  series=bandwidth))
        # The same kernels writing into warm buffers (as the copy does): the op's remaining
        # time is allocating its three outputs, which page-fault on first touch whenever
        # the allocator has returned the previous call's memory to the OS.
        kernels = t["copy"] / t["kernels"]
        results.append(Result(AREA, f"fwd+bwd kernels into warm outputs vs copy, {shape}", 100 * kernels, "%",
                              None, None, f"kernels {t['kernels'] * 1e3:.2f} ms = {nbytes / t['kernels'] / 1e9:.1f} "
                              "GB/s; the op's extra time is its fresh outputs and autograd"))
    speedup = times[torch.float32] / times[torch.bfloat16]
    results.append(Result(AREA, f"bfloat16 vs float32 fwd+bwd, T={T} B={B} H={H}", speedup, "x", ">= 1.6x",
                          speedup >= 1.6))
    return results


def eager_call_times(device: str, calls: int, quick: bool) -> tuple:
    """(ratio, note): seconds per eager no-grad qrnn.forget_mult call at a tiny shape over
    seconds per torch.addcmul call on the same device, timed interleaved; at this size both
    are bound by the Python and dispatch side of a call (on CUDA, of a launch)."""
    f = torch.rand(1, 1, 128, device=device)
    x = torch.randn(1, 1, 128, device=device)
    a, b, c = (torch.randn(128, device=device) for _ in range(3))

    def loop(fn):
        def run():
            for _ in range(calls):
                fn()
        return run

    with torch.no_grad():
        t = measure_interleaved({"qrnn": loop(lambda: qrnn.forget_mult(f, x)),
                                 "addcmul": loop(lambda: torch.addcmul(a, b, c))},
                                device=device, rounds=3 if quick else 7, repeat=1, warmup=1)
    note = f"qrnn {t['qrnn'] / calls * 1e6:.1f} us, addcmul {t['addcmul'] / calls * 1e6:.1f} us"
    return t["qrnn"] / t["addcmul"], note


EAGER_FIGURE = "eager per-call time vs torch.addcmul, T=1 B=1 H=128, no grad"


def per_call_overhead(quick=False) -> list:
    ratio, note = eager_call_times("cpu", 2000 if quick else 20000, quick)
    return [Result(AREA, EAGER_FIGURE, ratio, "x", "<= 3x", ratio <= 3, note)]


def run(quick: bool = False) -> list:
    shape = dict(T=70, B=20, H=1550)
    return forward_backward(**shape, quick=quick) + per_call_overhead(quick=quick)
