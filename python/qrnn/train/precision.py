"""Which autocast precision a run trains in, and why; :class:`PrecisionConfig`, how a
:class:`qrnn.train.Trainer` computes (precision, loss scaling, gradient clipping)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .errors import TrainError

__all__ = ["PrecisionConfig", "PRECISIONS", "AUTOCAST_DTYPES", "choose_precision", "cpu_bf16_support",
           "X86_BF16_FLAGS", "ARM_BF16_FLAGS"]

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
# The autocast dtype of each precision "auto" can resolve to (None: no autocast).
AUTOCAST_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class PrecisionConfig:
    """How :class:`qrnn.train.Trainer` computes (``qrnn-train``'s ``--precision`` and ``--clip``).

    Args:
        precision: ``"auto"``, ``"fp32"``, ``"fp16"`` or ``"bf16"`` (:func:`choose_precision`
            resolves and checks it when the Trainer is built); parameters stay float32,
            forward and loss run under ``torch.autocast``; fp16 uses a GradScaler whose
            skipped steps are counted.
        clip_norm: clip the gradients' total norm to this (after unscaling), or None.
        grad_scaler: the ``torch.amp.GradScaler`` to use; None: one enabled for fp16 only.
    """

    precision: str = "auto"
    clip_norm: Optional[float] = None
    grad_scaler: Optional[torch.amp.GradScaler] = None


# The CPU features that give bfloat16 arithmetic in hardware: x86's AVX512-BF16 and AMX-BF16
# ("flags" in /proc/cpuinfo), aarch64's BF16 extension ("Features": bf16, e.g. Neoverse V1 / N2,
# Graviton 3). Without them torch emulates bfloat16 matrix products in float32 and conversions.
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ARM_BF16_FLAGS = ("bf16",)


def _cpuinfo_features(lines) -> tuple:
    """(features, key) of the first CPU in /proc/cpuinfo `lines`: its "flags" (x86) or
    "Features" (aarch64) line, split; (None, None) without either."""
    for line in lines:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features"):
            return value.split(), key
    return None, None


def cpu_bf16_support(cpuinfo: str = "/proc/cpuinfo") -> tuple:
    """(native, what was checked): whether this CPU has bfloat16 arithmetic in hardware,
    which is what makes bf16 autocast faster than float32: AVX512-BF16 or AMX-BF16 on x86
    (an AVX2 or plain AVX-512 CPU has neither, and there bf16 is no faster, often much slower,
    than float32), the BF16 extension on aarch64. Reads the CPU features in `cpuinfo`
    (Linux), else asks torch's x86 CPU probes (other systems: an aarch64 Mac answers no)."""
    try:
        with open(cpuinfo) as fh:
            features, key = _cpuinfo_features(fh)
    except OSError:
        features, key = None, None
    if features is not None:
        wanted = ARM_BF16_FLAGS if key == "Features" else X86_BF16_FLAGS
        found = [flag for flag in wanted if flag in features]
        source = cpuinfo
    else:  # not Linux: torch's private probes, where this torch has them
        wanted = X86_BF16_FLAGS
        probes = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_bf16": "_is_amx_tile_supported"}
        found = [flag for flag, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)()]
        source = "torch.cpu probes"
    if found:
        return True, f"CPU has {' and '.join(found)} ({source})"
    if len(wanted) == 1:
        return False, f"CPU has no {wanted[0]} ({source})"
    return False, f"CPU has neither {' nor '.join(wanted)} ({source})"


def choose_precision(requested: str, device: torch.device) -> tuple:
    """The autocast precision a run on ``device`` trains in, and why.

    Args:
        requested: ``"auto"``, ``"fp32"``, ``"fp16"`` or ``"bf16"`` (``--precision``).
            ``auto`` picks fp16 (with loss scaling) on CUDA; on a CPU, bf16 only where the
            CPU has bfloat16 arithmetic in hardware (:func:`cpu_bf16_support`: AVX512-BF16
            or AMX-BF16 on x86, the BF16 extension on aarch64), fp32 on every other CPU
            (an emulated bfloat16 is slower than float32); fp32 on other devices.
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
