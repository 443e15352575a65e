"""The run's checkpoints: where and when (:class:`CheckpointConfig`), saved through
:class:`qrnn.checkpoint.AsyncCheckpointer` while measuring how long training waited for
them, best.pt (kept, and re-promoted on resume), and reading them back. Finding a folder's
latest checkpoint is :mod:`qrnn.train.runs`'s."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from .. import _C
from ..checkpoint import AsyncCheckpointer, CheckpointFolder, SaveHandle, UnsafeCheckpointError, load
from .errors import TrainError

__all__ = ["CheckpointConfig", "CheckpointStallMeter", "ShardedCheckpoints", "load_checkpoint", "restore_best",
           "BEST_NAME", "expanded_size", "is_sharded_checkpoint"]

BEST_NAME = "best.pt"
CHECKPOINT_FORMATS = ("file", "dcp")


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and when :class:`qrnn.train.Trainer` checkpoints (``qrnn-train``'s checkpoint
    flags, in their units: ``save_interval`` in minutes, as ``--save-interval``).

    Args:
        directory: where rank 0 writes a checkpoint every epoch (and when stopping early)
            through :class:`qrnn.checkpoint.AsyncCheckpointer`, keeping ``keep_last`` and a
            best.pt (lowest validation loss); None: no checkpoints.
        keep_last: how many checkpoints to keep; None: all.
        save_every: also checkpoint every this many optimizer steps, mid-epoch, at the
            position reached; None: only at epoch ends.
        save_interval: also checkpoint every this many MINUTES (rank 0's clock), mid-epoch,
            at the position reached; None: never by time.
        overlap: stage the snapshot while the next forward and backward run, the next
            ``optimizer.step()`` waiting for it (default): safe unless the forward pass
            changes saved tensors in place (BatchNorm running statistics, an EMA updated in
            forward); False for such models.
        format: ``"file"`` (rank 0 writes one torch.save file per checkpoint) or ``"dcp"``
            (every rank writes its part of a torch.distributed.checkpoint folder
            ``step-<n>`` through :mod:`qrnn.checkpoint.dcp`; the Trainer's ``checkpointer``
            then writes only the run folder's other files; no best.pt).
        extra: entries added to every checkpoint (e.g. settings, a vocabulary); the dict
            itself is kept, so what it holds at each save is saved.

    Raises:
        ValueError: a ``format`` other than the two.
    """

    directory: Optional[str] = None
    keep_last: Optional[int] = 3
    save_every: Optional[int] = None
    save_interval: Optional[float] = None
    overlap: bool = True
    format: str = "file"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.format not in CHECKPOINT_FORMATS:
            raise ValueError(f"checkpoint format must be 'file' or 'dcp', got {self.format!r}")

    @property
    def interval_seconds(self) -> Optional[float]:
        """``save_interval`` in seconds, as the training loop's clock counts, or None."""
        return None if self.save_interval is None else 60.0 * self.save_interval


class CheckpointStallMeter:
    """Saves through qrnn.checkpoint.AsyncCheckpointer and measures how long training was held
    up by it. In overlap mode the snapshot is staged while the next forward and backward run
    and only the next ``optimizer.step()`` waits for it, so the stall is the blocking part of
    save() plus that wait (both in ``SaveHandle.blocked_seconds``). Keeps best.pt too.
    ``checkpointer``: an open AsyncCheckpointer of ``directory`` (``max_pending=1``) to save
    through, e.g. one whose writer lock was taken at start-up; None: one opened here."""

    def __init__(self, directory: str, keep_last: int, optimizer: Optional[torch.optim.Optimizer],
                 checkpointer: Optional[AsyncCheckpointer] = None):
        self.directory = str(directory)
        if checkpointer is None:
            checkpointer = AsyncCheckpointer(self.directory, keep_last=keep_last, max_pending=1)
        else:  # an open writer of `directory` (its lock perhaps taken at start-up): this meter's retention
            checkpointer.keep_last = keep_last
        self.checkpointer = checkpointer
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

    def wait(self) -> None:
        """Until every save so far is committed."""
        self.checkpointer.wait()

    def close(self) -> None:
        self.checkpointer.wait()
        self.promote_best(wait=True)
        self.checkpointer.close()


class ShardedCheckpoints:
    """``--checkpoint-format dcp``: every rank saves its part of the state with
    :func:`qrnn.checkpoint.dcp.async_save` into ``<directory>/step-<n>`` (committed once every
    rank's file is, ``keep_last`` step folders kept), measuring how long training waited for
    the call. No best.pt (a folder has no second name). ``checkpointer``: rank 0's writer of
    the run folder's other files (metrics, plot), or None."""

    overlap_with = None  # the snapshot is taken by the call itself

    def __init__(self, directory: str, keep_last: int, checkpointer: Optional[AsyncCheckpointer] = None):
        self.directory = str(directory)
        self.keep_last = keep_last
        self.checkpointer = checkpointer
        self._stall = 0.0
        self._future: Any = None

    def take_stall_seconds(self) -> float:
        total, self._stall = self._stall, 0.0
        return total

    def save(self, state: dict, step: int, best: bool = False, prepare_seconds: float = 0.0):
        """Save `state` (this rank's view of it) as `step`; call on every rank."""
        from ..checkpoint import dcp
        start = time.perf_counter()
        self.wait()  # the previous save's failure, on every rank, before this one starts
        self._future = dcp.async_save(state, checkpoint_id=dcp.step_folder(self.directory, step),
                                      keep_last=self.keep_last)
        self._stall += prepare_seconds + time.perf_counter() - start
        return self._future

    def wait(self) -> None:
        """Until the last save is committed; raises its CheckpointError."""
        future, self._future = self._future, None
        if future is not None:
            future.result()

    def close(self) -> None:
        self.wait()
        if self.checkpointer is not None:
            self.checkpointer.close()


def _write_best(checkpointer: AsyncCheckpointer, checkpoint: Union[int, str]) -> None:
    """Make best.pt the committed `checkpoint` (a step, or a path) of the checkpointer's folder by the
    writer's commit rules (AsyncCheckpointer.publish: a temporary that follows no link, a hard
    link or else a copy, fsync, rename, fsync of the folder, all relative to the folder's
    descriptor). One function, so that tests can interrupt a promotion."""
    checkpointer.publish(checkpoint, BEST_NAME)


def restore_best(directory: str, best_step: Optional[int],
                 checkpointer: Optional[AsyncCheckpointer] = None) -> bool:
    """On resume: re-promote best.pt from the checkpoint of `best_step` (the best one, as the
    resumed checkpoint records it) when best.pt is missing or another file (a kill between
    that checkpoint's commit and its promotion). False when there is nothing to do or the
    checkpoint is gone (it is removed only after a later save, that is after promotion).
    `checkpointer`: the run's own, when it has one (it holds the folder's writer lock)."""
    if best_step is None or not os.path.isdir(directory):
        return False
    scanner = CheckpointFolder(directory)  # reads only; the writer below takes the lock
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
        _write_best(checkpointer, best_step)
    else:
        with AsyncCheckpointer(directory) as writer:  # takes the writer lock, releases it on close
            _write_best(writer, best_step)
    return True


def _dcp():
    """qrnn.checkpoint.dcp, or None where torch.distributed is not built in."""
    try:
        from ..checkpoint import dcp
    except ImportError:
        return None
    return dcp


def is_sharded_checkpoint(path: str) -> bool:
    """Whether `path` is a committed ``--checkpoint-format dcp`` checkpoint (a folder)."""
    return os.path.isfile(os.path.join(path, ".metadata"))


def load_checkpoint(path: str, mmap: bool = False) -> dict:
    """Read a checkpoint file onto the CPU with :func:`qrnn.checkpoint.load`
    (``weights_only=True``, its structure checked first).

    Args:
        path: the checkpoint file.
        mmap: map the tensors from the file rather than read them (to look at its progress
            and settings only).

    Returns:
        Its contents (for qrnn-train's checkpoints, a dict).

    Raises:
        TrainError: (one line) a missing, damaged or unreadable file, one whose pickle needs
            more than ``weights_only=True`` allows, or one whose lists and dicts would expand
            far beyond its size (shared references cost a pickle two bytes each: a nest of
            them can stand for 2**40 items that a JSON encoder or a walk would then visit).
    """
    try:
        if os.path.isdir(path):
            state, size = _load_sharded(path)
        else:
            state = load(path, map_location="cpu", mmap=mmap)
            size = os.path.getsize(path)
    except FileNotFoundError:
        raise TrainError(f"checkpoint {path} does not exist") from None
    except UnsafeCheckpointError as err:  # already one line naming the file and what it refers to
        raise TrainError(str(err)) from None
    except Exception as err:  # a damaged or foreign file: one line, not a traceback
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise TrainError(f"cannot read checkpoint {path}: {type(err).__name__}: {message}") from None
    limit = EXPANSION_PER_BYTE * size + EXPANSION_FLOOR
    if expanded_size(state) > limit:
        raise TrainError(f"refused checkpoint {path}: its lists and dicts expand to more than {limit:,} items "
                         f"for {size:,} bytes (shared references)")
    return state


def _load_sharded(path: str) -> tuple:
    """A dcp step folder read whole in this process (every rank holds full replicas under
    DDP), as :func:`load_checkpoint` returns a file's, and the folder's bytes. DCP keys are
    strings and it keeps no empty dicts: the optimizer's per-parameter state gets its int keys
    back, and the empty dicts a training state may hold are restored."""
    dcp = _dcp()
    if dcp is None:
        raise TrainError(f"checkpoint {path} is a torch.distributed.checkpoint folder, and this torch has no "
                         "torch.distributed")
    state = dcp.load_all(path)
    optimizer = state.get("optimizer")
    if isinstance(optimizer, dict):
        per_param = optimizer.setdefault("state", {})
        if isinstance(per_param, dict):
            optimizer["state"] = {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in per_param.items()}
    if isinstance(state.get("progress"), dict):
        state.setdefault("scaler", {})
    size = sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())
    return state, size


# Lists, dicts and text of an honest checkpoint count fewer items than its bytes.
EXPANSION_PER_BYTE = 4
EXPANSION_FLOOR = 1 << 16


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _children(node):
    return [*node.keys(), *node.values()] if isinstance(node, dict) else node


def expanded_size(tree) -> float:
    """Items of `tree` counted as a walk or an encoder meets them: a shared object once per
    reference, a string one item per 16 characters, a tensor one (its bytes are in the
    file); infinite for a cycle. Each distinct list or dict is visited once (sizes memoised
    by identity), so the count costs the objects' number, not the expansion's."""
    if not isinstance(tree, _CONTAINERS):
        return 1 + (len(tree) // 16 if isinstance(tree, str) else 0)
    sizes: dict = {}
    in_progress: set = set()  # on the path from the root: meeting one again is a cycle

    def size(child) -> int:
        if isinstance(child, str):
            return 1 + len(child) // 16
        return sizes.get(id(child), 1)  # a container is done by now; anything else counts one

    stack: list = [(tree, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            sizes[key] = 1 + sum(map(size, _children(node)))
            in_progress.discard(key)
        elif key in in_progress:
            return math.inf
        elif key not in sizes:
            in_progress.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node)
                         if isinstance(child, _CONTAINERS) and id(child) not in sizes)
    return sizes[id(tree)]
