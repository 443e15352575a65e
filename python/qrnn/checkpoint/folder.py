"""CheckpointFolder: a checkpoint folder read without a writer (no threads, no lock, nothing
deleted), by the listing rules of the C++ core (qrnn._C)."""

from __future__ import annotations

import errno
import operator
import os
from typing import Any, Optional, Union

from .. import _C
from .reader import load as _load

MAX_STEP = 2**63 - 1
# A checkpoint's name: <PREFIX><step:012d><SUFFIX> (an AsyncCheckpointer's prefix may differ).
PREFIX = "ckpt-"
SUFFIX = ".pt"
_ORDERS = ("commit", "step")
_LOAD_TRIES = 3  # a writer's retention may delete the latest between its listing and its opening


def check_step(step: Any) -> int:
    """``step`` as an int in 0..2**63-1; TypeError / ValueError naming ``step`` otherwise."""
    if isinstance(step, bool):
        raise TypeError("step must be an int, got bool")
    try:
        step = operator.index(step)
    except TypeError:
        raise TypeError(f"step must be an int, got {type(step).__name__}") from None
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"step must be in 0..2**63-1, got {step}")
    return step


def check_naming(prefix: Any, suffix: Any) -> None:
    """TypeError / ValueError naming ``prefix`` or ``suffix`` unless checkpoint names can be
    made of them (a writer's lock file is named after the prefix, so it must be non-empty)."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not prefix or os.sep in prefix or "\0" in prefix or prefix.startswith("."):
        raise ValueError(f"prefix must be a plain file-name start, got {prefix!r}")
    if not isinstance(suffix, str):
        raise TypeError(f"suffix must be a str, got {type(suffix).__name__}")
    if os.sep in suffix or "\0" in suffix:
        raise ValueError(f"suffix must be a plain file-name end, got {suffix!r}")


class CheckpointFolder:
    """The committed checkpoints of a folder, read only: the ``<prefix><step:012d><suffix>``
    files an :class:`AsyncCheckpointer` writes there.

    It starts no thread, takes no lock and deletes nothing, so any number of readers (an
    evaluator, a script finding the latest run) can work next to the folder's writer, in any
    process or on any host, and neither waits for the other. Temporaries of saves in
    progress, and anything else under a checkpoint's name that is not a regular file, are
    never listed.

    The folder is opened once, here: every listing is relative to it, so renaming the folder
    or a ``chdir`` afterwards redirects nothing. Paths are given under ``directory`` made
    absolute here.

    Args:
        directory: the folder (a ``str`` or ``os.PathLike``).
        prefix: the start of the checkpoint file names (a plain name not starting with ``.``).
        suffix: their end.

    Raises:
        TypeError, ValueError: a bad argument, named.
        OSError: the folder cannot be opened (``FileNotFoundError`` when it is missing).
    """

    def __init__(self, directory: Union[str, os.PathLike], *, prefix: str = PREFIX, suffix: str = SUFFIX):
        path = os.fspath(directory) if isinstance(directory, (str, os.PathLike)) else None
        if not isinstance(path, str):
            raise TypeError(f"directory must be a str or os.PathLike of a str, got {type(directory).__name__}")
        check_naming(prefix, suffix)
        where = os.path.abspath(path)
        self._set(path, where, _C.CheckpointFolder(where), prefix, suffix)

    @classmethod
    def _over(cls, directory: str, where: str, opened: Any, prefix: str, suffix: str) -> CheckpointFolder:
        """A reader of a folder some writer opened already (its descriptor, shared)."""
        reader = cls.__new__(cls)
        reader._set(directory, where, opened, prefix, suffix)
        return reader

    def _set(self, directory: str, where: str, opened: Any, prefix: str, suffix: str) -> None:
        self.directory, self.prefix, self.suffix = directory, prefix, suffix
        self._where, self._opened = where, opened

    def checkpoints(self, order: str = "commit") -> list[str]:
        """Paths of the committed checkpoints, oldest commit first (``order="step"``: lowest
        step first)."""
        return [os.path.join(self._where, name) for name, _, _ in self._list(order)]

    def steps(self, order: str = "commit") -> list[int]:
        """Steps of the committed checkpoints, in the order of :meth:`checkpoints`."""
        return [step for _, step, _ in self._list(order)]

    def latest(self, order: str = "commit") -> Optional[str]:
        """Path of the most recently committed checkpoint (``order="step"``: of the highest
        step), or None when there is none."""
        found = self._list(order)
        return os.path.join(self._where, found[-1][0]) if found else None

    def load(self, step: Optional[int] = None, map_location: Any = None, *, weights_only: bool = True,
             mmap: bool = False) -> Any:
        """The checkpoint of ``step``, or the most recently committed one (None), read by
        :func:`qrnn.checkpoint.load`, which ``map_location``, ``weights_only`` and ``mmap``
        are passed to and whose errors this raises. A latest checkpoint that a writer's
        retention deleted before it could be opened is looked up again.

        Raises:
            FileNotFoundError: no checkpoint of ``step``, or none at all.
        """
        if step is not None:
            return _load(self._path(check_step(step)), map_location, weights_only=weights_only, mmap=mmap)
        tries = _LOAD_TRIES
        while True:
            path = self.latest()
            if path is None:
                raise FileNotFoundError(errno.ENOENT, f"checkpoint folder '{self._where}' has no checkpoint "
                                        f"named {self.prefix}<step>{self.suffix}", self._where)
            try:
                return _load(path, map_location, weights_only=weights_only, mmap=mmap)
            except FileNotFoundError:
                tries -= 1
                if tries == 0:
                    raise

    def __repr__(self) -> str:
        return f"CheckpointFolder({self.directory!r}, prefix={self.prefix!r}, suffix={self.suffix!r})"

    def _path(self, step: int) -> str:
        """Where the checkpoint of ``step`` is (or would be)."""
        return os.path.join(self._where, _C.checkpoint_file_name(self.prefix, step, self.suffix))

    def _list(self, order: str) -> list:
        """[(name, step, commit_ns)] in ``order``."""
        if order not in _ORDERS:
            raise ValueError(f"order must be 'commit' or 'step', got {order!r}")
        return self._opened.list(self.prefix, self.suffix, by_step=order == "step")
