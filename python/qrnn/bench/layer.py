"""The QRNN layer, forward + backward: against its own gate GEMMs alone (the bound: the
rest is memory-bound), against nn.LSTM / nn.GRU of the same size, bfloat16 autocast
against float32, and the fused pointwise kernel against the unfused PyTorch path
(activations + qrnn.forget_mult + output gate). GPU figures when a GPU is present."""

from __future__ import annotations

import torch

import qrnn
from qrnn import ops

from .. import _C
from ..ops.qrnn_gates import kernels as gate_kernels
from .common import QUICK_COPY_NOTE, Result, copy_share, measure_interleaved

AREA = "layer"


def _clear_grads(*modules_or_tensors) -> None:
    """optimizer.zero_grad(set_to_none=True) for every contender alike."""
    for m in modules_or_tensors:
        if isinstance(m, torch.Tensor):
            m.grad = None
        else:
            for p in m.parameters():
                p.grad = None


def _layer_step(model, x, grad, autocast_dtype=None):
    def step():
        _clear_grads(model, x)
        with torch.autocast(x.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out, _ = model(x)
        out.backward(grad)
    return step


def _gemm_step(linear, x, grad, autocast_dtype=None):
    """The layer's own GEMM work: the same Linear, forward and backward (dX, dW, db)."""
    def step():
        _clear_grads(linear, x)
        with torch.autocast(x.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            gates = linear(x)
        gates.backward(grad)
    return step


def _shape(T, B, n_in, H) -> str:
    return f"T={T} B={B} {n_in}->{H}"


def _result(name, value, unit, target, met, note, quick) -> Result:
    """A figure against its target; --quick runs smaller shapes than the targets name, so
    there the figure is reported without a target."""
    if quick:
        return Result(AREA, name, value, unit, None, None, "quick: smaller shape than the target's; " + note)
    return Result(AREA, name, value, unit, target, met, note)


def cpu_layer(T=70, B=20, n_in=1550, H=1550, quick=False) -> list:
    rounds = 2 if quick else 9  # the 5% GEMM comparison needs the most rounds on a noisy machine
    x = torch.randn(T, B, n_in, requires_grad=True)
    model = qrnn.QRNN(n_in, H)
    linear = model.layers[0].linear
    lstm, gru = torch.nn.LSTM(n_in, H), torch.nn.GRU(n_in, H)
    grad_h = torch.randn(T, B, H)
    grad_g = torch.randn(T, B, 3 * H)
    bf16 = torch.bfloat16
    t = measure_interleaved({
        "layer": _layer_step(model, x, grad_h),
        "gemm": _gemm_step(linear, x, grad_g),
        "layer_bf16": _layer_step(model, x, grad_h.to(bf16), bf16),
        "gemm_bf16": _gemm_step(linear, x, grad_g.to(bf16), bf16),
    }, rounds=rounds, repeat=1, warmup=1)
    t.update(measure_interleaved({
        "layer_vs_rnn": _layer_step(model, x, grad_h),
        "lstm": _layer_step(lstm, x, grad_h),
        "gru": _layer_step(gru, x, grad_h),
    }, rounds=max(2, rounds // 2), repeat=1, warmup=1))
    shape = _shape(T, B, n_in, H)
    ms = {k: f"{v * 1e3:.1f} ms" for k, v in t.items()}
    results = []
    for tag, layer, gemm in (("float32", "layer", "gemm"), ("bf16 autocast", "layer_bf16", "gemm_bf16")):
        ratio = t[layer] / t[gemm]
        results.append(_result(f"layer vs its GEMMs alone, fwd+bwd {tag}, {shape}", ratio, "x", "<= 1.05x",
                               ratio <= 1.05, f"layer {ms[layer]}, Linear fwd+bwd {ms[gemm]}", quick))
    for name, target in (("lstm", 2.7), ("gru", 4.0)):
        speedup = t[name] / t["layer_vs_rnn"]
        results.append(_result(f"speed-up over nn.{name.upper()}, fwd+bwd float32, {shape}", speedup, "x",
                               f">= {target}x", speedup >= target, f"{name} {ms[name]}, layer {ms['layer_vs_rnn']}",
                               quick))
    speedup = t["layer"] / t["layer_bf16"]
    results.append(_result(f"bf16 autocast vs float32 layer, fwd+bwd, {shape}", speedup, "x", ">= 2.5x",
                           speedup >= 2.5, f"float32 {ms['layer']}, bf16 {ms['layer_bf16']}", quick))
    return results


def _pointwise_step(fn, gates, grad):
    def step():
        gates.grad = None
        out, _ = fn(gates)
        out.backward(grad)
    return step


def _gate_kernels_into(outputs, gates, grad):
    """The fused forward and backward kernels writing into preallocated outputs (as the copy
    writes into a warm buffer): no autograd, no fresh memory."""
    out, states, c_n, grad_gates = outputs
    threads = torch.get_num_threads()
    _C.qrnn_gates_forward(*gate_kernels.forward_args(out, states, c_n, gates, None, None, None, 1.0, True,
                                                          False, False), threads)
    _C.qrnn_gates_backward(*gate_kernels.backward_args(grad_gates, None, grad, None, gates, states, None, None,
                                                            None, 1.0, True, False, False), threads)


def cpu_pointwise(T=70, B=20, H=1550, quick=False) -> list:
    results = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        gates = torch.randn(T, B, 3 * H).to(dtype).requires_grad_()
        grad = torch.randn(T, B, H).to(dtype)
        # Elements the fused pair moves per (t, b): the forward reads G (3H) and writes the
        # output and the saved states (2H); the backward reads dOut, G and the states (5H)
        # and writes dG (3H): 13H. A copy of as many bytes (read half, write half) bounds it.
        nbytes = 13 * T * B * H * gates.element_size()
        src = torch.empty(nbytes // 2, dtype=torch.uint8).random_()
        dst = torch.empty_like(src)
        warm = (torch.empty(T, B, H, dtype=dtype), torch.empty(T, B, H, dtype=dtype), torch.empty(B, H),
                torch.empty_like(gates))
        plain = gates.detach()
        fns = {
            "fused": _pointwise_step(qrnn.qrnn_gates, gates, grad),
            "kernels": lambda warm=warm, g=plain, grad=grad: _gate_kernels_into(warm, g, grad),
            "copy": lambda dst=dst, src=src: dst.copy_(src),
        }
        if dtype != torch.float16:
            fns["unfused"] = _pointwise_step(ops.qrnn_gates_unfused, gates, grad)
        t = measure_interleaved(fns, rounds=3 if quick else 9, repeat=3)
        name = str(dtype).replace("torch.", "")
        shape = f"T={T} B={B} H={H}"
        share = copy_share(t["copy"], t["kernels"], quick)
        results.append(_result(
            f"fused gates fwd+bwd vs copy of the same bytes, {name}, {shape}", share, "%", ">= 80%",
            share >= 80, (QUICK_COPY_NOTE if quick else "") +
            f"kernels into warm outputs {t['kernels'] * 1e3:.2f} ms ({nbytes / t['kernels'] / 1e9:.1f} GB/s), copy "
            f"{t['copy'] * 1e3:.2f} ms ({nbytes / t['copy'] / 1e9:.1f} GB/s); through the op (fresh outputs, "
            f"autograd) {t['fused'] * 1e3:.2f} ms"
            + ("" if quick else f" = {100 * t['copy'] / t['fused']:.0f}% of copy"), quick))
        if "unfused" in t:
            speedup = t["unfused"] / t["fused"]
            note = (f"fused {t['fused'] * 1e3:.2f} ms ({nbytes / t['fused'] / 1e9:.1f} GB/s), "
                    f"unfused {t['unfused'] * 1e3:.1f} ms, copy of the same bytes {t['copy'] * 1e3:.2f} ms")
            figure = f"fused gates vs unfused PyTorch path, fwd+bwd {name}, {shape}"
            if dtype == torch.float32:
                results.append(_result(figure, speedup, "x", ">= 2.5x", speedup >= 2.5, note, quick))
            else:
                results.append(Result(AREA, figure, speedup, "x", note=note))
    return results


def gpu(quick=False) -> list:
    """cuDNN comparisons, and the fused CUDA gate kernels against a copy of the same bytes."""
    results = []
    device = "cuda"
    rounds = 3 if quick else 9
    half = torch.float16
    # QRNN paper, Figure 4: a 320-unit layer against cuDNN LSTM, batch 8, seq_len 512.
    T, B, n_in, H = 512, 8, 320, 320
    x = torch.randn(T, B, n_in, device=device)
    model = qrnn.QRNN(n_in, H, window=2).to(device)
    lstm = torch.nn.LSTM(n_in, H).to(device)

    def forward(m):
        def step():
            with torch.no_grad(), torch.autocast(device, dtype=half):
                m(x)
        return step

    t = measure_interleaved({"qrnn": forward(model), "lstm": forward(lstm)}, device=device, rounds=rounds, repeat=10)
    speedup = t["lstm"] / t["qrnn"]
    path = "fused" if ops.has_fused_qrnn_gates(device) else "unfused"
    results.append(Result(AREA, f"GPU fwd float16 speed-up over cuDNN LSTM, window 2, {_shape(T, B, n_in, H)}", speedup,
                          "x", ">= 16.9x", speedup >= 16.9,
                          f"lstm {t['lstm'] * 1e3:.3f} ms, qrnn {t['qrnn'] * 1e3:.3f} ms ({path} gates)"))
    # The AWD-QRNN shape, forward + backward.
    T, B, n_in, H = 70, 20, 1550, 1550
    x = torch.randn(T, B, n_in, device=device, requires_grad=True)
    model = qrnn.QRNN(n_in, H).to(device)
    lstm = torch.nn.LSTM(n_in, H).to(device)
    grad = torch.randn(T, B, H, device=device)
    for tag, dtype in (("float16 autocast", half), ("float32", None)):
        g = grad if dtype is None else grad.to(dtype)
        t = measure_interleaved({"qrnn": _layer_step(model, x, g, dtype), "lstm": _layer_step(lstm, x, g, dtype)},
                                device=device, rounds=rounds, repeat=5)
        speedup = t["lstm"] / t["qrnn"]
        target = dtype is not None
        results.append(Result(AREA, f"GPU fwd+bwd {tag} speed-up over cuDNN LSTM, {_shape(T, B, n_in, H)}", speedup,
                              "x", ">= 5x" if target else None, (speedup >= 5) if target else None,
                              f"lstm {t['lstm'] * 1e3:.2f} ms, qrnn {t['qrnn'] * 1e3:.2f} ms ({path} gates)"))
    if ops.has_fused_qrnn_gates(device):
        for dtype in (torch.float32, half):
            gates = torch.randn(T, B, 3 * H, device=device).to(dtype).requires_grad_()
            g = torch.randn(T, B, H, device=device).to(dtype)
            nbytes = 13 * T * B * H * gates.element_size()
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            t = measure_interleaved({"fused": _pointwise_step(qrnn.qrnn_gates, gates, g),
                                     "copy": lambda dst=dst, src=src: dst.copy_(src)},
                                    device=device, rounds=rounds, repeat=10)
            fraction = t["copy"] / t["fused"]
            results.append(Result(AREA, f"GPU fused gates fwd+bwd bandwidth vs copy, {dtype}, T={T} B={B} H={H}",
                                  100 * fraction, "%", ">= 80%", fraction >= 0.8,
                                  f"fused {t['fused'] * 1e3:.3f} ms, copy {t['copy'] * 1e3:.3f} ms"))
    return results


def run(quick: bool = False) -> list:
    if quick:
        results = cpu_layer(T=16, B=4, n_in=256, H=256, quick=True) + cpu_pointwise(T=16, B=4, H=256, quick=True)
    else:
        results = cpu_layer() + cpu_pointwise()
    if torch.cuda.is_available():
        results += gpu(quick=quick)
    return results
