"""``async_save(obj, f)``: torch.save's asynchronous twin, on the machinery of
AsyncCheckpointer (one :class:`SaveQueue`, so one C++ writer and its threads, per process)."""

from __future__ import annotations

import collections
import os
import pickle
import threading
import time
from typing import Any, Optional, Union

import torch

from .. import _C
from .checkpointer import SaveQueue, SaveTarget, _checkpoint_error
from .handle import SaveHandle

# Snapshots the process-wide queue holds at once: two, so that back-to-back saves (a
# framework's "last" and "best" of one step) do not wait for each other's disk writes.
MAX_PENDING = 2
# Open folders kept for later saves into them (each holds a file descriptor).
FOLDERS_KEPT = 8


class FileSaver(SaveQueue):
    """A SaveQueue whose saves go to any path: each call replaces the file by the checkpoint
    protocol (temporary, fsync, rename, folder fsync) in the path's folder and applies no
    retention. It takes no writer lock: a single file's name is its caller's business.

    The folders of recent saves stay open for the next save into them, as long as their
    name still leads to the same folder (one deleted, replaced or renamed since is opened
    anew): every save goes to the folder its path names when it is called."""

    _warn_depth = 4  # async_save -> save_file -> _save

    def __init__(self, max_pending: int = 1, **options: Any):
        self._folders: collections.OrderedDict = collections.OrderedDict()  # directory -> _C.CheckpointFolder
        super().__init__(max_pending, **options)

    def save_file(self, obj: Any, path: str) -> SaveHandle:
        start = time.perf_counter()
        handle = self._save(obj, None, [], True, start, lambda: self._file_target(path))
        assert handle is not None  # block=True always saves
        return handle

    def _file_target(self, path: str) -> SaveTarget:
        """Under the lock: ``path`` in its folder, opened or reused."""
        return SaveTarget(path, self._open_folder(os.path.dirname(path)))

    def _open_folder(self, directory: str) -> Any:
        folder = self._folders.pop(directory, None)
        if folder is None or not _still_named(folder, directory):
            try:
                folder = _C.CheckpointFolder(directory)
            except OSError as error:
                raise _checkpoint_error(error, operation="open") from None
        self._folders[directory] = folder  # the most recently used last
        if len(self._folders) > FOLDERS_KEPT:
            self._folders.popitem(last=False)
        return folder

    def _release(self) -> None:
        self._folders.clear()

    def _reset_after_fork(self) -> None:
        super()._reset_after_fork()
        self._folders = collections.OrderedDict()  # the child starts afresh, like its writer


def _still_named(folder: Any, directory: str) -> bool:
    """Whether ``directory`` still names the open ``folder``: the same device and inode, and
    not deleted (a deleted folder's inode lives on while it is open)."""
    try:
        named, held = os.stat(directory), os.fstat(folder.fd)
    except OSError:
        return False
    return held.st_nlink > 0 and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


_saver_lock = threading.Lock()
_saver: Optional[FileSaver] = None


def _after_fork_in_child() -> None:
    """A thread of the parent may have held the lock; the saver itself resets like any
    checkpointer (fresh writer threads at its first save in the child)."""
    global _saver_lock
    _saver_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def saver() -> FileSaver:
    """The process's FileSaver, created at the first save (and again after wait_all's close
    at exit, or in a forked child, which resets it like any checkpointer)."""
    global _saver
    with _saver_lock:
        if _saver is None or _saver._closed:
            _saver = FileSaver(MAX_PENDING)
        return _saver


def use_saver(new: Optional[FileSaver]) -> Optional[FileSaver]:
    """Make ``new`` the process's FileSaver (tests: one whose disk fails); returns the old one."""
    global _saver
    with _saver_lock:
        old, _saver = _saver, new
        return old


def async_save(obj: Any, f: Union[str, os.PathLike], pickle_module: Any = pickle,
               pickle_protocol: int = torch.serialization.DEFAULT_PROTOCOL, _use_new_zipfile_serialization: bool = True,
               _disable_byteorder_record: bool = False) -> SaveHandle:
    """``torch.save(obj, f)`` in the background: torch.save's arguments (``f`` a path; the
    other arguments only at torch.save's defaults) and the same file, which plain
    ``torch.load`` (``weights_only=True`` included) reads. Returns a :class:`SaveHandle`
    once the snapshot is taken (``obj``'s tensors may change from then on); a writer thread
    writes a temporary next to ``f``, fsyncs it and renames it over ``f`` (an existing file is
    replaced atomically: a reader or a crash sees the old file or the new one, never a part).

    All calls in a process share one writer and at most two snapshots in memory (a third call
    waits for the oldest). Saves commit in call order, so of two saves to one path the later
    one wins. A failure raises :class:`CheckpointError` from that save's ``handle.result()``,
    and, when nobody was told yet, from the next ``async_save`` (after making that save) or
    :func:`wait_all`. Unfinished saves are finished at interpreter exit.

    Raises:
        TypeError: ``f`` is not a ``str`` or ``os.PathLike`` (a file object or buffer: use
            ``torch.save``).
        ValueError: ``pickle_module``, ``pickle_protocol`` or the underscored format flags
            differ from torch.save's defaults.
        CheckpointError: an earlier ``async_save`` failed and nobody was told yet (this save
            is still made: the error's ``next_handle``).
    """
    if not isinstance(f, (str, os.PathLike)):
        raise TypeError(f"async_save writes to a path (str or os.PathLike), got {type(f).__name__}; "
                        "for a file object or buffer use torch.save")
    if pickle_module is not pickle:
        raise ValueError("async_save pickles with the standard pickle module, as torch.save does by default")
    if pickle_protocol != torch.serialization.DEFAULT_PROTOCOL:
        raise ValueError(f"async_save writes pickle protocol {torch.serialization.DEFAULT_PROTOCOL}, "
                         f"torch.save's default, got {pickle_protocol!r}")
    if not _use_new_zipfile_serialization or _disable_byteorder_record:
        raise ValueError("async_save writes torch.save's default format only (zip, with the byte-order record)")
    path = os.path.abspath(os.fsdecode(os.fspath(f)))  # stays right after a chdir
    return saver().save_file(obj, path)


def wait_all() -> None:
    """Block until every ``async_save`` so far is committed; raise the first failure nobody
    was told about as :class:`CheckpointError`."""
    with _saver_lock:
        current = _saver
    if current is not None and not current._closed:
        current.wait()
