"""qrnn.linear_scan on the CPU (h[t] = a[t] h[t-1] + b[t]), forward + backward: its share of
a copy of the same bytes next to ForgetMult's (the forget-mult area's measure, both in one
run), against torch's associative_scan under torch.compile (the generic combine of (a, b)
pairs), and bfloat16 storage against float32.

Every figure is a ratio of contenders timed in interleaved rounds; the value is the ratio of
their medians, the note gives the lowest and highest ratio of one round's pair."""

from __future__ import annotations

import inspect
import statistics
import time

import torch

import qrnn

from .common import QUICK_COPY_NOTE, Result, copy_share, format_number, measure_interleaved_samples, round_ratios
from .forget_mult import _fwd_bwd, _inputs, copy_of

AREA = "linear-scan"

# Forward reads a, b and writes h; backward reads a, h, dh and writes da, db.
LINEAR_SCAN_ARRAYS = 8
# ForgetMult's count (qrnn/bench/forget_mult.py): forward f, x -> h; backward f, x, h, dh -> df, dx.
FORGET_MULT_ARRAYS = 9


def combine(left, right):
    """The associative combine of two steps h -> a h + b: left then right."""
    a1, b1 = left
    a2, b2 = right
    return a1 * a2, a2 * b1 + b2


def has_generic_associative_scan() -> bool:
    """Whether this torch's associative_scan takes a generic combine (torch 2.4's has only the
    pointwise one, for CUDA tensors)."""
    try:
        from torch._higher_order_ops.associative_scan import associative_scan
    except ImportError:
        return False
    return "combine_mode" in inspect.signature(associative_scan).parameters


def associative_scan_h(a, b):
    """h of the recurrence (h[-1] = 0) by torch's associative_scan over time (dimension 0)."""
    from torch._higher_order_ops.associative_scan import associative_scan

    return associative_scan(combine, (a, b), dim=0, combine_mode="generic")[1]


def _spread(samples, num, den, scale=1.0, unit="x") -> str:
    _, lo, hi = round_ratios(samples, num, den)
    return f"rounds {format_number(lo * scale)}{unit} to {format_number(hi * scale)}{unit}"


def _result(name, value, unit, target, met, note, quick) -> Result:
    """--quick runs a smaller shape than the targets name: there the figure has no target."""
    if quick:
        return Result(AREA, name, value, unit, None, None, "quick: smaller shape than the target's; " + note)
    return Result(AREA, name, value, unit, target, met, note)


def bandwidth_and_bf16(T, B, H, rounds, quick) -> list:
    """linear_scan float32 and bfloat16, ForgetMult float32 and copies of each one's bytes,
    all in the same interleaved rounds."""
    a, b, grad = _inputs(T, B, H, torch.float32)
    f, x, grad_fm = _inputs(T, B, H, torch.float32)
    a16, b16, grad16 = (t.detach().to(torch.bfloat16).requires_grad_(t.requires_grad) for t in (a, b, grad))
    bytes_ls = LINEAR_SCAN_ARRAYS * a.numel() * a.element_size()
    bytes_fm = FORGET_MULT_ARRAYS * f.numel() * f.element_size()
    bytes_ls16 = LINEAR_SCAN_ARRAYS * a16.numel() * a16.element_size()
    fns = {
        "linear_scan": lambda: _fwd_bwd(qrnn.linear_scan, a, b, grad),
        "copy_ls": copy_of(bytes_ls),
        "forget_mult": lambda: _fwd_bwd(qrnn.forget_mult, f, x, grad_fm),
        "copy_fm": copy_of(bytes_fm),
        "linear_scan_bf16": lambda: _fwd_bwd(qrnn.linear_scan, a16, b16, grad16),
        "copy_ls16": copy_of(bytes_ls16),
    }
    s = measure_interleaved_samples(fns, rounds=rounds, repeat=3)
    t = {k: statistics.median(v) for k, v in s.items()}
    share_ls = copy_share(t["copy_ls"], t["linear_scan"], quick)
    share_fm = copy_share(t["copy_fm"], t["forget_mult"], quick)
    share_ls16 = copy_share(t["copy_ls16"], t["linear_scan_bf16"], quick)
    shape = f"T={T} B={B} H={H}"
    why = QUICK_COPY_NOTE if quick else ""

    def gbs(nbytes, key):
        return f"{t[key] * 1e3:.2f} ms = {nbytes / t[key] / 1e9:.1f} GB/s"

    first = _result(f"linear_scan fwd+bwd bandwidth vs copy, {shape} float32", share_ls, "%",
                    f">= ForgetMult's ({format_number(share_fm)}%)", share_ls >= share_fm,
                    f"{why}linear_scan {gbs(bytes_ls, 'linear_scan')}; copy {gbs(bytes_ls, 'copy_ls')}; "
                    f"{_spread(s, 'copy_ls', 'linear_scan', 100, '%')}", quick)
    first.series = {"op (GB/s)": bytes_ls / t["linear_scan"] / 1e9,
                    "copy roofline (GB/s)": bytes_ls / t["copy_ls"] / 1e9}
    results = [
        first,
        Result(AREA, f"forget_mult fwd+bwd bandwidth vs copy, {shape} float32 (same run)", share_fm, "%",
               note=f"{why}forget_mult {gbs(bytes_fm, 'forget_mult')}; copy {gbs(bytes_fm, 'copy_fm')}; "
                    f"{_spread(s, 'copy_fm', 'forget_mult', 100, '%')}",
               series={"op (GB/s)": bytes_fm / t["forget_mult"] / 1e9,
                       "copy roofline (GB/s)": bytes_fm / t["copy_fm"] / 1e9}),
        Result(AREA, f"linear_scan fwd+bwd bandwidth vs copy, {shape} bfloat16", share_ls16, "%",
               note=f"{why}linear_scan {gbs(bytes_ls16, 'linear_scan_bf16')}; copy {gbs(bytes_ls16, 'copy_ls16')}; "
                    f"{_spread(s, 'copy_ls16', 'linear_scan_bf16', 100, '%')}",
               series={"op (GB/s)": bytes_ls16 / t["linear_scan_bf16"] / 1e9,
                       "copy roofline (GB/s)": bytes_ls16 / t["copy_ls16"] / 1e9}),
    ]
    speedup = t["linear_scan"] / t["linear_scan_bf16"]
    results.append(_result(f"linear_scan bfloat16 vs float32 fwd+bwd, {shape}", speedup, "x", ">= 1.6x",
                           speedup >= 1.6, f"float32 {t['linear_scan'] * 1e3:.2f} ms, bfloat16 "
                           f"{t['linear_scan_bf16'] * 1e3:.2f} ms; {_spread(s, 'linear_scan', 'linear_scan_bf16')}",
                           quick))
    return results


def against_associative_scan(T, B, H, rounds, quick) -> list:
    """qrnn.linear_scan against torch.compile(associative_scan) on the same inputs: h (and the
    gradients) checked to agree first, the compile (first calls) kept out of the timing."""
    a, b, grad = _inputs(T, B, H, torch.float32)
    shape = f"T={T} B={B} H={H} float32"
    scan = torch.compile(associative_scan_h, fullgraph=True, dynamic=False)
    with torch.no_grad():
        ref = qrnn.linear_scan(a, b)
    ref.requires_grad_(False)
    start = time.perf_counter()
    try:
        h = scan(a, b)
        h.backward(grad)
        mode = "fwd+bwd"
    except Exception as exc:  # noqa: BLE001 - whatever the compiler refuses, time what it can
        a.grad = b.grad = None
        with torch.no_grad():
            h = scan(a, b)
        mode = f"forward only (its backward failed under compile: {type(exc).__name__})"
    compile_s = time.perf_counter() - start
    same = torch.allclose(h.detach(), ref, rtol=1e-4, atol=1e-5)
    check = f"h max abs diff {(h.detach() - ref).abs().max().item():.2g}"
    if mode == "fwd+bwd":
        grads = a.grad.clone(), b.grad.clone()
        _fwd_bwd(qrnn.linear_scan, a, b, grad)
        same = same and all(torch.allclose(g, r, rtol=1e-4, atol=1e-5) for g, r in zip(grads, (a.grad, b.grad)))
        check += f", grads max abs diff {max((g - r).abs().max().item() for g, r in zip(grads, (a.grad, b.grad))):.2g}"
        fns = {"linear_scan": lambda: _fwd_bwd(qrnn.linear_scan, a, b, grad),
               "associative_scan": lambda: _fwd_bwd(scan, a, b, grad)}
    else:
        a0, b0 = a.detach(), b.detach()
        fns = {"linear_scan": lambda: qrnn.linear_scan(a0, b0),
               "associative_scan": lambda: scan(a0, b0)}
    s = measure_interleaved_samples(fns, rounds=rounds, repeat=1, warmup=1)
    t = {k: statistics.median(v) for k, v in s.items()}
    speedup = t["associative_scan"] / t["linear_scan"]
    note = (f"{mode}; associative_scan {t['associative_scan'] * 1e3:.1f} ms, linear_scan "
            f"{t['linear_scan'] * 1e3:.2f} ms; {_spread(s, 'associative_scan', 'linear_scan')}; compile (first "
            f"call) {compile_s:.0f} s, untimed; {check} ({'agree' if same else 'DISAGREE'})")
    figure = f"linear_scan {mode.split(' (')[0]} vs torch.compile(associative_scan), generic combine, {shape}"
    return [_result(figure, speedup, "x", ">= 3x", speedup >= 3 and same, note, quick)]


def run(quick: bool = False) -> list:
    if quick:
        # The compile of associative_scan (minutes on a cold cache) would dominate a quick run,
        # CI's smoke test; tests/bench checks the scan it compiles against linear_scan eagerly.
        return bandwidth_and_bf16(16, 4, 256, rounds=3, quick=True)
    results = bandwidth_and_bf16(70, 20, 1550, rounds=9, quick=False)
    if has_generic_associative_scan():
        return results + against_associative_scan(70, 20, 1550, rounds=9, quick=False)
    return results + [Result(AREA, "linear_scan vs torch.compile(associative_scan)", float("nan"), "x", ">= 3x", None,
                             f"not run: torch {torch.__version__}'s associative_scan has no generic combine")]
