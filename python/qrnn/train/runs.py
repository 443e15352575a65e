"""``qrnn-train``'s run folder: its latest checkpoint, which run a bare ``--resume`` means,
whether a run has finished its epochs, and the folder's writer lock, taken at start-up so
that a second writer is refused before any work. What reads the folders is kept here, whole,
so that it can move onto one read-only reader of checkpoint folders."""

from __future__ import annotations

import errno
import os
import re
import time
from typing import Callable, Optional

from .. import _C
from ..checkpoint import AsyncCheckpointer, CheckpointError, CheckpointFolder
from .checkpoints import _dcp, load_checkpoint
from .distributed import broadcast_object
from .errors import TrainError

__all__ = ["latest_checkpoint"]


def latest_checkpoint(directory: str) -> Optional[str]:
    """The most recently committed checkpoint in `directory` (a file, or a dcp step folder:
    of the two formats, the higher step), None when it has none."""
    try:
        scanner = CheckpointFolder(directory)  # reads only: no writer threads, no lock
    except (FileNotFoundError, NotADirectoryError):  # no folder (or removed meanwhile): no checkpoint
        return None
    latest = scanner.latest()
    step = None if latest is None else _C.checkpoint_parse_name(os.path.basename(latest), scanner.prefix,
                                                                scanner.suffix)
    dcp = _dcp()
    folder = dcp.latest(directory) if dcp is not None else None
    if folder is None or (latest is not None and step is not None
                          and step > _C.checkpoint_parse_name(os.path.basename(folder), "step-", "")):
        return latest
    return folder


def _run_dirs(root="runs") -> list:
    """The folders under `root` that hold a checkpoint, the most recently written first."""
    if not os.path.isdir(root):
        return []
    runs = []
    for name in os.listdir(root):
        run_dir = os.path.join(root, name)
        latest = latest_checkpoint(run_dir) if os.path.isdir(run_dir) else None
        if latest is not None:
            try:
                runs.append((os.path.getmtime(latest), run_dir))
            except OSError:  # removed meanwhile
                pass
    return [run_dir for _, run_dir in sorted(runs, reverse=True)]


def _finished(state, epochs: Optional[int] = None) -> Optional[tuple]:
    """(epochs, step) when the checkpoint `state` completed `epochs` epochs (None: those its
    run was started for), else None (also for a damaged state: resuming it says what is wrong)."""
    progress = state.get("progress") if isinstance(state, dict) else None
    saved = state.get("settings") if isinstance(state, dict) else None
    if epochs is None:
        epochs = saved.get("epochs") if isinstance(saved, dict) else None
    if not isinstance(progress, dict) or not isinstance(epochs, int):
        return None
    epoch, step = progress.get("epoch"), progress.get("step")
    if not isinstance(epoch, int) or not isinstance(step, int) or epoch < epochs:
        return None
    return epochs, step


def _is_finished(run_dir: str) -> bool:
    """Whether `run_dir`'s latest checkpoint completed its run (read with its tensors mapped,
    not loaded); False when it cannot tell."""
    latest = latest_checkpoint(run_dir)
    try:
        return latest is not None and _finished(load_checkpoint(latest, mmap=True)) is not None
    except TrainError:
        return False


def _pick_run(say: Callable) -> str:
    """The run a bare --resume means: the one unfinished run under runs/ (the newest when every
    run is finished, which then says so); several unfinished runs: a TrainError asking which."""
    runs = _run_dirs()
    if not runs:
        raise TrainError("--resume: no run with a checkpoint under runs/; pass --checkpoint-dir")
    if len(runs) == 1:
        say(f"--resume: {runs[0]}, the only run under runs/")
        return runs[0]
    unfinished = [run_dir for run_dir in runs if not _is_finished(run_dir)]
    if len(unfinished) > 1:
        shown = ", ".join(unfinished[:4]) + (", ..." if len(unfinished) > 4 else "")
        raise TrainError(f"--resume: {len(unfinished)} unfinished runs under runs/ ({shown}): "
                         "pass --checkpoint-dir DIR to choose one")
    if unfinished:
        say(f"--resume: {unfinished[0]}, the only unfinished run of {len(runs)} under runs/ "
            "(--checkpoint-dir DIR picks another)")
        return unfinished[0]
    say(f"--resume: {runs[0]}, the newest of {len(runs)} runs under runs/, all finished")
    return runs[0]


def _missing_folders(path: str) -> list:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing, path = [], os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _remove_if_empty(folders: list) -> None:
    """Remove `folders` (deepest first) while they are empty: a run that saved nothing
    leaves no folder behind."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return


def _take_run_dir(run_dir: str) -> AsyncCheckpointer:
    """The run folder's writer with its lock taken now: a second qrnn-train on the folder is
    refused at start-up, in one line naming the first, not at its first checkpoint."""
    writer = AsyncCheckpointer(run_dir, keep_last=None, max_pending=1)
    try:
        writer.lock()
    except CheckpointError as err:
        writer.close()
        if err.errno != errno.EBUSY:
            raise
        holder = re.search(r": (pid \d+ on host .*?) holds '", err.strerror or "")
        raise TrainError(f"{run_dir} is in use by {holder.group(1) if holder else 'another process'}: wait for "
                         "that run to end (or stop it), or pass another --checkpoint-dir") from None
    return writer


def _locate_run(args, dist, say: Callable) -> tuple:
    """(run folder, checkpoint to resume or None, folders created for it, rank 0's writer of
    the folder with its lock taken, else None), agreed by all ranks."""
    run_dir, resume_path, error, created, writer = args.checkpoint_dir, None, None, [], None
    if dist.is_main:
        try:
            if args.resume == "auto" and run_dir is None:
                raise TrainError("--resume auto needs --checkpoint-dir: the run folder to continue, or to start in")
            if args.resume is True and run_dir is None:
                run_dir = _pick_run(say)
            elif args.resume is True and latest_checkpoint(run_dir) is None:
                raise TrainError(f"--resume: no checkpoint in {run_dir}")
            elif run_dir is None:
                run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
            created = _missing_folders(run_dir)
            writer = _take_run_dir(run_dir)
            latest = latest_checkpoint(run_dir)  # now that no one else writes there
            if args.resume:
                resume_path = latest
                if resume_path is None and args.resume is True:
                    raise TrainError(f"--resume: no checkpoint in {run_dir}")
            elif latest:
                raise TrainError(f"{run_dir} already holds checkpoints: pass --resume to continue from them, "
                                 "or choose another --checkpoint-dir")
        except (TrainError, OSError) as err:
            if writer is not None:
                writer.close()
                writer = None
            _remove_if_empty(created)
            error = str(err)
    run_dir, resume_path, error = broadcast_object((run_dir, resume_path, error), dist)
    if error:
        raise TrainError(error)
    return run_dir, resume_path, created, writer
