"""AsyncCheckpointer: the Python front of the C++ writer (qrnn._C.CheckpointWriter)."""

from __future__ import annotations

import atexit
import errno as errno_module
import os
import queue
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterable, NamedTuple, Optional, Union

import torch

from .. import _C
from . import staging
from .errors import CheckpointError
from .folder import PREFIX, SUFFIX, CheckpointFolder, check_naming, check_step
from .handle import PendingSave, SaveHandle, add_barrier
from .pickler import pickle_state
from .staging import StagingSlot

_live_checkpointers: weakref.WeakSet = weakref.WeakSet()
_MEMORY_MARGIN = 64 << 20  # left free for everything else when a staging image is allocated


def _checkpoint_error(error: OSError, step: Optional[int] = None, operation: str = "") -> CheckpointError:
    """A folder operation's OSError (its message one sentence already) as a CheckpointError."""
    message = error.strerror if error.strerror else str(error)
    return CheckpointError(error.errno or 0, message, error.filename, step=step, operation=operation)


def _report_warnings(notes: Iterable[str], stacklevel: int = 3) -> None:
    """A commit's warnings (e.g. a folder its file system cannot fsync), from the public call."""
    for note in notes:
        warnings.warn(f"qrnn.checkpoint: {note}", RuntimeWarning, stacklevel=stacklevel)


class _Written:
    """The status of a save written on the calling thread (no staging image): already done."""

    def __init__(self, notes: list, seconds: float):
        self._notes, self.staged_seconds, self.done_seconds = notes, seconds, seconds

    def done(self) -> bool:
        return True

    def wait(self, timeout: Optional[float] = None) -> bool:
        return True

    def wait_staged(self) -> None:
        return None

    def error(self) -> None:
        return None

    def warnings(self) -> list:
        return self._notes


def _after_fork_in_child() -> None:
    """The writer threads, the CUDA waiter and any lock holder stayed in the parent."""
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
        self.queue: queue.SimpleQueue = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            events, gate, save = item
            try:
                for event in events.values():
                    event.synchronize()
                gate.open()
            except BaseException as error:  # noqa: BLE001 - the save must fail, not hang
                gate.fail(f"GPU copy failed: {error!r}")
            finally:
                save.gpu_copies_landed()  # the CPU part may still be copying from its storages


class SaveTarget(NamedTuple):
    """Where one save goes: its final path, the open folder holding it (every file operation
    is relative to it) and the retention its commit applies (keep_last 0: none)."""

    path: str
    folder: Any
    keep_last: int = 0
    prefix: str = ""
    suffix: str = ""


class SaveQueue:
    """The save machinery an AsyncCheckpointer and ``async_save`` share: one C++ writer (its
    threads), ``max_pending`` staging slots, the saves in flight and their unreported
    failures. Where each save goes is its :class:`SaveTarget`."""

    _warn_depth = 3  # frames from a warning in _save_unstaged up to the public call

    def __init__(self, max_pending: int = 1, *, copy_threads: Optional[int] = None, direct_io: bool = True,
                 private: bool = False, _sync: bool = True):
        copy_threads = self.check_options(max_pending, copy_threads)
        self._file_mode = 0o600 if private else 0o666
        self._sync = _sync
        self.max_pending = max_pending
        self._copy_threads = copy_threads
        self._writer_options = dict(max_pending=max_pending, copy_threads=copy_threads, direct_io=direct_io,
                                    sync=_sync)
        self._writer: Any = self._new_writer()
        self._slots = [StagingSlot() for _ in range(max_pending)]
        self._saves: list[PendingSave] = []
        self._lock = threading.RLock()
        self._streams: dict = {}
        self._cuda_waiter: Optional[_CudaWaiter] = None
        self._closed = False
        _live_checkpointers.add(self)

    @staticmethod
    def check_options(max_pending: Any, copy_threads: Any) -> int:
        """ValueError for a bad ``max_pending`` or ``copy_threads``; the copy threads to use."""
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        if copy_threads is None:
            copy_threads = max(1, min(4, os.cpu_count() or 1))
        if not isinstance(copy_threads, int) or copy_threads < 1:
            raise ValueError(f"copy_threads must be an int >= 1, got {copy_threads!r}")
        return copy_threads

    # -- shared by every front --

    def wait(self) -> None:
        """Block until every save so far is committed; raise the first unreported failure."""
        with self._lock:
            for save in list(self._saves):
                save.wait()
            self._raise_unreported()

    def close(self) -> None:
        """wait(), then stop the writer threads and free the staging buffers. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            _live_checkpointers.discard(self)
            try:
                for save in list(self._saves):
                    save.wait()
            finally:
                if self._writer is not None:
                    self._writer.close()
                self._release()
                if self._cuda_waiter is not None:
                    self._cuda_waiter.queue.put(None)
                    self._cuda_waiter.join()
                self._slots = []
            self._raise_unreported()

    def __del__(self):
        if getattr(self, "_closed", True):
            return
        try:
            self.close()
        except Exception as error:  # noqa: BLE001 - never raise from a finalizer
            warnings.warn(f"qrnn.checkpoint: {error}", RuntimeWarning, stacklevel=1)

    # -- internals --

    def _new_writer(self):
        """The C++ writer (a test checkpointer overrides this to inject disk failures)."""
        return _C.CheckpointWriter(**self._writer_options)

    def _release(self) -> None:
        """close(): after the writer stopped (AsyncCheckpointer lets go of its writer lock)."""

    def _memory_shortage(self, slot: StagingSlot, nbytes: int, pinned: bool) -> Optional[str]:
        """Why a staging image of ``nbytes`` must not be allocated now (None: it may): more
        than the memory cgroup leaves free (an image that fits the address space but not the
        cgroup is OOM-killed once its pages are touched)."""
        if slot.capacity >= nbytes and (slot.pinned or not pinned):
            return None  # no allocation
        headroom = staging.memory_headroom()
        if headroom is None:
            return None
        free, limit = headroom
        free += slot.capacity  # the old image goes first
        if nbytes + _MEMORY_MARGIN <= free:
            return None
        return (f"its staging image needs {nbytes} bytes and the memory cgroup leaves {free} bytes free "
                f"of its {limit}-byte limit")

    def _save(self, state: Any, step: Optional[int], optimizers: list, block: bool, start: float,
              target: Callable[[], SaveTarget]) -> Optional[SaveHandle]:
        """save()'s steps for any front: report an earlier failure after making this save,
        wait for a slot, snapshot and submit to ``target()`` (asked under the lock)."""
        with self._lock:
            self._check_open()
            earlier = self._take_unreported()
            slot = self._acquire_slot(block)
            if slot is None:
                if earlier is not None:
                    raise earlier[0]
                return None
            if earlier is None:
                earlier = self._take_unreported()  # the save we waited for may have failed
            try:
                save = self._submit(state, step, optimizers, slot, target())
            except BaseException:
                if earlier is not None:  # failed before starting: report it later
                    earlier[1].reported = False
                    self._saves.insert(0, earlier[1])
                raise
        if optimizers:
            for opt in optimizers:
                add_barrier(opt, save)
        else:
            save.wait_staged()
        save.blocked_seconds = time.perf_counter() - start
        if earlier is not None:
            earlier[0].next_handle = save.handle
            raise earlier[0]
        return save.handle

    def _save_unstaged(self, state: Any, step: Optional[int], why: str, target: SaveTarget) -> PendingSave:
        """No staging image: write from the live tensors on this thread (torch.save's writer,
        one storage at a time), by the same commit protocol, after every earlier save."""
        start = time.perf_counter()
        path = target.path
        warnings.warn(f"qrnn.checkpoint: checkpoint '{path}' is written from the live tensors, blocking "
                      f"like torch.save: {why}", RuntimeWarning, stacklevel=self._warn_depth + 2)
        for earlier in list(self._saves):
            earlier.wait()  # commit order: theirs first
        name = os.path.basename(path)
        folder = target.folder
        try:
            fd, temporary = folder.create_temporary(name, self._file_mode)
        except OSError as error:
            raise _checkpoint_error(error, step=step, operation="create") from None
        try:
            with os.fdopen(os.dup(fd), "wb") as file:
                torch.save(state, file)
        except BaseException as error:
            os.close(fd)
            try:
                os.unlink(temporary, dir_fd=folder.fd)
            except OSError:
                pass
            if not isinstance(error, (OSError, MemoryError, RuntimeError)):
                raise
            code = getattr(error, "errno", None) or errno_module.ENOMEM
            raise CheckpointError(code, f"checkpoint '{path}' was not saved: {why}; writing it from the live "
                                  f"tensors failed too: {type(error).__name__}: {error}", path, step=step,
                                  operation="write") from None
        try:
            notes = folder.commit(fd, temporary, name, keep_last=target.keep_last, prefix=target.prefix,
                                  suffix=target.suffix, sync=self._sync)
        except OSError as error:
            raise _checkpoint_error(error, step=step, operation="commit") from None
        save = PendingSave(_Written(notes, time.perf_counter() - start), step, path, {}, [])
        self._saves.append(save)
        return save

    def _live_writer(self):
        """The writer, new after a fork (with threads of this process)."""
        if self._writer is None:
            self._writer = self._new_writer()
        return self._writer

    def _submit(self, state, step: Optional[int], optimizers: list, slot: StagingSlot,
                target: SaveTarget) -> PendingSave:
        """Under the lock: pickle, plan, stage (or queue the GPU copies) and submit one save."""
        data, stored = pickle_state(state)
        on_gpu = [s.device.type != "cpu" for s in stored]
        for s, gpu in zip(stored, on_gpu):
            if gpu and s.device.type != "cuda":
                raise TypeError(f"qrnn.checkpoint saves CPU and CUDA tensors, got one on {s.device}")
        sources = [(0 if gpu else s.storage.data_ptr(), s.nbytes) for s, gpu in zip(stored, on_gpu)]
        path = target.path
        # Laid out once: the offsets place the GPU copies, and submit() writes by the same plan.
        plan = _C.checkpoint_plan(path, data, sources, keep_last=target.keep_last, prefix=target.prefix,
                                  suffix=target.suffix, copy_threads=1 if optimizers else self._copy_threads,
                                  folder=target.folder, file_mode=self._file_mode)
        staging_size = plan.staging_size
        short = self._memory_shortage(slot, staging_size, any(on_gpu))
        if short is None:
            try:
                # Overlap mode: the background copy faults the pages in, save() must not wait for it.
                slot.ensure(staging_size, pinned=any(on_gpu),
                            populate_threads=0 if optimizers else self._copy_threads)
            except (MemoryError, RuntimeError) as error:  # no address space, no pinned memory
                short = f"its staging image of {staging_size} bytes could not be allocated ({error})"
        if short is not None:
            return self._save_unstaged(state, step, short, target)
        gate, cuda_done = None, {}
        if any(on_gpu):
            gate = _C.CheckpointGate()
            cuda_done = slot.copy_from_gpu(stored, on_gpu, plan.record_offsets, self._streams)
        try:
            status = self._live_writer().submit(plan, staging=slot.address, staging_capacity=slot.capacity,
                                                gate=gate, block=True)
        except BaseException:
            for event in cuda_done.values():  # the slot is reused: let the copies land first
                event.synchronize()
            raise
        save = PendingSave(status, step, path, cuda_done, [s.storage for s in stored])
        slot.save = save
        self._saves.append(save)
        if gate is not None:
            self._waiter().queue.put((cuda_done, gate, save))
        return save

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

    def _acquire_slot(self, block: bool) -> Optional[StagingSlot]:
        for slot in self._slots:
            if slot.free():
                return slot
        if not block:
            return None
        oldest = min(self._slots, key=lambda s: s.save.sequence if s.save is not None else -1)
        if oldest.save is not None:
            oldest.save.wait()  # releases the GIL
        return oldest

    def _reset_after_fork(self) -> None:
        """In a forked child: fresh lock, no inherited saves, a new writer (fresh threads)."""
        self._lock = threading.RLock()
        self._saves = []
        for slot in self._slots:
            slot.save = None
        self._cuda_waiter = None
        self._streams = {}
        # The inherited writer has no threads here (its C++ side leaks it); a new one starts at
        # the first save, so children that never save (data-loader workers) start no threads.
        self._writer = None

    def _raise_unreported(self) -> None:
        earlier = self._take_unreported()
        if earlier is not None:
            raise earlier[0]

    def _take_unreported(self) -> Optional[tuple]:
        """Forget finished saves; return the oldest failure nobody has been told about yet
        (marked as told) and its save."""
        earlier, remaining = None, []
        for save in self._saves:
            if not save.finished():
                remaining.append(save)
                continue
            _report_warnings(save.take_warnings(), stacklevel=4)
            failure = None if save.reported else save.error()
            if failure is None:
                continue
            if earlier is None:
                save.reported = True
                earlier = (failure, save)  # the save, to un-report it if the save() reporting it fails itself
            else:
                remaining.append(save)  # raised by the next call
        self._saves = remaining
        for slot in self._slots:
            if slot.save is not None and slot.save.finished():
                slot.save = None  # let its storages go
        return earlier

    def _waiter(self) -> _CudaWaiter:
        if self._cuda_waiter is None:
            self._cuda_waiter = _CudaWaiter()
            self._cuda_waiter.start()
        return self._cuda_waiter


class AsyncCheckpointer(SaveQueue):
    """Saves checkpoints of ``state`` in the background into ``directory`` as
    ``<prefix><step:012d>.pt``, in ``torch.save``'s format.

    Args:
        directory: the folder (created with its parents if missing).
        keep_last: how many of the most recently committed checkpoints to keep (an int >= 1;
            None keeps all). Older ones are deleted after each commit.
        max_pending: at most this many snapshots are held in memory (int >= 1); a further
            ``save()`` waits for the oldest, or is skipped with ``block=False``.
        prefix: the start of the checkpoint file names (a plain name not starting with
            ``.``); one writer per folder and prefix.
        copy_threads: threads doing the CPU staging copy in default mode (one in overlap
            mode); None: up to 4, as the CPUs allow.
        direct_io: write with O_DIRECT where the file system supports it (less CPU and
            page-cache churn).
        private: create every file with mode 0600 (else 0666; the umask applies to both).

    Raises:
        TypeError, ValueError: a bad option, named, before the folder is created.
        OSError: the folder cannot be created or opened (as the system reports it).

    Use it as a context manager, or call ``close()``: it waits for every pending save and
    raises the first failure nobody was told about.

    The folder is opened once, here (created with its parents, each fsynced); every later
    create, rename, fsync, listing and unlink is relative to it and follows no symbolic link
    in it, so renaming the folder, swapping it for a link or a ``chdir`` redirects nothing.
    The first ``save()``, ``write_file()`` or ``publish()`` takes the folder's writer lock
    for ``prefix`` (one writer per folder and prefix, in any process, container or host),
    or ``lock()`` takes it earlier; a second writer gets a :class:`CheckpointError` naming
    the holder. Reading takes no lock."""

    def __init__(self, directory: Union[str, os.PathLike], keep_last: Optional[int] = 3, max_pending: int = 1,
                 *, prefix: str = PREFIX, copy_threads: Optional[int] = None, direct_io: bool = True,
                 private: bool = False, _sync: bool = True):
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be an int >= 1 or None, got {keep_last!r}")
        check_naming(prefix, SUFFIX)
        self.check_options(max_pending, copy_threads)  # before the folder is created
        self.directory = os.fspath(directory)
        self._where = os.path.abspath(self.directory)  # paths handed out stay right after a chdir
        self._folder: Any = _C.CheckpointFolder(self._where, create=True)  # OSError as the system says
        self._locked = False
        self.keep_last = keep_last
        self.prefix = prefix
        self.suffix = SUFFIX
        # Nothing is deleted here: a checkpointer may only read (an evaluator's). The writer
        # removes dead writers' temporaries before its first save into the folder.
        super().__init__(max_pending, copy_threads=copy_threads, direct_io=direct_io, private=private, _sync=_sync)

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
        step = check_step(step)
        return self._save(state, step, self._optimizers(overlap_with), block, start, lambda: self._target(step))

    def reserve(self, state: Any, *, wait: bool = False) -> None:
        """Allocate the staging memory that saves of ``state`` (or of a state with tensors of
        the same sizes) need, in every free slot, and fault it in on a background thread, so
        that even the first save() only copies. Call it once the state has its final sizes
        (e.g. after the first optimizer step creates Adam's state); a save() that comes
        first is still correct (the copy and the background thread share the memory safely).
        ``wait=True`` returns once the memory is in place."""
        with self._lock:
            self._check_open()
            data, stored = pickle_state(state)
            staging_size = _C.checkpoint_plan(self._path(0), data, [(0, s.nbytes) for s in stored]).staging_size
            pinned = any(s.device.type != "cpu" for s in stored)
            buffers = []
            short = self._memory_shortage(self._slots[0], staging_size, pinned)
            if short is not None:
                warnings.warn(f"qrnn.checkpoint: reserve() allocated nothing: {short}; saves write from the "
                              "live tensors instead", RuntimeWarning, stacklevel=2)
                return
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

    def lock(self) -> None:
        """Take the folder's writer lock now rather than at the first write (e.g. to refuse a
        second writer at start-up, before any work); ``close()`` releases it. Raises
        :class:`CheckpointError` (``errno`` EBUSY, ``operation`` ``"lock"``) naming the
        holder ("pid P on host H") when another writer has it. Idempotent."""
        self._writer_folder()

    def latest(self, order: str = "commit") -> Optional[str]:
        """Path of the most recently committed checkpoint in the directory (``order="step"``:
        of the highest step), or None. Temporary files of saves in progress are never
        returned, and nothing is deleted."""
        return self._reader().latest(order)

    def checkpoints(self, order: str = "commit") -> list[str]:
        """Paths of all committed checkpoints in the directory, oldest commit first
        (``order="step"``: lowest step first). Reads only."""
        return self._reader().checkpoints(order)

    def write_file(self, name: str, data: bytes) -> str:
        """Write ``name`` (a plain file name, not a checkpoint's) in the folder the way
        checkpoints are written: an exclusive temporary that follows no link, fsync, rename
        over ``name``, folder fsync. A link planted under ``name`` is replaced, never
        followed. Returns the path; raises :class:`CheckpointError`."""
        self._check_own_name(name, "name")
        folder = self._writer_folder()
        try:
            notes = folder.write_file(name, bytes(data), self._file_mode, self._sync)
        except OSError as error:
            raise _checkpoint_error(error, operation="write") from None
        _report_warnings(notes)
        return os.path.join(self._where, name)

    def publish(self, checkpoint: Union[int, str, os.PathLike], name: str) -> str:
        """Give a committed checkpoint of this folder (its step, or its path) a second name
        ``name`` (e.g. ``"best.pt"``) by the rules of :meth:`write_file`: a hard link under
        a temporary name renamed over ``name`` (a copy where the file system has no hard
        links). Returns the new path; raises :class:`CheckpointError`."""
        self._check_own_name(name, "name")
        if isinstance(checkpoint, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(checkpoint))
            if os.path.dirname(path) != self._where:
                raise ValueError(f"{os.fspath(checkpoint)!r} is not a file of {self.directory!r}")
            source = os.path.basename(path)
        else:
            source = _C.checkpoint_file_name(self.prefix, check_step(checkpoint), self.suffix)
        folder = self._writer_folder()
        try:
            notes = folder.publish(source, name, self._file_mode, self._sync)
        except OSError as error:
            raise _checkpoint_error(error, operation="publish") from None
        _report_warnings(notes)
        return os.path.join(self._where, name)

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # an exception is already propagating: still finish the saves, do not mask it
            self.close()
        except CheckpointError as error:
            warnings.warn(f"qrnn.checkpoint: {error}", RuntimeWarning, stacklevel=2)

    # -- internals --

    def _target(self, step: int) -> SaveTarget:
        """The checkpoint of ``step`` in this folder, with the writer lock held."""
        return SaveTarget(self._path(step), self._writer_folder(), self.keep_last or 0, self.prefix, self.suffix)

    def _release(self) -> None:
        if self._locked:
            self._folder.unlock_writer()
            self._locked = False

    def _path(self, step: int) -> str:
        return self._reader()._path(step)

    def _check_own_name(self, name: str, what: str) -> None:
        """A plain name that is neither a checkpoint of this naming nor a temporary."""
        if not isinstance(name, str):
            raise TypeError(f"{what} must be a str, got {type(name).__name__}")
        if (not name or name in (".", "..") or "/" in name or "\0" in name
                or _C.checkpoint_parse_name(name, self.prefix, self.suffix) is not None
                or _C.checkpoint_is_temporary(name)):
            raise ValueError(f"{what} must be a plain file name other than a checkpoint's, got {name!r}")

    def _writer_folder(self):
        """The folder, with this checkpointer's writer lock held (taken at the first write)."""
        self._check_open()
        if not self._locked:
            try:
                self._folder.lock_writer(self.prefix)
            except OSError as error:
                raise _checkpoint_error(error, operation="lock") from None
            self._locked = True
        return self._folder

    def _reader(self) -> CheckpointFolder:
        """The folder as its readers list it, through this checkpointer's descriptor (and its
        prefix and suffix now)."""
        return CheckpointFolder._over(self.directory, self._where, self._folder, self.prefix, self.suffix)
