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
layout to a temporary name in the same folder (locked while it writes), fsyncs it, renames it
over ``<directory>/ckpt-<step:012d>.pt``, fsyncs the folder, and deletes the checkpoints
committed before the ``keep_last`` most recent ones. A process killed at any moment never
leaves a partial file under a final name; the next writer into that folder removes its
temporary (only temporaries whose writer is gone: their lock is free, whatever process
namespace or host the writer ran in). Readers (``latest()``, ``checkpoints()``, ``load``)
never delete anything.

Order: the commit order (each commit is stamped after every earlier checkpoint in the
folder, as its modification time), not the step: after a rollback to an earlier step the
new saves are the latest and are kept. ``latest(order="step")`` gives the highest step.

Snapshot semantics: the file holds the values at the moment ``save()`` was called, even if
training changes every tensor right after (CPU tensors such as Adam's ``step`` included).

Overlap mode, ``save(state, step, overlap_with=optimizer)``: ``save()`` returns right after
pickling the structure; the staging copy runs while the next forward and backward pass run,
and ``optimizer.step()`` waits for it (a one-shot step pre-hook). This is safe when nothing
else modifies a saved tensor in place before that ``optimizer.step()``: not the forward pass
(BatchNorm running statistics, in-place buffer updates, an EMA updated in forward), not
``load_state_dict``, not a manual ``param.data.copy_``. Save such state in default mode, or
call ``handle.wait_staged()`` before modifying it.

Any number of overlap saves, checkpointers and user hooks may share an optimizer.

Errors (full disk, file-size limit, read-only or vanished folder, a failure inside the
writer thread) raise :class:`CheckpointError` from the next ``save()``, ``wait()`` or
``close()`` (and from that save's ``handle.result()``); the previous checkpoint is untouched
and no temporary file is left. A ``save()`` that reports an earlier failure still makes its
own save first (its handle is ``error.next_handle``): one failure costs one checkpoint.
``max_pending`` bounds the snapshots held in memory: a further ``save()`` waits for the
oldest, or returns ``None`` at once with ``block=False``.

Fork: in a child created by ``os.fork()`` a checkpointer inherited from the parent works
with fresh writer threads; the parent's saves stay the parent's (their handles raise
RuntimeError in the child), and nothing in the child waits for them.
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
import struct
import threading
import time
import warnings
import weakref
from typing import Any, Iterable, Optional, Union

import torch

from . import _C

__all__ = ["AsyncCheckpointer", "SaveHandle", "CheckpointError", "CorruptCheckpointError", "load", "verify"]

# Staging sizes, alignment, file names and order are the C++ writer's rules (qrnn._C).
_IO_ALIGNMENT = _C.checkpoint_staging_alignment  # staging images start here: the writer uses O_DIRECT


class CheckpointError(OSError):
    """A checkpoint was not saved. ``errno`` and ``filename`` say which system call failed on
    which file (``errno`` is 0 for a failure that was not a system call); ``step`` is the step
    of the lost save."""

    def __init__(self, errno: int, message: str, filename: Optional[str] = None, step: Optional[int] = None,
                 operation: str = ""):
        super().__init__(errno, message, filename)
        self.step = step
        self.operation = operation
        self.next_handle: Optional["SaveHandle"] = None  # set when a later save() reports it: that save's handle
        self._handle: Optional["SaveHandle"] = None


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
_LEGACY_STORAGE_NAMES = {
    torch.float32: "FloatStorage", torch.float64: "DoubleStorage", torch.float16: "HalfStorage",
    torch.bfloat16: "BFloat16Storage", torch.complex64: "ComplexFloatStorage",
    torch.complex128: "ComplexDoubleStorage", torch.int8: "CharStorage", torch.int16: "ShortStorage",
    torch.int32: "IntStorage", torch.int64: "LongStorage", torch.uint8: "ByteStorage", torch.bool: "BoolStorage",
    # Quantized tensors reduce through torch's own code, whose storages must keep their typed
    # class: as an UntypedStorage they load as uint8 and the tensor cannot be rebuilt.
    torch.qint8: "QInt8Storage", torch.quint8: "QUInt8Storage", torch.qint32: "QInt32Storage",
    torch.quint4x2: "QUInt4x2Storage", torch.quint2x4: "QUInt2x4Storage",
}
_LEGACY_STORAGE = {dt: getattr(torch, name) for dt, name in _LEGACY_STORAGE_NAMES.items()}


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
        pid: tuple
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
        args: tuple = (ref, obj.storage_offset(), tuple(obj.size()), obj.stride(), obj.requires_grad,
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

class _CudaRuntime:
    """The CUDA calls a save of GPU tensors makes: torch's. Tests substitute a stand-in so
    the GPU staging path runs on a machine without a GPU (tests/test_checkpoint_cuda_path.py)."""

    Stream = staticmethod(lambda device: torch.cuda.Stream(device=device))
    Event = staticmethod(lambda: torch.cuda.Event())
    current_stream = staticmethod(lambda device: torch.cuda.current_stream(device))
    stream = staticmethod(lambda stream: torch.cuda.stream(stream))
    pinned_empty = staticmethod(lambda nbytes: torch.empty(nbytes, dtype=torch.uint8, pin_memory=True))


_cuda = _CudaRuntime()


class _StagingSlot:
    """One reusable staging image: allocated once, grown rarely, freed on this thread."""

    def __init__(self):
        self.buffer: Any = None                     # CheckpointStaging, or a pinned tensor (CUDA saves)
        self.image: Optional[torch.Tensor] = None  # pinned only: page-aligned view the GPU copies into
        self.address = 0
        self.capacity = 0
        self.pinned = False
        self.handle: Optional[SaveHandle] = None   # the save using it, until done

    def free(self) -> bool:
        return self.handle is None or self.handle._status.done()

    def ensure(self, nbytes: int, pinned: bool, populate_threads: int = 0) -> None:
        """Room for an image of `nbytes`; a new buffer's first `nbytes` are faulted in on
        `populate_threads` threads (0: left to the copy, or to a background thread)."""
        if self.capacity >= nbytes and (self.pinned or not pinned):
            return
        self.buffer = self.image = None  # drop the old one first: peak memory of one buffer
        self.address = self.capacity = 0
        capacity = _C.checkpoint_staging_capacity(nbytes)
        if pinned:
            buffer = _cuda.pinned_empty(capacity + _IO_ALIGNMENT)
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


# ---- Handles ------------------------------------------------------------------------

_save_counter = itertools.count()
_fork_generation = 0  # bumped in a forked child: handles from before belong to the parent


def _parent_save(handle: "SaveHandle") -> bool:
    return handle._generation != _fork_generation


def _parents_save_error(handle: "SaveHandle") -> RuntimeError:
    return RuntimeError(f"checkpoint step {handle.step} was saved by the parent process before fork(); "
                        "its outcome is known only there")


# Overlap barriers: one permanent step pre-hook per optimizer, registered once and never
# removed (removing a hook while torch runs the hooks breaks optimizer.step()); it waits
# for every save queued on that optimizer since its last step.
_barrier_lock = threading.Lock()
_barriers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _step_barrier(optimizer, args, kwargs) -> None:
    with _barrier_lock:
        pending = _barriers.get(optimizer)
        handles = list(pending) if pending else []
        if pending:
            pending.clear()
    for handle in handles:
        handle._barrier_wait()


def _add_barrier(optimizer: torch.optim.Optimizer, handle: "SaveHandle") -> None:
    with _barrier_lock:
        pending = _barriers.get(optimizer)
        if pending is None:
            pending = _barriers[optimizer] = []
            optimizer.register_step_pre_hook(_step_barrier)
        pending.append(handle)


class SaveHandle:
    """One requested save. ``done()`` polls, ``result()`` waits and returns the final path or
    raises :class:`CheckpointError`; ``wait_staged()`` waits until the snapshot is taken."""

    def __init__(self, status, step: int, path: str, cuda_done: dict, sources: list):
        self._status = status
        self.step = step
        self.path = path
        self._cuda_done = cuda_done      # device -> event after the side-stream copy
        self._sources: Optional[list] = sources  # storages kept alive until staged
        self._stream_waited = False
        self._reported = False
        self._warned = False
        self._sequence = next(_save_counter)
        self._generation = _fork_generation
        self._barrier_done = False
        self.blocked_seconds = 0.0       # time the training thread spent in save() and barriers

    def done(self) -> bool:
        if _parent_save(self):
            raise _parents_save_error(self)
        return self._status.done()

    def wait_staged(self) -> None:
        """Block until the snapshot is complete: afterwards the saved tensors may change.
        For CUDA tensors, the current streams wait for the copy (the host does not)."""
        if _parent_save(self):
            return  # the parent's snapshot: nothing in this process waits for it
        start = time.perf_counter()
        self._status.wait_staged()
        if self._cuda_done and not self._stream_waited:
            for device, event in self._cuda_done.items():
                _cuda.current_stream(device).wait_event(event)
            self._stream_waited = True
        if not self._cuda_done:
            self._sources = None
        self._barrier_done = True
        self.blocked_seconds += time.perf_counter() - start

    def _barrier_wait(self) -> None:
        if not self._barrier_done:
            self.wait_staged()

    def result(self, timeout: Optional[float] = None) -> str:
        """The committed file's path; raises CheckpointError if the save failed, TimeoutError
        if it is still running after ``timeout`` seconds."""
        if _parent_save(self):
            raise _parents_save_error(self)
        if not self._status.wait(timeout):
            raise TimeoutError(f"checkpoint step {self.step} still being written after {timeout} s")
        error = self._error()
        if error is not None:
            self._reported = True
            raise error
        return self.path

    def exception(self) -> Optional[CheckpointError]:
        """None while running or after success, else the error (without raising it)."""
        if _parent_save(self):
            raise _parents_save_error(self)
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
        if _parent_save(self):
            return f"SaveHandle(step={self.step}, path={self.path!r}, the parent process's)"
        state = "running" if not self.done() else ("failed" if self._error() else "committed")
        return f"SaveHandle(step={self.step}, path={self.path!r}, {state})"


# ---- The checkpointer ---------------------------------------------------------------

_live_checkpointers: "weakref.WeakSet[AsyncCheckpointer]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """The writer threads, the CUDA waiter and any lock holder stayed in the parent."""
    global _fork_generation, _barrier_lock, _barriers
    _fork_generation += 1
    _barrier_lock = threading.Lock()
    _barriers = weakref.WeakKeyDictionary()  # the parent's pending barriers are not ours to wait for
    for checkpointer in list(_live_checkpointers):
        checkpointer._reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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
    missing) as ``<prefix><step:012d>.pt``, keeping the ``keep_last`` most recently committed
    checkpoints (None: all) and holding at most ``max_pending`` snapshots in memory. ``copy_threads`` threads do
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
        self._copy_threads = copy_threads
        fault = _fault or {}
        self._writer_options = dict(max_pending=max_pending, copy_threads=copy_threads, direct_io=direct_io,
                                    sync=_sync, fail_after_bytes=fault.get("after_bytes", 2**64 - 1),
                                    fail_errno=fault.get("errno", 0), fail_throw=fault.get("throw", False),
                                    fail_times=fault.get("times", -1))
        self._writer = _C.CheckpointWriter(**self._writer_options)
        self._slots = [_StagingSlot() for _ in range(max_pending)]
        self._handles: list[SaveHandle] = []
        self._lock = threading.RLock()
        self._streams: dict = {}
        self._cuda_waiter: Optional[_CudaWaiter] = None
        self._closed = False
        # Nothing is deleted here: a checkpointer may only read (an evaluator's). The writer
        # removes dead writers' temporaries before its first save into the folder.
        _live_checkpointers.add(self)

    # -- public API --

    def save(self, state: Any, step: int, *, overlap_with: Union[torch.optim.Optimizer,
             Iterable[torch.optim.Optimizer], None] = None, block: bool = True) -> Optional[SaveHandle]:
        """Snapshot ``state`` and write it in the background as step ``step``.

        Returns a :class:`SaveHandle`, or None when ``block=False`` and ``max_pending`` saves
        are still in flight (the save is skipped). Raises :class:`CheckpointError` for an
        earlier save that failed, after making this save (its handle: the error's
        ``next_handle``). With ``overlap_with`` (an
        optimizer or several), the snapshot completes in the background and the optimizers'
        next ``step()`` waits for it; see the module notes for when that is safe."""
        start = time.perf_counter()
        step = operator.index(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        optimizers = self._optimizers(overlap_with)
        with self._lock:
            self._check_open()
            earlier = self._take_unreported()
            slot = self._acquire_slot(block)
            if slot is None:
                if earlier is not None:
                    raise earlier
                return None
            if earlier is None:
                earlier = self._take_unreported()  # the save we waited for may have failed
            try:
                handle = self._submit(state, step, optimizers, slot)
            except BaseException:
                if earlier is not None and earlier._handle is not None:  # failed before starting: report it later
                    earlier._handle._reported = False
                    self._handles.insert(0, earlier._handle)
                raise
        if optimizers:
            for opt in optimizers:
                _add_barrier(opt, handle)
            handle.blocked_seconds = time.perf_counter() - start
        else:
            handle.wait_staged()
            handle.blocked_seconds = time.perf_counter() - start
        if earlier is not None:
            earlier.next_handle = handle
            raise earlier
        return handle

    def _submit(self, state, step: int, optimizers: list, slot: "_StagingSlot") -> SaveHandle:
        """Under the lock: pickle, plan, stage (or queue the GPU copies) and submit one save."""
        if self._writer is None:
            self._writer = _C.CheckpointWriter(**self._writer_options)
        data, stored = _pickle_state(state)
        path = os.path.join(self.directory, _C.checkpoint_file_name(self.prefix, step, self.suffix))
        on_gpu = [s.device.type != "cpu" for s in stored]
        for s, gpu in zip(stored, on_gpu):
            if gpu and s.device.type != "cuda":
                raise TypeError(f"qrnn.checkpoint saves CPU and CUDA tensors, got one on {s.device}")
        sources = [(0 if gpu else s.storage.data_ptr(), s.nbytes) for s, gpu in zip(stored, on_gpu)]
        offsets, staging_size, _ = self._writer.plan(path, data, sources)
        # Overlap mode: the background copy faults the pages in, save() must not wait for it.
        slot.ensure(staging_size, pinned=any(on_gpu), populate_threads=0 if optimizers else self._copy_threads)
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
        return handle

    def reserve(self, state: Any, *, wait: bool = False) -> None:
        """Allocate the staging memory that saves of ``state`` (or of a state with tensors of
        the same sizes) need, in every free slot, and fault it in on a background thread, so
        that even the first save() only copies. Call it once the state has its final sizes
        (e.g. after the first optimizer step creates Adam's state); a save() that comes
        first is still correct (the copy and the background thread share the memory safely).
        ``wait=True`` returns once the memory is in place."""
        with self._lock:
            self._check_open()
            if self._writer is None:
                self._writer = _C.CheckpointWriter(**self._writer_options)
            data, stored = _pickle_state(state)
            path = os.path.join(self.directory, _C.checkpoint_file_name(self.prefix, 0, self.suffix))
            _, staging_size, _ = self._writer.plan(path, data, [(0, s.nbytes) for s in stored])
            pinned = any(s.device.type != "cpu" for s in stored)
            buffers = []
            for slot in self._slots:
                if slot.free():
                    slot.ensure(staging_size, pinned=pinned)
                    if not slot.pinned:
                        buffers.append(slot.buffer)  # the thread's reference keeps it mapped
        if not buffers:
            return
        thread = threading.Thread(target=lambda: [b.populate(0, staging_size) for b in buffers],
                                  name="qrnn-checkpoint-reserve", daemon=True)
        thread.start()
        if wait:
            thread.join()

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
                if self._writer is not None:
                    self._writer.close()
                if self._cuda_waiter is not None:
                    self._cuda_waiter.queue.put(None)
                    self._cuda_waiter.join()
                self._slots = []
            self._raise_unreported()

    def latest(self, order: str = "commit") -> Optional[str]:
        """Path of the most recently committed checkpoint in the directory (``order="step"``:
        of the highest step), or None. Temporary files of saves in progress are never
        returned, and nothing is deleted."""
        found = self._list(order)
        return os.path.join(self.directory, found[-1][0]) if found else None

    def checkpoints(self, order: str = "commit") -> list[str]:
        """Paths of all committed checkpoints in the directory, oldest commit first
        (``order="step"``: lowest step first). Reads only."""
        return [os.path.join(self.directory, name) for name, _, _ in self._list(order)]

    def _list(self, order: str) -> list:
        if order not in ("commit", "step"):
            raise ValueError(f"order must be 'commit' or 'step', got {order!r}")
        return _C.checkpoint_list(self.directory, self.prefix, self.suffix, by_step=order == "step")

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
        oldest = min(self._slots, key=lambda s: s.handle._sequence if s.handle is not None else -1)
        if oldest.handle is not None:
            oldest.handle._status.wait()  # releases the GIL
        return oldest

    def _reset_after_fork(self) -> None:
        """In a forked child: fresh lock, no inherited saves, a new writer (fresh threads)."""
        self._lock = threading.RLock()
        self._handles = []
        for slot in self._slots:
            slot.handle = None
        self._cuda_waiter = None
        self._streams = {}
        # The inherited writer has no threads here (its C++ side leaks it); a new one starts at
        # the first save, so children that never save (data-loader workers) start no threads.
        self._writer = None

    def _raise_unreported(self) -> None:
        error = self._take_unreported()
        if error is not None:
            raise error

    def _take_unreported(self) -> Optional[CheckpointError]:
        """Forget finished saves; return the oldest failure nobody has been told about yet
        (marked as told)."""
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
                failure._handle = handle  # to un-report it if the save() reporting it fails itself
            else:
                remaining.append(handle)  # raised by the next call
        self._handles = remaining
        for slot in self._slots:
            if slot.handle is not None and slot.handle._status.done():
                slot.handle = None  # let its storages go
        return error

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
                stream = self._streams[device] = _cuda.Stream(device)
            stream.wait_stream(_cuda.current_stream(device))
            with _cuda.stream(stream):
                image = slot.image
                assert image is not None  # pinned slots always have their image
                for s, offset in items:
                    source = torch.empty(0, dtype=torch.uint8, device=s.storage.device).set_(s.storage)
                    image[offset:offset + s.nbytes].copy_(source, non_blocking=True)
                event = _cuda.Event()
                event.record(stream)
            done[device] = event
        return done


# ---- Reading ------------------------------------------------------------------------

def load(path: Union[str, os.PathLike], map_location=None, *, weights_only: bool = True, mmap: bool = False):
    """Load a checkpoint (any torch.save file). Plain ``torch.load`` reads these files too;
    this only sets the safe defaults (``weights_only=True``)."""
    return torch.load(os.fspath(path), map_location=map_location, weights_only=weights_only, mmap=mmap)


def verify(path: Union[str, os.PathLike]) -> None:
    """Check the whole archive: every central-directory field against its local header,
    data descriptor and the data (names, offsets, sizes, flags, method, CRC-32, which
    torch.load never checks), the end records, and that the records tile the file. Raises
    :class:`CorruptCheckpointError` (never another exception for a damaged file) naming the
    first damaged record; returns None when intact. A file it accepts loads as written."""
    path = os.fspath(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size == 0:
            raise CorruptCheckpointError(path, None, "empty file")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
            try:
                problem = _check_archive(view, size)
            except (struct.error, IndexError, ValueError, UnicodeDecodeError, OverflowError) as error:
                problem = (None, f"unreadable zip structure ({type(error).__name__}: {error})")
    if problem is not None:
        raise CorruptCheckpointError(path, problem[0], problem[1])


class _Damaged(Exception):
    def __init__(self, record: Optional[str], problem: str):
        super().__init__(problem)
        self.record, self.problem = record, problem


_U32, _U16 = 0xFFFFFFFF, 0xFFFF
_ALLOWED_FLAGS = 0x0808  # data descriptor, UTF-8 names: anything else (encryption...) is not a checkpoint


def _check_archive(view: memoryview, size: int) -> Optional[tuple]:
    try:
        _walk_archive(view, size)
    except _Damaged as damaged:
        return damaged.record, damaged.problem
    return None


def _walk_archive(view: memoryview, size: int) -> None:
    def need(ok: bool, problem: str, record: Optional[str] = None) -> None:
        if not ok:
            raise _Damaged(record, problem)

    def read(fmt: str, offset: int) -> tuple:
        need(0 <= offset and offset + struct.calcsize(fmt) <= size, "a header runs past the end of the file")
        return struct.unpack_from(fmt, view, offset)

    # End of central directory: exactly at the end (no comment), ZIP64 records right before.
    need(size >= 22, "too short for a zip archive")
    end = size - 22
    sig, disk, cd_disk, n_here, n_total, cd_size, cd_offset, comment = read("<IHHHHIIH", end)
    need(sig == 0x06054B50 and comment == 0, "end of central directory record missing or damaged")
    need(disk == 0 and cd_disk == 0 and n_here == n_total, "end of central directory: multi-disk fields")
    cd_end = end
    if size >= 22 + 20 and read("<I", end - 20)[0] == 0x07064B50:
        _, z_disk, z_offset, z_disks = read("<IIQI", end - 20)
        need(z_disk == 0 and z_disks == 1 and z_offset + 56 == end - 20, "ZIP64 end locator damaged")
        sig, rec_size, _, _, disk, cd_disk, n64_here, n64, cd64_size, cd64_offset = read("<IQHHIIQQQQ", z_offset)
        need(sig == 0x06064B50 and rec_size == 44 and disk == 0 and cd_disk == 0 and n64_here == n64,
             "ZIP64 end of central directory record damaged")
        need(n_total in (n64, _U16) and cd_size in (cd64_size, _U32) and cd_offset in (cd64_offset, _U32),
             "end of central directory disagrees with its ZIP64 record")
        n_total, cd_size, cd_offset, cd_end = n64, cd64_size, cd64_offset, z_offset
    need(cd_offset + cd_size == cd_end, "central directory size or offset damaged")

    names: set = set()
    prefix = None
    cursor, tile = cd_offset, 0  # central directory position; where the next local record must start
    for _ in range(n_total):
        need(cursor + 46 <= cd_end, "central directory shorter than its entry count")
        (sig, _made_by, version, flags, method, mtime, mdate, crc, csize, usize, name_len, extra_len, comment_len,
         disk, _internal, external, offset) = read("<IHHHHHHIIIHHHHHII", cursor)
        need(sig == 0x02014B50, "central directory entry signature damaged")
        raw_name = bytes(view[cursor + 46:cursor + 46 + name_len])
        name = raw_name.decode("utf-8", errors="replace")
        need(cursor + 46 + name_len + extra_len + comment_len <= cd_end, "central directory entry runs past its end",
             name)
        need(flags & ~_ALLOWED_FLAGS == 0 and method == 0, "flags or compression method damaged", name)
        need(disk == 0 and external & 0x10 == 0 and not name.endswith("/"), "attributes damaged", name)
        need("/" in name and name not in names, "name damaged", name)
        record_prefix = name.split("/", 1)[0]
        need(prefix is None or record_prefix == prefix, "name outside the archive's folder", name)
        prefix = record_prefix
        names.add(name)
        # ZIP64 extra: 64-bit values for exactly the 32-bit fields that overflowed.
        wide = {}
        extra = cursor + 46 + name_len
        extra_end = extra + extra_len
        while extra < extra_end:
            need(extra + 4 <= extra_end, "extra field damaged", name)
            kind, length = read("<HH", extra)
            need(extra + 4 + length <= extra_end, "extra field damaged", name)
            if kind == 1:
                fields = [f for f, v in (("usize", usize), ("csize", csize), ("offset", offset)) if v == _U32]
                need(length == 8 * len(fields), "ZIP64 extra field damaged", name)
                for k, f in enumerate(fields):
                    wide[f] = read("<Q", extra + 4 + 8 * k)[0]
            extra += 4 + length
        usize, csize, offset = wide.get("usize", usize), wide.get("csize", csize), wide.get("offset", offset)
        need(_U32 not in (usize, csize, offset) or len(wide) > 0, "ZIP64 extra field missing", name)
        need(usize == csize, "stored record whose sizes differ", name)
        cursor = extra_end + comment_len

        # Local header: same name, flags, method; records tile the file in order.
        need(offset == tile, "local header offset damaged", name)
        (sig, l_version, l_flags, l_method, l_time, l_date, l_crc, l_csize, l_usize, l_name_len,
         l_extra_len) = read("<IHHHHHIIIHH", offset)
        need(sig == 0x04034B50, "local header missing or damaged", name)
        need(bytes(view[offset + 30:offset + 30 + l_name_len]) == raw_name,
             "name in the local header differs from the directory", name)
        need((l_version, l_flags, l_method, l_time, l_date) == (version, flags, method, mtime, mdate),
             "local header differs from the directory", name)
        if flags & 0x08:
            need(l_crc in (0, crc) and l_csize in (0, _U32, csize) and l_usize in (0, _U32, usize),
                 "local header sizes or CRC damaged", name)
        else:
            need(l_crc == crc and l_csize in (_U32, csize) and l_usize in (_U32, usize),
                 "local header sizes or CRC damaged", name)
        start = offset + 30 + l_name_len + l_extra_len
        stop = start + csize
        need(stop <= cd_offset, "payload runs past the central directory", name)
        with view[start:stop] as payload:
            actual = _C.checkpoint_crc32(payload)
        need(actual == crc, f"CRC mismatch: directory says {crc:08x}, payload has {actual:08x}", name)
        tile = stop
        if flags & 0x08:  # data descriptor: optional signature, CRC, sizes (64-bit for ZIP64 records)
            if read("<I", tile)[0] == 0x08074B50:
                tile += 4
            fmt = "<IQQ" if wide else "<III"
            need(read(fmt, tile) == (crc, csize, usize), "data descriptor damaged", name)
            tile += struct.calcsize(fmt)
    need(cursor == cd_end, "central directory size disagrees with its entries")
    need(tile == cd_offset, "bytes between the last record and the central directory")
