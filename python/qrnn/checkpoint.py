"""Non-blocking, crash-safe checkpoints that plain ``torch.load`` reads.

    ckpt = qrnn.checkpoint.AsyncCheckpointer("runs/ckpt", keep_last=3)
    for epoch in range(epochs):
        train_one_epoch(...)
        ckpt.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": epoch}, step=epoch)
    ckpt.close()                                   # or `with AsyncCheckpointer(...) as ckpt:`
    state = qrnn.checkpoint.load(ckpt.latest())

What ``save(state, step)`` does on the calling thread: pickles the *structure* of ``state``
(dicts, lists, numbers, strings; tensors become references to their storages, exactly as
``torch.save`` writes them) and takes a snapshot of every tensor's bytes into a reusable
staging buffer allocated once (pinned when CUDA tensors are saved). CPU bytes are copied by
C++ threads with the GIL released; CUDA bytes are copied on a side stream, and the current
stream waits for that copy before running anything after ``save()``, so the host does not
wait at all. A C++ writer thread then computes CRCs and writes the file in torch.save's zip
layout to a temporary name in the same folder, fsyncs it, renames it over
``<directory>/ckpt-<step:012d>.pt``, fsyncs the folder, and deletes checkpoints beyond
``keep_last``. A process killed at any moment never leaves a partial file under a final name.

Snapshot semantics: the file holds the values at the moment ``save()`` was called, even if
training changes every tensor right after (CPU tensors such as Adam's ``step`` included).

Overlap mode, ``save(state, step, overlap_with=optimizer)``: ``save()`` returns right after
pickling the structure; the staging copy runs while the next forward and backward pass run,
and ``optimizer.step()`` waits for it (a one-shot step pre-hook). This is safe when nothing
else modifies a saved tensor in place before that ``optimizer.step()``: not the forward pass
(BatchNorm running statistics, in-place buffer updates, an EMA updated in forward), not
``load_state_dict``, not a manual ``param.data.copy_``. Save such state in default mode, or
call ``handle.wait_staged()`` before modifying it.

Errors (full disk, file-size limit, read-only or vanished folder, a failure inside the
writer thread) raise :class:`CheckpointError` from the next ``save()``, ``wait()`` or
``close()`` (and from that save's ``handle.result()``); the previous checkpoint is untouched
and no temporary file is left. ``max_pending`` bounds the snapshots held in memory: a further
``save()`` waits for the oldest, or returns ``None`` at once with ``block=False``.
"""

from __future__ import annotations

import atexit
import collections
import io
import itertools
import mmap
import operator
import os
import pickle
import queue
import re
import struct
import threading
import time
import warnings
import weakref
import zipfile
from typing import Any, Iterable, Optional, Union

import torch

from . import _C

__all__ = ["AsyncCheckpointer", "SaveHandle", "CheckpointError", "CorruptCheckpointError", "load", "verify"]

_IO_ALIGNMENT = 4096          # staging buffers start on a page: the writer uses O_DIRECT
_GROWTH_QUANTUM = 2 << 20     # staging buffers grow in 2 MiB steps, with 1/8 headroom
_STEP_DIGITS = 12


class CheckpointError(OSError):
    """A checkpoint was not saved. ``errno`` and ``filename`` say which system call failed on
    which file (``errno`` is 0 for a failure that was not a system call); ``step`` is the step
    of the lost save."""

    def __init__(self, errno: int, message: str, filename: Optional[str] = None, step: Optional[int] = None,
                 operation: str = ""):
        super().__init__(errno, message, filename)
        self.step = step
        self.operation = operation


class CorruptCheckpointError(ValueError):
    """:func:`verify` found a damaged checkpoint; ``record`` names the damaged record (None
    when the archive as a whole is unreadable)."""

    def __init__(self, path: str, record: Optional[str], problem: str):
        where = f"record '{record}'" if record else "archive"
        super().__init__(f"checkpoint '{path}' is damaged: {where}: {problem}")
        self.path = path
        self.record = record


# ---- Pickling the structure ---------------------------------------------------------

# Storage classes torch.save names for each dtype (legacy typed storages); other dtypes are
# saved as torch.save does for them: an UntypedStorage and _rebuild_tensor_v3.
_LEGACY_STORAGE = {
    torch.float32: "FloatStorage", torch.float64: "DoubleStorage", torch.float16: "HalfStorage",
    torch.bfloat16: "BFloat16Storage", torch.complex64: "ComplexFloatStorage",
    torch.complex128: "ComplexDoubleStorage", torch.int8: "CharStorage", torch.int16: "ShortStorage",
    torch.int32: "IntStorage", torch.int64: "LongStorage", torch.uint8: "ByteStorage", torch.bool: "BoolStorage",
    # Quantized tensors reduce through torch's own code, whose storages must keep their typed
    # class: as an UntypedStorage they load as uint8 and the tensor cannot be rebuilt.
    torch.qint8: "QInt8Storage", torch.quint8: "QUInt8Storage", torch.qint32: "QInt32Storage",
    torch.quint4x2: "QUInt4x2Storage", torch.quint2x4: "QUInt2x4Storage",
}
_LEGACY_STORAGE = {dt: getattr(torch, name) for dt, name in _LEGACY_STORAGE.items()}


class _StorageRef:
    """Stands in for a tensor's storage in the pickle; becomes a persistent id."""

    __slots__ = ("pid",)

    def __init__(self, pid: tuple):
        self.pid = pid


class _Stored:
    __slots__ = ("storage", "nbytes", "device")

    def __init__(self, storage, nbytes: int, device: torch.device):
        self.storage = storage
        self.nbytes = nbytes
        self.device = device


class _StatePickler(pickle.Pickler):
    """Pickles a state's structure exactly as torch.save does (protocol 2, each storage a
    persistent id ``("storage", type, key, location, numel)``), keeping tensor bytes out."""

    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.stored: list[_Stored] = []
        self._refs: dict[int, tuple[_StorageRef, torch.dtype]] = {}

    def _ref(self, storage: torch.UntypedStorage, dtype: torch.dtype) -> _StorageRef:
        key = storage._cdata
        found = self._refs.get(key)
        if found is not None:
            ref, first_dtype = found
            if first_dtype != dtype and storage.nbytes() > 0:
                raise ValueError(
                    "state holds tensors that view the same storage as different dtypes "
                    f"({first_dtype} and {dtype}); torch.load cannot rebuild that: clone one of them")
            return ref
        nbytes = storage.nbytes()
        legacy = _LEGACY_STORAGE.get(dtype)
        if legacy is not None:
            pid = ("storage", legacy, str(len(self.stored)), torch.serialization.location_tag(storage),
                   nbytes // dtype.itemsize)
        else:
            pid = ("storage", torch.storage.UntypedStorage, str(len(self.stored)),
                   torch.serialization.location_tag(storage), nbytes)
        ref = _StorageRef(pid)
        self._refs[key] = (ref, dtype)
        self.stored.append(_Stored(storage, nbytes, storage.device))
        return ref

    def reducer_override(self, obj):
        if type(obj) is not torch.Tensor:
            return NotImplemented  # Parameters reduce to their .data, which comes back here
        if (obj.layout is not torch.strided or obj.is_quantized or obj.is_nested or obj.is_conj()
                or obj.is_neg() or obj.device.type == "meta" or obj.__dict__):
            return NotImplemented  # rare kinds: torch's own reduction, storages still come to us
        ref = self._ref(obj.untyped_storage(), obj.dtype)
        args = (ref, obj.storage_offset(), tuple(obj.size()), obj.stride(), obj.requires_grad,
                collections.OrderedDict())
        if obj.dtype in _LEGACY_STORAGE:
            return torch._utils._rebuild_tensor_v2, args
        return torch._utils._rebuild_tensor_v3, args + (obj.dtype,)

    def persistent_id(self, obj):
        # Called for every object pickled: exact type checks only (isinstance on torch's
        # legacy storage classes goes through a Python metaclass and costs microseconds).
        kind = type(obj)
        if kind is _StorageRef:
            return obj.pid
        if kind in _STORAGE_TYPES:
            if kind is torch.UntypedStorage:
                return self._ref(obj, torch.uint8).pid
            return self._ref(obj._untyped_storage, obj.dtype).pid
        return None


_STORAGE_TYPES = frozenset([torch.UntypedStorage, torch.storage.TypedStorage, *_LEGACY_STORAGE.values()])


def _pickle_state(state) -> tuple[bytes, list[_Stored]]:
    buffer = io.BytesIO()
    pickler = _StatePickler(buffer)
    pickler.dump(state)
    return buffer.getvalue(), pickler.stored


# ---- Staging buffers ----------------------------------------------------------------

class _StagingSlot:
    """One reusable staging image: allocated once, grown rarely, freed on this thread."""

    def __init__(self):
        self.buffer: Optional[torch.Tensor] = None
        self.image: Optional[torch.Tensor] = None  # page-aligned view the archive is built in
        self.capacity = 0
        self.pinned = False
        self.handle: Optional[SaveHandle] = None   # the save using it, until done

    def free(self) -> bool:
        return self.handle is None or self.handle._status.done()

    def ensure(self, nbytes: int, pinned: bool) -> None:
        if self.capacity >= nbytes and (self.pinned or not pinned):
            return
        self.buffer = self.image = None  # drop the old one first: peak memory of one buffer
        capacity = -(-(nbytes + nbytes // 8) // _GROWTH_QUANTUM) * _GROWTH_QUANTUM
        buffer = torch.empty(capacity + _IO_ALIGNMENT, dtype=torch.uint8, pin_memory=pinned)
        if not pinned:
            buffer.zero_()  # fault the pages in now rather than during a save
        skip = -buffer.data_ptr() % _IO_ALIGNMENT
        self.buffer, self.image = buffer, buffer[skip:skip + capacity]
        self.capacity, self.pinned = capacity, pinned

    @property
    def address(self) -> int:
        return self.image.data_ptr()


# ---- Handles ------------------------------------------------------------------------

_save_counter = itertools.count()


class SaveHandle:
    """One requested save. ``done()`` polls, ``result()`` waits and returns the final path or
    raises :class:`CheckpointError`; ``wait_staged()`` waits until the snapshot is taken."""

    def __init__(self, status, step: int, path: str, cuda_done: dict, sources: list):
        self._status = status
        self.step = step
        self.path = path
        self._cuda_done = cuda_done      # device -> event after the side-stream copy
        self._sources = sources          # storages kept alive until staged
        self._stream_waited = False
        self._reported = False
        self._warned = False
        self._sequence = next(_save_counter)
        self._barrier_hooks: list = []
        self.blocked_seconds = 0.0       # time the training thread spent in save() and barriers

    def done(self) -> bool:
        return self._status.done()

    def wait_staged(self) -> None:
        """Block until the snapshot is complete: afterwards the saved tensors may change.
        For CUDA tensors, the current streams wait for the copy (the host does not)."""
        start = time.perf_counter()
        self._status.wait_staged()
        if self._cuda_done and not self._stream_waited:
            for device, event in self._cuda_done.items():
                torch.cuda.current_stream(device).wait_event(event)
            self._stream_waited = True
        if not self._cuda_done:
            self._sources = None
        for hook in self._barrier_hooks:
            hook.remove()
        self._barrier_hooks = []
        self.blocked_seconds += time.perf_counter() - start

    def result(self, timeout: Optional[float] = None) -> str:
        """The committed file's path; raises CheckpointError if the save failed, TimeoutError
        if it is still running after ``timeout`` seconds."""
        if not self._status.wait(timeout):
            raise TimeoutError(f"checkpoint step {self.step} still being written after {timeout} s")
        error = self._error()
        if error is not None:
            self._reported = True
            raise error
        return self.path

    def exception(self) -> Optional[CheckpointError]:
        """None while running or after success, else the error (without raising it)."""
        return self._error() if self._status.done() else None

    @property
    def staged_seconds(self) -> float:
        """Seconds from save() to the snapshot's bytes being copied (CPU part)."""
        return self._status.staged_seconds

    @property
    def total_seconds(self) -> float:
        """Seconds from save() to the file being committed (fsynced and renamed)."""
        return self._status.done_seconds

    def _error(self) -> Optional[CheckpointError]:
        info = self._status.error()
        if info is None:
            return None
        errno, operation, filename, message = info
        return CheckpointError(errno, message, filename or None, step=self.step, operation=operation)

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error() else "committed")
        return f"SaveHandle(step={self.step}, path={self.path!r}, {state})"


# ---- The checkpointer ---------------------------------------------------------------

_live_checkpointers: "weakref.WeakSet[AsyncCheckpointer]" = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """An un-awaited save is never lost: finish every pending save before the interpreter exits."""
    for checkpointer in list(_live_checkpointers):
        try:
            checkpointer.close()
        except Exception as error:  # noqa: BLE001 - at exit, report and carry on
            warnings.warn(f"qrnn.checkpoint: a save failed before exit: {error}", RuntimeWarning, stacklevel=1)


class _CudaWaiter(threading.Thread):
    """Opens each save's gate once its side-stream copies finish (event.synchronize releases
    the GIL), so the C++ writer never touches CUDA or Python."""

    def __init__(self):
        super().__init__(name="qrnn-checkpoint-cuda-waiter", daemon=True)
        self.queue: "queue.SimpleQueue" = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            events, gate, handle = item
            try:
                for event in events.values():
                    event.synchronize()
                gate.open()
            except BaseException as error:  # noqa: BLE001 - the save must fail, not hang
                gate.fail(f"GPU copy failed: {error!r}")
            finally:
                handle._status.wait_staged()  # the CPU part may still be copying from its storages
                handle._sources = None


class AsyncCheckpointer:
    """Saves checkpoints of ``state`` in the background into ``directory`` (created if
    missing) as ``<prefix><step:012d>.pt``, keeping the ``keep_last`` highest steps (None:
    all) and holding at most ``max_pending`` snapshots in memory. ``copy_threads`` threads do
    the CPU staging copy in default mode (one thread in overlap mode). ``direct_io`` writes
    with O_DIRECT where the file system supports it (less CPU and page-cache churn)."""

    def __init__(self, directory: Union[str, os.PathLike], keep_last: Optional[int] = 3, max_pending: int = 1,
                 *, prefix: str = "ckpt-", copy_threads: Optional[int] = None, direct_io: bool = True,
                 _sync: bool = True, _fault: Optional[dict] = None):
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not prefix or os.sep in prefix or "\0" in prefix or prefix.startswith("."):
            raise ValueError(f"prefix must be a plain file-name start, got {prefix!r}")
        if copy_threads is None:
            copy_threads = max(1, min(4, os.cpu_count() or 1))
        if not isinstance(copy_threads, int) or copy_threads < 1:
            raise ValueError(f"copy_threads must be an int >= 1, got {copy_threads!r}")
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.keep_last = keep_last
        self.max_pending = max_pending
        self.prefix = prefix
        self.suffix = ".pt"
        self._name_re = re.compile(re.escape(prefix) + r"(\d+)" + re.escape(self.suffix) + r"\Z")
        self._copy_threads = copy_threads
        fault = _fault or {}
        self._writer = _C.CheckpointWriter(max_pending=max_pending, copy_threads=copy_threads, direct_io=direct_io,
                                           sync=_sync, fail_after_bytes=fault.get("after_bytes", 2**64 - 1),
                                           fail_errno=fault.get("errno", 0), fail_throw=fault.get("throw", False))
        self._slots = [_StagingSlot() for _ in range(max_pending)]
        self._handles: list[SaveHandle] = []
        self._lock = threading.RLock()
        self._streams: dict = {}
        self._cuda_waiter: Optional[_CudaWaiter] = None
        self._closed = False
        self._remove_stale_temporaries()
        _live_checkpointers.add(self)

    # -- public API --

    def save(self, state: Any, step: int, *, overlap_with: Union[torch.optim.Optimizer,
             Iterable[torch.optim.Optimizer], None] = None, block: bool = True) -> Optional[SaveHandle]:
        """Snapshot ``state`` and write it in the background as step ``step``.

        Returns a :class:`SaveHandle`, or None when ``block=False`` and ``max_pending`` saves
        are still in flight (the save is skipped). Raises :class:`CheckpointError` for an
        earlier save that failed (this save is then not made). With ``overlap_with`` (an
        optimizer or several), the snapshot completes in the background and the optimizers'
        next ``step()`` waits for it; see the module notes for when that is safe."""
        start = time.perf_counter()
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        optimizers = self._optimizers(overlap_with)
        with self._lock:
            self._check_open()
            self._raise_unreported()
            slot = self._acquire_slot(block)
            if slot is None:
                return None
            self._raise_unreported()  # the save we waited for may have failed
            data, stored = _pickle_state(state)
            path = os.path.join(self.directory, f"{self.prefix}{step:0{_STEP_DIGITS}d}{self.suffix}")
            on_gpu = [s.device.type != "cpu" for s in stored]
            for s, gpu in zip(stored, on_gpu):
                if gpu and s.device.type != "cuda":
                    raise TypeError(f"qrnn.checkpoint saves CPU and CUDA tensors, got one on {s.device}")
            sources = [(0 if gpu else s.storage.data_ptr(), s.nbytes) for s, gpu in zip(stored, on_gpu)]
            offsets, staging_size, _ = self._writer.plan(path, data, sources)
            slot.ensure(staging_size, pinned=any(on_gpu))
            gate, cuda_done = None, {}
            if any(on_gpu):
                gate = _C.CheckpointGate()
                cuda_done = self._stage_cuda(slot, stored, on_gpu, offsets)
            try:
                status = self._writer.submit(
                    path, data, sources, staging=slot.address, staging_capacity=slot.capacity, gate=gate,
                    keep_last=self.keep_last or 0, prefix=self.prefix, suffix=self.suffix,
                    copy_threads=1 if optimizers else self._copy_threads, block=True)
            except BaseException:
                for event in cuda_done.values():  # the slot is reused: let the copies land first
                    event.synchronize()
                raise
            handle = SaveHandle(status, step, path, cuda_done, [s.storage for s in stored])
            slot.handle = handle
            self._handles.append(handle)
            if gate is not None:
                self._waiter().queue.put((cuda_done, gate, handle))
        if optimizers:
            def barrier(optimizer, args, kwargs):
                handle.wait_staged()
            handle._barrier_hooks = [opt.register_step_pre_hook(barrier) for opt in optimizers]
            handle.blocked_seconds = time.perf_counter() - start
        else:
            handle.wait_staged()
            handle.blocked_seconds = time.perf_counter() - start
        return handle

    def wait(self) -> None:
        """Block until every save so far is committed; raise the first unreported failure."""
        with self._lock:
            for handle in list(self._handles):
                handle._status.wait()
            self._raise_unreported()

    def close(self) -> None:
        """wait(), then stop the writer threads and free the staging buffers. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            _live_checkpointers.discard(self)
            try:
                for handle in list(self._handles):
                    handle._status.wait()
            finally:
                self._writer.close()
                if self._cuda_waiter is not None:
                    self._cuda_waiter.queue.put(None)
                    self._cuda_waiter.join()
                self._slots = []
            self._raise_unreported()

    def latest(self) -> Optional[str]:
        """Path of the newest (highest step) committed checkpoint in the directory, or None.
        Temporary files of saves in progress are never returned."""
        best, best_step = None, -1
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return None
        for name in names:
            match = self._name_re.match(name)
            if match and int(match.group(1)) > best_step:
                best, best_step = name, int(match.group(1))
        return None if best is None else os.path.join(self.directory, best)

    def checkpoints(self) -> list[str]:
        """Paths of all committed checkpoints in the directory, oldest step first."""
        found = []
        for name in os.listdir(self.directory):
            match = self._name_re.match(name)
            if match:
                found.append((int(match.group(1)), os.path.join(self.directory, name)))
        return [path for _, path in sorted(found)]

    def __enter__(self) -> "AsyncCheckpointer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # an exception is already propagating: still finish the saves, do not mask it
            self.close()
        except CheckpointError as error:
            warnings.warn(f"qrnn.checkpoint: {error}", RuntimeWarning, stacklevel=2)

    def __del__(self):
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except Exception as error:  # noqa: BLE001 - never raise from a finalizer
            warnings.warn(f"qrnn.checkpoint: {error}", RuntimeWarning, stacklevel=1)

    # -- internals --

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("AsyncCheckpointer is closed")

    @staticmethod
    def _optimizers(overlap_with) -> list:
        if overlap_with is None:
            return []
        optimizers = [overlap_with] if isinstance(overlap_with, torch.optim.Optimizer) else list(overlap_with)
        for opt in optimizers:
            if not isinstance(opt, torch.optim.Optimizer):
                raise TypeError(f"overlap_with must be a torch.optim.Optimizer or several, got {type(opt).__name__}")
        return optimizers

    def _acquire_slot(self, block: bool) -> Optional[_StagingSlot]:
        for slot in self._slots:
            if slot.free():
                return slot
        if not block:
            return None
        oldest = min(self._slots, key=lambda s: s.handle._sequence)
        oldest.handle._status.wait()  # releases the GIL
        return oldest

    def _raise_unreported(self) -> None:
        """Forget finished saves; raise the oldest failure nobody has been told about yet."""
        error, remaining = None, []
        for handle in self._handles:
            if not handle._status.done():
                remaining.append(handle)
                continue
            if not handle._warned:
                handle._warned = True
                for note in handle._status.warnings():
                    warnings.warn(f"qrnn.checkpoint: {note}", RuntimeWarning, stacklevel=3)
            failure = None if handle._reported else handle._error()
            if failure is None:
                continue
            if error is None:
                handle._reported, error = True, failure
            else:
                remaining.append(handle)  # raised by the next call
        self._handles = remaining
        for slot in self._slots:
            if slot.handle is not None and slot.handle._status.done():
                slot.handle = None  # let its storages go
        if error is not None:
            raise error

    def _waiter(self) -> _CudaWaiter:
        if self._cuda_waiter is None:
            self._cuda_waiter = _CudaWaiter()
            self._cuda_waiter.start()
        return self._cuda_waiter

    def _stage_cuda(self, slot: _StagingSlot, stored: list, on_gpu: list, offsets: list) -> dict:
        """Queue the device->host copies on a side stream per device (after the work already
        queued on the current stream); returns device -> event marking their end."""
        by_device: dict = {}
        for s, gpu, offset in zip(stored, on_gpu, offsets):
            if gpu and s.nbytes:
                by_device.setdefault(s.device, []).append((s, offset))
        done = {}
        for device, items in by_device.items():
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = torch.cuda.Stream(device=device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for s, offset in items:
                    source = torch.empty(0, dtype=torch.uint8, device=device).set_(s.storage)
                    slot.image[offset:offset + s.nbytes].copy_(source, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            done[device] = event
        return done

    def _remove_stale_temporaries(self) -> None:
        """Delete temporary files left by processes that died while saving here."""
        temp_re = re.compile(r"\.(.+)\.tmp-(\d+)-\d+\Z")
        for name in os.listdir(self.directory):
            match = temp_re.match(name)
            if not match or not self._name_re.match(match.group(1)):
                continue
            pid = int(match.group(2))
            if pid == os.getpid():
                continue
            try:
                os.kill(pid, 0)
                continue  # still running: maybe saving right now
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            try:
                os.unlink(os.path.join(self.directory, name))
            except FileNotFoundError:
                pass


# ---- Reading ------------------------------------------------------------------------

def load(path: Union[str, os.PathLike], map_location=None, *, weights_only: bool = True, mmap: bool = False):
    """Load a checkpoint (any torch.save file). Plain ``torch.load`` reads these files too;
    this only sets the safe defaults (``weights_only=True``)."""
    return torch.load(os.fspath(path), map_location=map_location, weights_only=weights_only, mmap=mmap)


def verify(path: Union[str, os.PathLike]) -> None:
    """Check every record's CRC-32 (torch.load never does). Raises
    :class:`CorruptCheckpointError` naming the first damaged record; returns None when intact."""
    path = os.fspath(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        try:
            archive = zipfile.ZipFile(file)
            infos = archive.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as error:
            raise CorruptCheckpointError(path, None, f"no readable zip directory ({error})") from None
        if size == 0:
            raise CorruptCheckpointError(path, None, "empty file")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            for info in infos:
                problem = _check_record(view, info, size)
                if problem:
                    raise CorruptCheckpointError(path, info.filename, problem)


def _check_record(view: memoryview, info: zipfile.ZipInfo, size: int) -> Optional[str]:
    offset = info.header_offset
    if offset + 30 > size or bytes(view[offset:offset + 4]) != b"PK\x03\x04":
        return "local header missing or damaged"
    flags, method = struct.unpack("<HH", view[offset + 6:offset + 10])
    name_len, extra_len = struct.unpack("<HH", view[offset + 26:offset + 30])
    if bytes(view[offset + 30:offset + 30 + name_len]) != info.filename.encode():
        return "name in the local header differs from the directory"
    start = offset + 30 + name_len + extra_len
    end = start + info.compress_size
    if end > size:
        return "payload runs past the end of the file"
    if method != 0:
        return "compressed record (checkpoints store records uncompressed)"
    with view[start:end] as payload:
        crc = _C.checkpoint_crc32(payload)
    if crc != info.CRC:
        return f"CRC mismatch: directory says {info.CRC:08x}, payload has {crc:08x}"
    if flags & 0x08 and info.file_size and end + 8 <= size:
        signature, descriptor_crc = struct.unpack("<II", view[end:end + 8])
        if signature != 0x08074B50 or descriptor_crc != crc:
            return "data descriptor after the payload is damaged"
    return None
