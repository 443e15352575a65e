"""Staging images: the reusable memory a save's bytes are copied into, laid out as the file
(sizes and alignment are the C++ writer's rules, read from qrnn._C), and the device->host
copies of CUDA tensors into a pinned image."""

from __future__ import annotations

import os
from typing import Any, Optional

import torch

from .. import _C

_IO_ALIGNMENT = _C.checkpoint_staging_alignment  # staging images start here: the writer uses O_DIRECT


class CudaRuntime:
    """The CUDA calls a save of GPU tensors makes: torch's. Tests substitute a stand-in
    (``staging.cuda``) so the GPU staging path runs on a machine without a GPU."""

    Stream = staticmethod(lambda device: torch.cuda.Stream(device=device))
    Event = staticmethod(lambda: torch.cuda.Event())
    current_stream = staticmethod(lambda device: torch.cuda.current_stream(device))
    stream = staticmethod(lambda stream: torch.cuda.stream(stream))
    pinned_empty = staticmethod(lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))


cuda: Any = CudaRuntime()  # looked up at each call, so that a test's stand-in takes effect

_CGROUP_ROOT = "/sys/fs/cgroup"
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


def _read_number(path: str) -> Optional[int]:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _reclaimable(path: str, key: str) -> int:
    """Page cache the kernel drops before it kills anything (inactive file pages)."""
    try:
        with open(path) as file:
            for line in file:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
    except OSError:
        pass
    return 0


def memory_headroom() -> Optional[tuple]:
    """(bytes free, limit) of the tightest memory cgroup above this process (v2
    ``memory.max`` - ``memory.current``, v1 ``memory.limit_in_bytes`` -
    ``memory.usage_in_bytes``, each plus its inactive page cache), or None without a limit.
    An allocation may succeed beyond it and be OOM-killed later, when its pages are touched."""
    try:
        with open("/proc/self/cgroup") as file:
            lines = file.read().splitlines()
    except OSError:
        return None
    tightest = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            root, limit_file, usage_file, stat_key = _CGROUP_ROOT, "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):
            root, limit_file, usage_file, stat_key = (os.path.join(_CGROUP_ROOT, "memory"), "memory.limit_in_bytes",
                                                      "memory.usage_in_bytes", "total_inactive_file")
        else:
            continue
        while True:  # a limit on any ancestor binds too
            folder = os.path.join(root, path.lstrip("/"))
            limit = _read_number(os.path.join(folder, limit_file))
            usage = _read_number(os.path.join(folder, usage_file))
            if limit is not None and usage is not None and limit < _NO_LIMIT:
                free = max(0, limit - usage + _reclaimable(os.path.join(folder, "memory.stat"), stat_key))
                if tightest is None or free < tightest[0]:
                    tightest = (free, limit)
            if path in ("", "/"):
                break
            path = os.path.dirname(path.rstrip("/")) or "/"
    return tightest


class StagingSlot:
    """One reusable staging image: allocated once, grown rarely, freed on this thread."""

    def __init__(self):
        self.buffer: Any = None                     # CheckpointStaging, or a pinned tensor (CUDA saves)
        self.image: Optional[torch.Tensor] = None  # pinned only: page-aligned view the GPU copies into
        self.address = 0
        self.capacity = 0
        self.pinned = False
        self.save: Any = None  # the save using it (anything with finished()), until done

    def free(self) -> bool:
        return self.save is None or self.save.finished()

    def ensure(self, nbytes: int, pinned: bool, populate_threads: int = 0) -> None:
        """Room for an image of `nbytes`; a new buffer's first `nbytes` are faulted in on
        `populate_threads` threads (0: left to the copy, or to a background thread)."""
        if self.capacity >= nbytes and (self.pinned or not pinned):
            return
        self.buffer = self.image = None  # drop the old one first: peak memory of one buffer
        self.address = self.capacity = 0
        capacity = _C.checkpoint_staging_capacity(nbytes)
        if pinned:
            buffer = cuda.pinned_empty(capacity + _IO_ALIGNMENT)
            skip = -buffer.data_ptr() % _IO_ALIGNMENT
            self.image = buffer[skip:skip + capacity]
            self.address = self.image.data_ptr()
        else:
            # No zeroing pass (it made the first save slower than torch.save): the kernel
            # populates the pages the file needs, cheaper than the copy's own page faults;
            # the 1/8 headroom stays untouched.
            buffer = _C.CheckpointStaging(capacity)
            if populate_threads:
                buffer.populate(0, nbytes, populate_threads)
            self.address = buffer.address
        self.buffer, self.capacity, self.pinned = buffer, capacity, pinned

    def copy_from_gpu(self, stored: list, on_gpu: list, offsets: list, streams: dict) -> dict:
        """Queue the device->host copies on a side stream per device (`streams`, reused
        across saves), after the work already queued on the current stream; returns
        device -> event marking their end."""
        by_device: dict = {}
        for s, gpu, offset in zip(stored, on_gpu, offsets):
            if gpu and s.nbytes:
                by_device.setdefault(s.device, []).append((s, offset))
        done = {}
        for device, items in by_device.items():
            stream = streams.get(device)
            if stream is None:
                stream = streams[device] = cuda.Stream(device)
            stream.wait_stream(cuda.current_stream(device))
            with cuda.stream(stream):
                image = self.image
                assert image is not None  # pinned slots always have their image
                for s, offset in items:
                    source = torch.empty(0, dtype=torch.uint8, device=s.storage.device).set_(s.storage)
                    image[offset:offset + s.nbytes].copy_(source, non_blocking=True)
                event = cuda.Event()
                event.record(stream)
            done[device] = event
        return done
