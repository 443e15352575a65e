"""Step folders of sharded checkpoints: ``<root>/step-<n>`` (n zero-padded to 12 digits), each
a DCP checkpoint, committed once its ``.metadata`` is (see :mod:`.storage`)."""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional, Union

from ... import _C
from ..folder import check_step

PREFIX = "step-"
METADATA = ".metadata"


def step_folder(root: Union[str, os.PathLike], step: int) -> str:
    """``<root>/step-<step:012d>``: the folder a save of ``step`` writes."""
    return os.path.join(os.path.abspath(os.fspath(root)), _C.checkpoint_file_name(PREFIX, check_step(step), ""))


def _steps(root: str) -> list:
    """[(step, folder path, committed)] under ``root``, by step."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        step = _C.checkpoint_parse_name(name, PREFIX, "")
        if step is None:
            continue
        path = os.path.join(root, name)
        found.append((step, path, os.path.isfile(os.path.join(path, METADATA))))
    return sorted(found)


def checkpoints(root: Union[str, os.PathLike]) -> list:
    """The committed step folders under ``root``, lowest step first."""
    return [path for _, path, committed in _steps(os.path.abspath(os.fspath(root))) if committed]


def latest(root: Union[str, os.PathLike]) -> Optional[str]:
    """The committed step folder with the highest step under ``root`` (a folder whose save did
    not finish on every rank has no ``.metadata`` and is skipped), or None."""
    found = checkpoints(root)
    return found[-1] if found else None


def decommit(folder: Any) -> None:
    """Make an open step folder (a CheckpointFolder) no checkpoint: ``.metadata`` deleted and
    the folder fsynced, before any of its files is replaced or deleted."""
    try:
        os.unlink(METADATA, dir_fd=folder.fd)
    except FileNotFoundError:
        return
    os.fsync(folder.fd)


def _remove(path: str) -> None:
    folder = _C.CheckpointFolder(path)
    decommit(folder)
    del folder
    shutil.rmtree(path, ignore_errors=True)


def apply_retention(committed: str, keep_last: int) -> None:
    """After ``committed`` (a step folder) was committed: delete the committed step folders
    beside it but the ``keep_last`` highest steps (``committed`` always stays), and the
    uncommitted ones of lower steps (saves that died). keep_last 0 keeps everything."""
    if keep_last <= 0:
        return
    root = os.path.dirname(committed)
    current = _C.checkpoint_parse_name(os.path.basename(committed), PREFIX, "")
    if current is None:
        return
    found = _steps(root)
    kept = [path for _, path, done in found if done][-keep_last:]
    for step, path, done in found:
        if path == committed or path in kept or (not done and step >= current):
            continue
        _remove(path)
