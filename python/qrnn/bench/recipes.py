"""Other architectures on the ForgetMult kernel: minGRU's recurrence through
``qrnn.forget_mult`` against the log-space parallel scan its authors propose (the
formulation popular minGRU implementations use), forward and backward on the CPU.

docs/RECIPES.md holds the recipes (minGRU, minLSTM, SRU); tests/forget_mult/test_recipes.py
checks them against this module's reference formulations in float64."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import qrnn

from .common import Result, measure_interleaved

AREA = "recipes"


def log_g(x):
    """log of minGRU's positive activation g(x) = x + 0.5 (x >= 0), sigmoid(x) (x < 0)."""
    return torch.where(x >= 0, (F.relu(x) + 0.5).log(), -F.softplus(-x))


def log_space_scan(log_coeffs, log_values):
    """h[t] = exp(a[t]) * h[t-1] + exp(b[t]) as a prefix sum in log space (Heinsen's
    parallel scan): time on dimension 0, ``log_values[0]`` may carry log h[-1]."""
    a_star = log_coeffs.cumsum(dim=0)
    return (a_star + (log_values - a_star).logcumsumexp(dim=0)).exp()


def min_gru_log_space(k, pre_h, h0=None):
    """minGRU by the paper's log-space scan (its appendix): z = sigmoid(k), h~ = g(pre_h),
    h[t] = (1 - z[t]) h[t-1] + z[t] h~[t], time-major; ``h0`` must be positive."""
    log_coeffs = -F.softplus(k)                  # log(1 - z)
    log_values = -F.softplus(-k) + log_g(pre_h)  # log(z * h~)
    if h0 is not None:
        log_coeffs = torch.cat([torch.zeros_like(h0).unsqueeze(0), log_coeffs])
        log_values = torch.cat([h0.log().unsqueeze(0), log_values])
        return log_space_scan(log_coeffs, log_values)[1:]
    return log_space_scan(log_coeffs, log_values)


def min_gru_forget_mult(k, pre_h, h0=None):
    """The same recurrence as one ForgetMult: f = z weights the candidate, 1 - z keeps h."""
    h_tilde = torch.where(pre_h >= 0, pre_h + 0.5, torch.sigmoid(pre_h))
    return qrnn.forget_mult(torch.sigmoid(k), h_tilde, h0)


def _fwd_bwd(fn, k, pre_h, grad):
    k.grad = pre_h.grad = None
    fn(k, pre_h).backward(grad)


def min_gru_speedup(T=256, B=16, H=512, quick=False) -> list:
    if quick:
        T, B, H = 32, 4, 64
    k = torch.randn(T, B, H, requires_grad=True)
    pre_h = torch.randn(T, B, H, requires_grad=True)
    grad = torch.randn(T, B, H)
    t = measure_interleaved({"forget_mult": lambda: _fwd_bwd(min_gru_forget_mult, k, pre_h, grad),
                             "log-space scan": lambda: _fwd_bwd(min_gru_log_space, k, pre_h, grad)},
                            rounds=3 if quick else 9, repeat=3)
    speedup = t["log-space scan"] / t["forget_mult"]
    note = f"log-space scan {t['log-space scan'] * 1e3:.2f} ms, forget_mult {t['forget_mult'] * 1e3:.2f} ms"
    return [Result(AREA, f"minGRU fwd+bwd, forget_mult vs log-space scan, T={T} B={B} H={H} float32",
                   speedup, "x", None, None, note)]


def run(quick: bool = False) -> list:
    return min_gru_speedup(quick=quick)
