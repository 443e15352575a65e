"""The processes of a run: torchrun's process group, this rank's device, and the few
collectives the trainer and the command line need besides DDP's own."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .errors import TrainError

__all__ = ["Distributed", "init_distributed", "all_gather_object", "broadcast_object", "check_ranks_in_sync"]


@dataclass
class Distributed:
    """This process's place in the run: its rank, the number of processes, its device."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: Optional[str] = None) -> Distributed:
    """Join the process group torchrun set up (gloo on CPU, nccl on CUDA); a single process
    otherwise. Chooses the device: --device, else CUDA (this rank's GPU) when available."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise TrainError(f"--device {device!r} is not a device torch knows (e.g. cpu, cuda, cuda:1)") from None
    if dev.type not in ("cpu", "cuda"):  # e.g. meta: no data, no autocast
        raise TrainError(f"--device {device}: training runs on cpu or cuda")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainError(f"--device {device}: torch sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", local_rank if world > 1 else torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise TrainError(f"--device {dev}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(dev)
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend)
    return Distributed(rank, world, dev)


def all_gather_object(obj, dist: Distributed) -> list:
    """Every rank's `obj`, in rank order (collective under DDP)."""
    if not dist.enabled:
        return [obj]
    out = [None] * dist.world
    torch.distributed.all_gather_object(out, obj)
    return out


def broadcast_object(value, dist: Distributed):
    """Rank 0's `value` on every rank (collective under DDP)."""
    if not dist.enabled:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


# Tensors of the last collectives, kept for the life of the process (see check_ranks_in_sync).
_KEPT_TENSORS: list = []


def check_ranks_in_sync(module: nn.Module, dist: Distributed) -> str:
    """Every rank must hold the same parameters after DDP training: compare checksums.

    The last collective of a run. Its tensors stay referenced until the process ends, so
    that gloo's worker threads never free a tensor Python owns after this: torch 2.4 tears
    the process group down with the GIL held and joins those threads, and a worker freeing
    such a tensor needs the GIL (a deadlock at exit, seen with all_gather_object's)."""
    checksum = sum(p.detach().double().sum().item() for p in module.parameters())
    low = torch.tensor([checksum], dtype=torch.float64, device=dist.device)
    high = low.clone()
    _KEPT_TENSORS.extend((low, high))
    torch.distributed.all_reduce(low, op=torch.distributed.ReduceOp.MIN)
    torch.distributed.all_reduce(high, op=torch.distributed.ReduceOp.MAX)
    if low.item() != high.item():
        raise TrainError(f"ranks diverged: parameter checksums from {low.item()!r} to {high.item()!r}")
    return f"ranks in sync: {dist.world} processes, parameter checksum {checksum!r}"
