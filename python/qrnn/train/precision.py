"""Which autocast precision a run trains in, and why."""

from __future__ import annotations

import torch

from .errors import TrainError

__all__ = ["PRECISIONS", "AUTOCAST_DTYPES", "choose_precision", "cpu_bf16_support"]

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
# The autocast dtype of each precision "auto" can resolve to (None: no autocast).
AUTOCAST_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def cpu_bf16_support() -> tuple:
    """(native, what was checked): whether this CPU executes bfloat16 dot products natively
    (AVX512-BF16 or AMX-BF16 instructions), which is what makes bf16 autocast faster than
    float32. Reads the CPU flags in /proc/cpuinfo, else asks torch's CPU probes."""
    wanted = ("avx512_bf16", "amx_bf16")
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), None)
    except OSError:
        flags = None
    if flags is not None:
        found = [flag for flag in wanted if flag in flags]
        source = "/proc/cpuinfo"
    else:  # not Linux: torch's private probes, where this torch has them
        probes = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_bf16": "_is_amx_tile_supported"}
        found = [flag for flag, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)()]
        source = "torch.cpu probes"
    if found:
        return True, f"CPU has {' and '.join(found)} ({source})"
    return False, f"CPU has neither {' nor '.join(wanted)} ({source})"


def choose_precision(requested: str, device: torch.device) -> tuple:
    """The autocast precision a run on ``device`` trains in, and why.

    Args:
        requested: ``"auto"``, ``"fp32"``, ``"fp16"`` or ``"bf16"`` (``--precision``).
            ``auto`` picks fp16 on CUDA, bf16 on a CPU with native bfloat16 dot products
            (AVX512-BF16 or AMX-BF16), and fp32 elsewhere.
        device: the ``torch.device`` the model trains on.

    Returns:
        ``(precision, reason)``: the precision chosen (never ``"auto"``) and a sentence
        saying why (for the log), e.g. that bf16 was requested on a CPU that emulates it.

    Raises:
        ValueError: ``requested`` is not one of the four names.
        TrainError: bf16 requested on a GPU without bfloat16 support.
    """
    if requested not in PRECISIONS:  # a bad argument (the command line restricts the choices itself)
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    if device.type == "cuda":
        if requested == "bf16" and not torch.cuda.is_bf16_supported():
            raise TrainError("--precision bf16: this GPU has no bfloat16 support; use fp16")
        if requested == "auto":
            return "fp16", "auto: CUDA device, float16 autocast with loss scaling"
        return requested, "requested"
    if requested == "bf16" and device.type == "cpu":
        native, what = cpu_bf16_support()
        if not native:
            return "bf16", (f"requested, but {what}: torch emulates bfloat16 matrix products here, several to "
                            "hundreds of times slower than float32 (--precision auto picks fp32)")
    if requested != "auto":
        return requested, "requested"
    if device.type != "cpu":
        return "fp32", f"auto: no mixed-precision default for {device.type}"
    native, what = cpu_bf16_support()
    if native:
        return "bf16", f"auto: {what}, so bfloat16 autocast runs natively"
    return "fp32", f"auto: {what}, so bfloat16 would be emulated (slower than float32)"
