"""The GPU benchmark's baseline calls, run on the CPU: qrnn.bench.cuda hands qrnn.bench._baseline
the arguments its signatures take (the launches themselves need a GPU)."""

import re

import pytest
import torch

import qrnn
from qrnn.bench import cuda as bench_cuda

pytestmark = pytest.mark.skipif(not qrnn.build_info()["cuda"], reason="this build has no CUDA kernels")


def _arity(fn) -> int:
    return len(re.findall(r"\barg\d+\b", fn.__doc__.splitlines()[0]))


class _Recorder:
    def __init__(self):
        self.calls = {}

    def __getattr__(self, name):
        return lambda *args: self.calls.setdefault(name, args)


def test_baseline_calls_match_the_module(monkeypatch):
    from qrnn.bench import _baseline  # type: ignore[attr-defined]  # compiled extension

    recorder = _Recorder()
    monkeypatch.setattr(bench_cuda, "_baseline", recorder)
    monkeypatch.setattr(bench_cuda.ops_cuda, "current_stream_handle", lambda index: 1234)
    T, B, H = 5, 2, 3
    f, x, grad = torch.rand(T, B, H), torch.randn(T, B, H), torch.randn(T, B, H)
    base = bench_cuda._Baseline(f, x, grad)
    base()

    forward, backward = recorder.calls["forget_mult_forward"], recorder.calls["forget_mult_backward"]
    assert len(forward) == _arity(_baseline.forget_mult_forward) == 8
    assert len(backward) == _arity(_baseline.forget_mult_backward) == 12
    assert forward[:6] == (f.data_ptr(), x.data_ptr(), base.h.data_ptr(), T, B, H)
    assert backward[3:7] == (grad.data_ptr(), base.grad_f.data_ptr(), base.grad_x.data_ptr(), base.grad_h0.data_ptr())
    assert forward[6] == backward[10] == 1234  # the current stream of the tensors' device
    assert base.h.shape == (T + 1, B, H)
