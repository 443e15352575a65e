"""How every op family launches its CUDA kernels (each family's ``kernels`` module registers them
for device type ``"cuda"`` when this build has them: ``AVAILABLE``, ``qrnn.build_info()["cuda"]``).

Every call reads the current CUDA stream of the tensors' device (never cached, so
``torch.cuda.stream(...)`` blocks, CUDA graphs and ``torch.compile(mode="reduce-overhead")``
are honoured), passes that device to the launcher (which makes it current), allocates the outputs
with torch (the caching allocator, ordered on that stream) and launches. The C++ side
neither allocates nor synchronises.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from ... import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub

__all__ = ["AVAILABLE", "SCHEDULES", "current_stream_handle", "schedule", "launch", "launch_by_name", "check_out",
           "Runtime", "runtime"]

AVAILABLE: bool = hasattr(_C, "cuda_forget_mult_forward")

# Codes of qrnn::cuda::Schedule, as qrnn._C exports them.
SCHEDULES = _C.cuda_schedules() if AVAILABLE else {"auto": 0}
_schedule = SCHEDULES["auto"]

# The raw cudaStream_t of a device's current stream: what torch.cuda.current_stream(i).cuda_stream
# returns, without building a Stream object per call (the getter torch.compile's code uses).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_handle(index: int) -> int:
    """The current CUDA stream of device `index`, as the integer cudaStream_t."""
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _device_index(device: torch.device) -> int:
    return device.index  # a CUDA tensor's device always has its index


class Runtime:
    """The CUDA lookups a launch makes: the device index and torch's current stream of it.
    Tests substitute a stand-in that lets CPU tensors go through this module to the
    emulated kernels (tests/conftest.py)."""

    index = staticmethod(_device_index)
    stream = staticmethod(current_stream_handle)


runtime = Runtime()


@contextlib.contextmanager
def schedule(name: str):
    """Force the kernels' time schedule inside the block: ``"auto"`` (the size rule),
    ``"serial"`` or ``"chunked"``. For tests and benchmarks; results agree to rounding."""
    global _schedule
    if name not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {sorted(SCHEDULES)}, got {name!r}")
    previous, _schedule = _schedule, SCHEDULES[name]
    try:
        yield
    finally:
        _schedule = previous


def launch(kernel, device: torch.device, args: tuple, schedule: bool = True) -> None:
    """Run `kernel` on `device`'s current stream. The C++ launcher makes `device` current
    for the launch itself (its CUDA runtime is not torch's, so torch's device switch is not
    relied on). The scan families' kernels also take the schedule."""
    index = runtime.index(device)
    stream = runtime.stream(index)
    if schedule:
        kernel(*args, stream, _schedule, index)
    else:
        kernel(*args, stream, index)


def launch_by_name(launcher: str, device: torch.device, args: tuple, schedule: bool = True) -> None:
    """:func:`launch` of qrnn._C's launcher ``launcher``, looked up at the call so that tests
    can stand in for qrnn._C here (tests/conftest.py's emulated launchers)."""
    launch(getattr(_C, launcher), device, args, schedule)


def check_out(name: str, out: Tensor, like: Tensor, dtype=None) -> None:
    """A given output (the write-into entry points) has ``like``'s shape and device and ``dtype``."""
    dtype = like.dtype if dtype is None else dtype
    if out.shape != like.shape or out.dtype != dtype or out.device != like.device:
        raise ValueError(f"{name} must be {tuple(like.shape)} {dtype} on {like.device}, "
                         f"got {tuple(out.shape)} {out.dtype} on {out.device}")
