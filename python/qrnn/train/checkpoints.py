"""The run's checkpoints: saved through :class:`qrnn.checkpoint.AsyncCheckpointer` while
measuring how long training waited for them, best.pt, and finding and reading them back."""

from __future__ import annotations

import os
from typing import Optional

import torch

from .. import _C
from ..checkpoint import AsyncCheckpointer, SaveHandle, load
from .errors import TrainError

__all__ = ["CheckpointStallMeter", "latest_checkpoint", "load_checkpoint", "restore_best", "BEST_NAME"]

BEST_NAME = "best.pt"


class CheckpointStallMeter:
    """Saves through qrnn.checkpoint.AsyncCheckpointer and measures how long training was held
    up by it. In overlap mode the snapshot is staged while the next forward and backward run
    and only the next ``optimizer.step()`` waits for it, so the stall is the blocking part of
    save() plus that wait (both in ``SaveHandle.blocked_seconds``). Keeps best.pt too."""

    def __init__(self, directory: str, keep_last: int, optimizer: Optional[torch.optim.Optimizer]):
        self.directory = str(directory)
        self.checkpointer = AsyncCheckpointer(self.directory, keep_last=keep_last, max_pending=1)
        self.overlap_with = optimizer  # None: default mode, save() returns once staged
        self._counted: list = []       # [handle, seconds of its stall already counted]
        self._preparing = 0.0          # seconds spent gathering states for save(), not yet reported
        self._best_handle: Optional[SaveHandle] = None

    def take_stall_seconds(self) -> float:
        """Stall time not yet reported: save() calls and optimizer.step() waits since the last call."""
        total, self._preparing = self._preparing, 0.0
        for entry in self._counted:
            handle, counted = entry
            total += handle.blocked_seconds - counted
            entry[1] = handle.blocked_seconds
        self._counted = self._counted[-2:]  # at most one save is in flight (max_pending=1)
        return total

    def save(self, state: dict, step: int, best: bool = False, prepare_seconds: float = 0.0):
        """Save `state` as `step`; `prepare_seconds` (building `state`) counts as stall too."""
        self._preparing += prepare_seconds
        # A best checkpoint still in flight is promoted before the next save can commit and
        # its retention remove it (with max_pending=1 save() would wait for it anyway).
        self.promote_best(wait=True)
        handle = self.checkpointer.save(state, step, overlap_with=self.overlap_with)
        self._counted.append([handle, 0.0])
        if best:
            self._best_handle = handle
        self.promote_best()
        return handle

    def promote_best(self, wait: bool = False) -> None:
        """Keep best.pt: the best checkpoint, once it is committed (see _write_best)."""
        handle = self._best_handle
        if handle is None or not (wait or handle.done()):
            return
        self._best_handle = None
        _write_best(self.checkpointer, handle.result())

    def close(self) -> None:
        self.checkpointer.wait()
        self.promote_best(wait=True)
        self.checkpointer.close()


def _write_best(checkpointer: AsyncCheckpointer, source: str) -> None:
    """Make best.pt the committed checkpoint at path `source` (publish takes a path or a
    step, not a bare name) in the checkpointer's folder by the
    writer's commit rules (AsyncCheckpointer.publish: a temporary that follows no link, a hard
    link or else a copy, fsync, rename, fsync of the folder, all relative to the folder's
    descriptor). One function, so that tests can interrupt a promotion."""
    checkpointer.publish(source, BEST_NAME)


def restore_best(directory: str, best_step: Optional[int],
                 checkpointer: Optional[AsyncCheckpointer] = None) -> bool:
    """On resume: re-promote best.pt from the checkpoint of `best_step` (the best one, as the
    resumed checkpoint records it) when best.pt is missing or another file (a kill between
    that checkpoint's commit and its promotion). False when there is nothing to do or the
    checkpoint is gone (it is removed only after a later save, that is after promotion).
    `checkpointer`: the run's own, when it has one (it holds the folder's writer lock)."""
    if best_step is None or not os.path.isdir(directory):
        return False
    with AsyncCheckpointer(directory) as scanner:
        name = _C.checkpoint_file_name(scanner.prefix, best_step, scanner.suffix)
        committed = {os.path.basename(path) for path in scanner.checkpoints()}
    if name not in committed:
        return False
    source = os.path.join(directory, name)
    target = os.path.join(directory, BEST_NAME)
    try:
        if os.path.samefile(source, target) and not os.path.islink(target):
            return False
    except OSError:  # no best.pt
        pass
    if checkpointer is not None:
        _write_best(checkpointer, source)
    else:
        with AsyncCheckpointer(directory) as writer:  # takes the writer lock, releases it on close
            _write_best(writer, source)
    return True


def latest_checkpoint(directory: str) -> Optional[str]:
    """The most recently committed checkpoint in `directory`, None when it has none."""
    if not os.path.isdir(directory):
        return None
    with AsyncCheckpointer(directory) as scanner:
        return scanner.latest()


def load_checkpoint(path: str) -> dict:
    """A checkpoint's contents, on the CPU; TrainError (one line) for a missing or unreadable file."""
    try:
        return load(path, map_location="cpu")
    except FileNotFoundError:
        raise TrainError(f"checkpoint {path} does not exist") from None
    except Exception as err:  # a damaged or foreign file: one line, not a traceback
        raise TrainError(f"cannot read checkpoint {path}: {type(err).__name__}: {err}") from None
