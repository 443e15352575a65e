"""Packed sequences (``cu_seqlens``) against dense rows of the same tokens on the CPU, forward
+ backward, for each op family: 20 sequences of 70 steps as one packed row of 1400 steps
against a dense (70, 20) batch, the target <= 1.05x (the packed walk pays only for finding
each sequence's steps). Also random lengths 1..140 packed, against the dense batch padded to
the longest of them, which is what packing saves.

Every figure is a ratio of contenders timed in interleaved rounds; the value is the ratio of
their medians, the note gives the lowest and highest ratio of one round's pair."""

from __future__ import annotations

import torch

import qrnn

from .common import Result, format_number, measure_interleaved_samples, round_ratios

AREA = "sequences"
TARGET = 1.05


def _family_calls(dtype, steps: int, rows: int, hidden: int, cu_seqlens=None, lengths=None):
    """Per family, a forward + backward closure over fresh inputs of (steps, rows, hidden)."""
    gen = torch.Generator().manual_seed(0)
    decay = torch.rand(steps, rows, hidden, generator=gen).to(dtype).requires_grad_()
    value = torch.randn(steps, rows, hidden, generator=gen).to(dtype).requires_grad_()
    gates = torch.randn(steps, rows, 3 * hidden, generator=gen).to(dtype).requires_grad_()
    grad = torch.randn(steps, rows, hidden, generator=gen).to(dtype)
    extra = {"cu_seqlens": cu_seqlens, "lengths": lengths}

    def forget_mult():
        decay.grad = value.grad = None
        qrnn.forget_mult(decay, value, **extra).backward(grad)

    def linear_scan():
        decay.grad = value.grad = None
        qrnn.linear_scan(decay, value, **extra).backward(grad)

    def qrnn_gates():
        gates.grad = None
        qrnn.qrnn_gates(gates, **extra)[0].backward(grad)

    return {"forget_mult": forget_mult, "linear_scan": linear_scan, "qrnn_gates": qrnn_gates}


def _ratio(samples, num, den) -> tuple:
    value, low, high = round_ratios(samples, num, den)
    return value, f"rounds {format_number(low)}x to {format_number(high)}x"


def packed_vs_dense(count: int, steps: int, hidden: int, rounds: int, quick: bool) -> list:
    cu = torch.arange(count + 1, dtype=torch.int64) * steps
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        dense = _family_calls(dtype, steps, count, hidden)
        packed = _family_calls(dtype, steps * count, 1, hidden, cu_seqlens=cu)
        fns = {f"{k}_dense": v for k, v in dense.items()} | {f"{k}_packed": v for k, v in packed.items()}
        samples = measure_interleaved_samples(fns, rounds=rounds, repeat=3)
        for family in dense:
            value, spread = _ratio(samples, f"{family}_packed", f"{family}_dense")
            name = (f"{family} packed {count} x {steps} vs dense ({steps}, {count}), H={hidden}, "
                    f"{str(dtype)[6:]}, fwd+bwd")
            if quick:
                results.append(Result(AREA, name, value, "x", None, None, "quick: smaller shape; " + spread))
            else:
                results.append(Result(AREA, name, value, "x", f"<= {TARGET}x", value <= TARGET, spread))
    return results


def packed_vs_padded(count: int, longest: int, hidden: int, rounds: int) -> list:
    """Random lengths packed against the dense batch padded to the longest (lengths given)."""
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, longest + 1, (count,), generator=gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    padded = _family_calls(torch.float32, int(lengths.max()), count, hidden, lengths=lengths)
    packed = _family_calls(torch.float32, int(cu[-1]), 1, hidden, cu_seqlens=cu)
    fns = {f"{k}_padded": v for k, v in padded.items()} | {f"{k}_packed": v for k, v in packed.items()}
    samples = measure_interleaved_samples(fns, rounds=rounds, repeat=3)
    results = []
    for family in padded:
        value, spread = _ratio(samples, f"{family}_packed", f"{family}_padded")
        results.append(Result(AREA, f"{family} packed vs padded with lengths, {count} sequences of 1..{longest}, "
                              f"H={hidden}, float32, fwd+bwd", value, "x", None, None,
                              f"{int(cu[-1])} real of {count * int(lengths.max())} padded steps; {spread}"))
    return results


def run(quick: bool = False) -> list:
    if quick:
        return packed_vs_dense(4, 8, 64, rounds=3, quick=True)
    return packed_vs_dense(20, 70, 1550, rounds=9, quick=False) + packed_vs_padded(20, 140, 1550, rounds=5)
