"""The processes of a run: torchrun's process group, this rank's device, and the few
collectives the trainer and the command line need besides DDP's own; a failed collective
explained on one line, naming the ranks that did not answer."""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch
from torch import nn

from .errors import TrainError

__all__ = ["Distributed", "init_distributed", "check_device", "all_gather_object", "broadcast_object",
           "all_reduce_max", "check_ranks_in_sync", "is_collective_failure", "collective_failure_message",
           "DEFAULT_DIST_TIMEOUT"]

# How long a collective waits for a peer (torch's own default, 30 minutes, holds a job that
# long on one hung rank).
DEFAULT_DIST_TIMEOUT = 300.0
# How long the check of who is missing, after a failed collective, waits for each rank.
_PROBE_SECONDS = 10.0


@dataclass
class Distributed:
    """This process's place in the run, as :func:`init_distributed` returns it.

    Attributes:
        rank: this process's rank (0 on a single process).
        world: the number of processes (1 on a single process).
        device: the device this process trains on.
        timeout: seconds a collective waits for a peer before it fails.
        health_group: a gloo group of every rank, used only to find which ranks stopped
            answering after a collective failed (None on a single process).
    """

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    timeout: float = DEFAULT_DIST_TIMEOUT  # seconds a collective waits for a peer
    # A gloo group of every rank used only to find unresponsive ranks after a failure: its
    # connections are not the ones a failed collective left broken.
    health_group: Any = None

    @property
    def enabled(self) -> bool:
        """Whether there are several processes (DDP and collectives in use)."""
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the process that writes checkpoints and logs."""
        return self.rank == 0


def check_device(device: Optional[str], cuda_index: Optional[int] = None) -> torch.device:
    """The torch device a ``--device`` value names (``qrnn-train``'s and ``qrnn-generate``'s):
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; None: CUDA when available, else the CPU. A bare
    ``"cuda"`` gets `cuda_index` (None: the current CUDA device).

    Raises:
        TrainError: one line saying which ``--device`` to pass instead: a device torch does
            not know, one other than cpu or cuda, CUDA without a visible GPU (a CPU-only
            build of torch included) or with an index beyond them.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise TrainError(f"--device {device!r} is not a device torch knows: pass --device cpu, cuda or cuda:N"
                         ) from None
    if dev.type not in ("cpu", "cuda"):  # e.g. meta: no data, no autocast
        raise TrainError(f"--device {device}: qrnn-train and qrnn-generate run on cpu or cuda: pass --device cpu, "
                         "cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = f" (torch {torch.__version__} is a CPU-only build)" if torch.version.cuda is None else ""
            raise TrainError(f"--device {device}: torch sees no CUDA device{build}; pass --device cpu")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device() if cuda_index is None else cuda_index)
        count = torch.cuda.device_count()
        if dev.index >= count:
            raise TrainError(f"--device {dev}: torch sees {count} CUDA device(s); pass --device "
                             + ("cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"))
    return dev


def init_distributed(device: Optional[str] = None, timeout: float = DEFAULT_DIST_TIMEOUT) -> Distributed:
    """Join the process group torchrun set up (gloo on CPU, nccl on CUDA), or describe a
    single process when ``WORLD_SIZE`` is unset or 1.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (``--device``); None: CUDA when
            available, else the CPU. A bare ``"cuda"`` means this rank's GPU
            (``LOCAL_RANK``), which is made the current device.
        timeout: seconds any collective (and the process group's setup) waits for a peer
            before it fails (``--dist-timeout``; default 300, where torch's own is 30
            minutes).

    Returns:
        The :class:`Distributed` of this process.

    Raises:
        TrainError: a device torch does not know, one other than cpu or cuda, CUDA without
            a visible GPU or with an index beyond them, or (under a torchrun restart) rank
            0's store of this attempt not appearing within ``timeout``.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = check_device(device, local_rank if world > 1 else None)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    health_group = None
    if world > 1:
        limit = timedelta(seconds=timeout)
        if not torch.distributed.is_initialized():
            backend = "nccl" if dev.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend=backend, timeout=limit, **_attempt_store(world, limit))
        health_group = torch.distributed.new_group(backend="gloo", timeout=limit)
    return Distributed(rank, world, dev, timeout, health_group)


def _attempt_store(world: int, timeout: timedelta) -> dict:
    """The store arguments of init_process_group for this torchrun attempt ({}: env:// as
    usual). torchrun's agent may keep one store server for all restarts of a job (its
    default since torch 2.5) and workers join it unprefixed, so a restarted rank can read the
    address a dead rank of the previous attempt left there and fail to connect (pytorch
    issue 135712); restart counts differ between nodes, so they cannot prefix the keys. Rank
    0 hosts a fresh store instead and publishes where it is (with a nonce that tells an
    earlier attempt's note from this one's) through the shared one."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    rank, host = int(os.environ["RANK"]), os.environ["MASTER_ADDR"]
    shared = torch.distributed.TCPStore(host, int(os.environ["MASTER_PORT"]), world, is_master=False,
                                        timeout=timeout)
    key = "qrnn-train/attempt-store"
    if rank == 0:
        store = torch.distributed.TCPStore(host, 0, world, is_master=True, timeout=timeout,
                                           wait_for_workers=False)
        nonce = uuid.uuid4().hex
        store.set(key, nonce)
        shared.set(key, f"{store.port} {nonce}")
    else:
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            port, nonce = shared.get(key).decode().split()
            try:
                store = torch.distributed.TCPStore(host, int(port), world, is_master=False,
                                                   timeout=timedelta(seconds=2))
                if store.get(key).decode() == nonce:
                    break
            except RuntimeError:  # an earlier attempt's store, gone (or its port reused)
                pass
            if time.monotonic() > deadline:
                raise TrainError(f"rank {rank}: rank 0's store of this attempt did not appear within "
                                 f"--dist-timeout {timeout.total_seconds():g} s")
            time.sleep(0.2)
    return {"store": store, "rank": rank, "world_size": world}


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


def all_reduce_max(values: list, dist: Distributed) -> list:
    """The element-wise maximum of every rank's `values` (floats; collective under DDP)."""
    if not dist.enabled:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=dist.device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return tensor.tolist()


def is_collective_failure(error: BaseException, dist: Optional[Distributed]) -> bool:
    """Whether `error` is a collective that failed (a peer gone, hung, or out of step)."""
    if dist is None or not dist.enabled or not isinstance(error, RuntimeError):
        return False
    if isinstance(error, getattr(torch.distributed, "DistError", ())):
        return True
    # Older torch raises gloo's and NCCL's errors as plain RuntimeErrors.
    return bool(re.search(r"gloo|nccl|[Cc]onnection (closed|reset)|[Tt]imed out|ProcessGroup", str(error)))


def _unresponsive_ranks(dist: Distributed) -> Optional[list]:
    """After a failed collective: on rank 0, the ranks that do not check in on the health
    group within a few seconds (dead: at once; hung: when the wait ends); elsewhere [] when
    rank 0 answered this rank's check-in, else None. (A monitored barrier names a hung rank
    but gives up at the first dead one without naming it.)"""
    probe = min(dist.timeout, _PROBE_SECONDS)
    group, token = dist.health_group, torch.zeros(1)
    deadline = time.monotonic() + probe

    def answered(transfer, *args, **kwargs) -> bool:  # the transfer started ends within the probe
        try:
            transfer(*args, group=group, **kwargs).wait(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            return True
        except RuntimeError:  # at once for a closed connection, at the deadline for a silent peer
            return False

    if not dist.is_main:
        checked_in = answered(torch.distributed.isend, token, dst=0)
        return [] if checked_in and answered(torch.distributed.irecv, token, src=0) else None
    missing = [rank for rank in range(1, dist.world) if not answered(torch.distributed.irecv, torch.zeros(1), src=rank)]
    for rank in set(range(1, dist.world)) - set(missing):
        answered(torch.distributed.isend, token, dst=rank)
    return missing


def collective_failure_message(error: BaseException, dist: Distributed, where: str) -> str:
    """One line for a collective that failed on this rank: which ranks did not answer (hung
    or dead), else the error's first line."""
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
    detail = re.sub(r"^\[[^\]]*\] ", "", detail)  # gloo's source-file prefix
    detail = detail.split(". This is typically")[0]  # gloo's advice, longer than the news
    missing = _unresponsive_ranks(dist) if dist.health_group is not None else None
    if missing is None and dist.world == 2:  # rank 0 did not take the check-in: it is the one
        missing = [0]
    if missing:
        names = ", ".join(str(rank) for rank in missing)
        return (f"rank {dist.rank}: rank{'s' if len(missing) > 1 else ''} {names} of {dist.world} stopped answering "
                f"{where} (dead, or hung past --dist-timeout {dist.timeout:g} s): {detail}")
    if missing is None and not dist.is_main:
        return (f"rank {dist.rank}: a collective failed {where}; rank 0 names the rank at fault "
                f"(if rank 0 is gone, it is): {detail}")
    return f"rank {dist.rank}: a collective with the other processes failed {where}: {detail}"


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
