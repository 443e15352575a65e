"""Test hooks of qrnn.checkpoint, for the test suite only (not a public interface): a
checkpointer, and async_save's saver, whose disk fails on purpose, through qrnn._C._testing."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Union

from .. import _C
from .checkpointer import AsyncCheckpointer
from .errors import CheckpointError
from .saver import MAX_PENDING, FileSaver, use_saver


class FaultyCheckpointer(AsyncCheckpointer):
    """An AsyncCheckpointer whose writer fails the write crossing ``after_bytes`` bytes of a
    file, with ``errno`` (EIO when 0) or by throwing inside the writer thread (``throw``),
    for ``times`` saves (-1: all); every folder fsync fails with ``folder_sync_errno`` (0:
    none); the other arguments are AsyncCheckpointer's."""

    def __init__(self, directory: Union[str, os.PathLike], *args, after_bytes: int = 2**64 - 1, errno: int = 0,
                 throw: bool = False, times: int = -1, folder_sync_errno: int = 0, **kwargs):
        self._fault = dict(fail_after_bytes=after_bytes, fail_errno=errno, fail_throw=throw, fail_times=times,
                           fail_folder_sync_errno=folder_sync_errno)
        super().__init__(directory, *args, **kwargs)

    def _new_writer(self):
        return _C._testing.checkpoint_writer_with_faults(**self._writer_options, **self._fault)


class FaultyFileSaver(FileSaver):
    """The process-wide saver of ``async_save`` with FaultyCheckpointer's failures."""

    def __init__(self, *, after_bytes: int = 2**64 - 1, errno: int = 0, throw: bool = False, times: int = -1,
                 folder_sync_errno: int = 0, max_pending: int = MAX_PENDING):
        self._fault = dict(fail_after_bytes=after_bytes, fail_errno=errno, fail_throw=throw, fail_times=times,
                           fail_folder_sync_errno=folder_sync_errno)
        super().__init__(max_pending)

    def _new_writer(self):
        return _C._testing.checkpoint_writer_with_faults(**self._writer_options, **self._fault)


@contextlib.contextmanager
def faulty_async_save(**fault) -> Iterator[FaultyFileSaver]:
    """Within the block, ``async_save`` writes through a FaultyFileSaver (closed at the end,
    after which the previous saver is back)."""
    faulty = FaultyFileSaver(**fault)
    previous = use_saver(faulty)
    try:
        yield faulty
    finally:
        use_saver(previous)
        try:
            faulty.close()
        except CheckpointError:
            pass  # the test asserted what it wanted; an unreported failure must not mask it
