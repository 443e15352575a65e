"""One save in flight: :class:`PendingSave` is the checkpointer's side of it (the C++ status,
the storages kept alive until staged, the CUDA events, whether its outcome was reported),
:class:`SaveHandle` the caller's. Also the overlap barriers (optimizer step pre-hooks) and
what a forked child knows of its parent's saves."""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from typing import Optional

import torch

from . import staging
from .errors import CheckpointError

_save_counter = itertools.count()
_fork_generation = 0  # bumped in a forked child: saves from before belong to the parent


class PendingSave:
    """What the checkpointer tracks of one submitted save."""

    def __init__(self, status, step: Optional[int], path: str, cuda_done: dict, sources: list):
        self.step = step
        self.path = path
        self.sequence = next(_save_counter)  # submission order
        self.reported = False                # its failure has been raised to someone
        self.blocked_seconds = 0.0           # time the training thread spent in save() and barriers
        self._status = status
        self._cuda_done = cuda_done          # device -> event after the side-stream copy
        self._sources: Optional[list] = sources  # storages kept alive until staged
        self._generation = _fork_generation
        self._stream_waited = False
        self.barrier_done = False            # the snapshot was waited for (by save() or a barrier)
        self._warned = False
        self.handle = SaveHandle(self)

    def from_parent(self) -> bool:
        """Made by the parent before fork(): its outcome is known only there."""
        return self._generation != _fork_generation

    def describe(self) -> str:
        """How messages name this save: its step, or its path (async_save has no step)."""
        return f"checkpoint step {self.step}" if self.step is not None else f"checkpoint '{self.path}'"

    def parent_error(self) -> RuntimeError:
        return RuntimeError(f"{self.describe()} was saved by the parent process before fork(); "
                            "its outcome is known only there")

    def finished(self) -> bool:
        return self._status.done()

    def wait(self, timeout: Optional[float] = None) -> bool:
        return self._status.wait(timeout)  # releases the GIL

    def wait_staged(self) -> None:
        """The snapshot is complete; for CUDA tensors, the current streams wait for the copy."""
        if self.from_parent():
            return  # the parent's snapshot: nothing in this process waits for it
        start = time.perf_counter()
        self._status.wait_staged()
        if self._cuda_done and not self._stream_waited:
            for device, event in self._cuda_done.items():
                staging.cuda.current_stream(device).wait_event(event)
            self._stream_waited = True
        if not self._cuda_done:
            self._sources = None
        self.barrier_done = True
        self.blocked_seconds += time.perf_counter() - start

    def barrier_wait(self) -> None:
        """An optimizer step of overlap mode: waits unless the snapshot was waited for already."""
        if not self.barrier_done:
            self.wait_staged()

    def gpu_copies_landed(self) -> None:
        """After the side-stream copies: once the CPU part is copied too, the storages may go."""
        self._status.wait_staged()
        self._sources = None

    def error(self) -> Optional[CheckpointError]:
        """The failure of a finished save (None while running or after success)."""
        info = self._status.error()
        if info is None:
            return None
        errno, operation, filename, message = info
        return CheckpointError(errno, message, filename or None, step=self.step, operation=operation)

    def take_warnings(self) -> list:
        """The writer's warnings of a finished save, the first time only."""
        if self._warned:
            return []
        self._warned = True
        return self._status.warnings()

    def staged_seconds(self) -> float:
        return self._status.staged_seconds

    def total_seconds(self) -> float:
        return self._status.done_seconds


class SaveHandle:
    """One requested save, as ``save()`` and ``async_save`` return it. ``done()`` polls,
    ``result()`` waits and returns the final path or raises :class:`CheckpointError`;
    ``wait_staged()`` waits until the snapshot is taken. ``step`` and ``path`` say which
    save it is. In a process forked while the save was pending, its methods raise
    RuntimeError: the outcome is known only in the parent."""

    def __init__(self, save: PendingSave):
        self._save = save
        self.step = save.step
        self.path = save.path

    @property
    def blocked_seconds(self) -> float:
        """Time the training thread spent in save() and in barriers waiting for this snapshot."""
        return self._save.blocked_seconds

    def done(self) -> bool:
        """Whether the save has finished, committed or failed (never blocks)."""
        if self._save.from_parent():
            raise self._save.parent_error()
        return self._save.finished()

    def wait_staged(self) -> None:
        """Block until the snapshot is complete: afterwards the saved tensors may change.
        For CUDA tensors, the current streams wait for the copy (the host does not)."""
        self._save.wait_staged()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the save is committed or failed, at most ``timeout`` seconds; returns
        whether it finished. Raises nothing: a failure stays for ``result()`` and for the
        next call of whoever made the save to report."""
        if self._save.from_parent():
            raise self._save.parent_error()
        return self._save.wait(timeout)

    def result(self, timeout: Optional[float] = None) -> str:
        """The committed file's path; raises CheckpointError if the save failed, TimeoutError
        if it is still running after ``timeout`` seconds."""
        if self._save.from_parent():
            raise self._save.parent_error()
        if not self._save.wait(timeout):
            raise TimeoutError(f"{self._save.describe()} still being written after {timeout} s")
        error = self._save.error()
        if error is not None:
            self._save.reported = True
            raise error
        return self.path

    def exception(self) -> Optional[CheckpointError]:
        """None while running or after success, else the error (without raising it)."""
        if self._save.from_parent():
            raise self._save.parent_error()
        return self._save.error() if self._save.finished() else None

    @property
    def staged_seconds(self) -> float:
        """Seconds from save() to the snapshot's bytes being copied (CPU part)."""
        return self._save.staged_seconds()

    @property
    def total_seconds(self) -> float:
        """Seconds from save() to the file being committed (fsynced and renamed)."""
        return self._save.total_seconds()

    def __repr__(self) -> str:
        if self._save.from_parent():
            return f"SaveHandle(step={self.step}, path={self.path!r}, the parent process's)"
        state = "running" if not self.done() else ("failed" if self._save.error() else "committed")
        return f"SaveHandle(step={self.step}, path={self.path!r}, {state})"


# Overlap barriers: one permanent step pre-hook per optimizer, registered once and never
# removed (removing a hook while torch runs the hooks breaks optimizer.step()); it waits
# for every save queued on that optimizer since its last step.
_barrier_lock = threading.Lock()
_barriers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _step_barrier(optimizer, args, kwargs) -> None:
    with _barrier_lock:
        pending = _barriers.get(optimizer)
        saves = list(pending) if pending else []
        if pending:
            pending.clear()
    for save in saves:
        save.barrier_wait()


def add_barrier(optimizer: torch.optim.Optimizer, save: PendingSave) -> None:
    """The optimizer's next step() waits for this save's snapshot."""
    with _barrier_lock:
        pending = _barriers.get(optimizer)
        if pending is None:
            pending = _barriers[optimizer] = []
            optimizer.register_step_pre_hook(_step_barrier)
        pending.append(save)


def _after_fork_in_child() -> None:
    """Saves from before belong to the parent; so do its pending barriers and any lock holder."""
    global _fork_generation, _barrier_lock, _barriers
    _fork_generation += 1
    _barrier_lock = threading.Lock()
    _barriers = weakref.WeakKeyDictionary()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
