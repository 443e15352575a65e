"""Whether a ``qrnn-train`` model fits in memory, known before a byte of it is allocated.

The model is first built on the meta device (shapes only, no storage) to count its
parameters; training holds, per parameter, the float32 weight, its gradient and the
optimizer's state (Adam two copies, averaged SGD one, SGD none). Activations, the corpus
and autocast copies come on top: the estimate is a lower bound, so a model refused by it
could never have trained. The bound is compared with the memory the device has free: on a
CPU the kernel's ``MemAvailable``, capped by the room left in the tightest memory cgroup
above the process (cgroup v1 or v2, read from ``/proc/self/cgroup``),
on CUDA ``torch.cuda.mem_get_info``; a model trained on CUDA is built on the CPU first, so
its weights must fit there too.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from ..checkpoint.staging import memory_headroom
from .errors import TrainError
from .lm import meta_model

__all__ = ["available_bytes", "format_bytes", "count_parameters", "check_model_fits", "is_out_of_memory",
           "out_of_memory_message", "OutOfMemoryAsError", "OPTIMIZER_STATE_COPIES"]

# Float32 copies of the parameters an optimizer keeps ("asgd" averages after its switch).
OPTIMIZER_STATE_COPIES = {"adam": 2, "sgd": 0, "asgd": 1}
_FLOAT_BYTES = 4


def format_bytes(count: float) -> str:
    """`count` bytes in binary units: "512 B", "1.5 GiB", "107 PiB"."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            break
        count /= 1024
    return f"{count:,.0f} {unit}" if unit == "B" or count >= 100 else f"{count:.1f} {unit}"


def _cpu_available() -> Optional[int]:
    available = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            return None
    headroom = memory_headroom()  # the tightest memory cgroup above us, v1 or v2
    if headroom is not None:
        available = min(available, headroom[0])
    return available


def available_bytes(device: torch.device) -> Optional[int]:
    """Free memory of `device` in bytes (CPU: available memory; CUDA: free device memory),
    or None where it cannot be told (then nothing is refused on an estimate)."""
    if device.type == "cpu":
        return _cpu_available()
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError, ValueError):
            return None
    return None


def count_parameters(model_config: dict) -> Optional[int]:
    """The number of parameters of ``QRNNLanguageModel(**model_config)`` (tied weights once),
    counted on the meta device; None when the sizes are too large to describe a tensor."""
    try:
        model = meta_model(model_config)
    except (RuntimeError, TypeError, OverflowError):  # a size beyond int64 or a tensor's limits
        return None
    return sum(p.numel() for p in model.parameters())


def _lower(settings) -> str:
    return (f"lower --hidden ({settings.hidden}), --emsize ({settings.emsize}) or --layers ({settings.layers})"
            + (", or use --level char (a smaller vocabulary)" if settings.level == "word" else ""))


def check_model_fits(settings, model_config: dict, device: torch.device) -> int:
    """The number of parameters of the model of `model_config`, or a TrainError (one line
    saying how much memory is needed, how much there is and which flags to lower) when it
    cannot fit in memory on `device`."""
    params = count_parameters(model_config)
    if params is None:
        raise TrainError(f"the model is too large to build: its tensors would exceed what torch can address; "
                         f"{_lower(settings)}")
    copies = 2 + OPTIMIZER_STATE_COPIES.get(settings.optimizer, 2)
    needs = [(device, params * _FLOAT_BYTES * copies,
              f"weights, gradients{' and ' + settings.optimizer + ' state' if copies > 2 else ''}")]
    if device.type != "cpu":  # built on the CPU, then moved
        needs.insert(0, (torch.device("cpu"), params * _FLOAT_BYTES, "weights, built there first"))
    for where, need, what in needs:
        free = available_bytes(where)
        if free is not None and need > free:
            raise TrainError(f"the model's {params:,} parameters need at least {format_bytes(need)} ({what}, "
                             f"float32) on {where}, which has {format_bytes(free)} available: {_lower(settings)}")
    return params


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is an allocation failure: MemoryError, torch's OutOfMemoryError (CUDA),
    or the CPU allocator's RuntimeError ("can't allocate memory")."""
    if isinstance(error, MemoryError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    text = str(error)
    return (oom is not None and isinstance(error, oom)) or "can't allocate memory" in text or "out of memory" in text


def out_of_memory_message(settings, params: Optional[int], device: torch.device) -> str:
    """The one line of an allocation failure while the model, its optimizer or trainer were set up."""
    size = f" (its {params:,} parameters need at least {format_bytes(params * _FLOAT_BYTES * 2)} with " \
           "gradients)" if params is not None else ""
    return f"out of memory building the model on {device}{size}: {_lower(settings)}"


class OutOfMemoryAsError:
    """A context manager, reusable: an allocation failure in its block (:func:`is_out_of_memory`)
    becomes a TrainError, the one line of :func:`out_of_memory_message`."""

    def __init__(self, settings, params: Optional[int], device: torch.device):
        self.settings, self.params, self.device = settings, params, device

    def __enter__(self) -> "OutOfMemoryAsError":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and is_out_of_memory(error):
            raise TrainError(out_of_memory_message(self.settings, self.params, self.device)) from None
