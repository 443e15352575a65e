"""The exceptions of qrnn.checkpoint."""

from __future__ import annotations

import pickle
from typing import Any, Optional


class CheckpointError(OSError):
    """A checkpoint was not saved (an OSError whose ``message`` is one sentence).

    Attributes:
        errno, filename: which system call failed on which file (``errno`` is 0 for a
            failure that was not a system call; EBUSY when another writer holds the folder).
        step: the step of the lost save (None for ``async_save``, which has no step).
        operation: the operation that failed, e.g. ``"lock"``, ``"write"``, ``"commit"`` or
            ``"publish"`` (``""`` when none is named).
        next_handle: when a later ``save()`` or ``async_save`` raised this error, the
            :class:`SaveHandle` of that later save, which was still made; else None.
    """

    def __init__(self, errno: int, message: str, filename: Optional[str] = None, step: Optional[int] = None,
                 operation: str = ""):
        super().__init__(errno, message, filename)
        self.step = step
        self.operation = operation
        # Set when a later save() reports it: that save's SaveHandle (not imported here: the
        # handle module imports this one).
        self.next_handle: Any = None


class CorruptCheckpointError(ValueError):
    """:func:`verify` or :func:`load` found a damaged checkpoint (a ValueError). ``path`` is
    the file; ``record`` names the damaged record (None when the archive as a whole is
    unreadable); ``problem`` says what is wrong, in the message."""

    def __init__(self, path: str, record: Optional[str], problem: str):
        where = f"record '{record}'" if record else "archive"
        super().__init__(f"checkpoint '{path}' is damaged: {where}: {problem}")
        self.path = path
        self.record = record


class UnsafeCheckpointError(CorruptCheckpointError, pickle.UnpicklingError):
    """:func:`load` refused a checkpoint whose pickle needs more than ``weights_only=True``
    rebuilds: code (a function such as ``os.system``, or a class) or another object outside
    the allowed types. Nothing in it ran. ``path`` is the file; ``global_name`` names what
    it refers to (None when torch's message did not say); ``__cause__`` is torch's own
    error. An UnpicklingError too, as torch.load raises."""

    def __init__(self, path: str, global_name: Optional[str]):
        what = f"code ({global_name})" if global_name else "a pickled object outside the allowed types"
        shown = path if path.isprintable() else ascii(path)  # one line, whatever the file is called
        # Not CorruptCheckpointError's wording: the file is intact, its content is refused.
        ValueError.__init__(self, f"refused: {shown} contains {what}; qrnn loads checkpoints with weights_only=True")
        self.path = path
        self.record = None
        self.global_name = global_name
