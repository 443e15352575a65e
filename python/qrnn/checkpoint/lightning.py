"""PyTorch Lightning's checkpoint I/O on ``async_save``: ``Trainer(plugins=[QRNNCheckpointIO()])``.

Imported only by whoever asks for it (``import qrnn`` and ``import qrnn.checkpoint`` never
import Lightning); without Lightning installed, importing it raises ImportError."""

from __future__ import annotations

import importlib
import os
from typing import Any, Optional

from .handle import SaveHandle
from .saver import async_save, wait_all


def _torch_checkpoint_io() -> Any:
    """Lightning's TorchCheckpointIO, from the ``lightning`` package or the older
    ``pytorch_lightning`` one (by name: either may be installed alone)."""
    for module in ("lightning.pytorch.plugins.io", "pytorch_lightning.plugins.io"):
        try:
            return importlib.import_module(module).TorchCheckpointIO
        except ImportError:
            continue
    raise ImportError("qrnn.checkpoint.lightning needs PyTorch Lightning: pip install lightning "
                      "(or pytorch-lightning)")


TorchCheckpointIO: Any = _torch_checkpoint_io()


class QRNNCheckpointIO(TorchCheckpointIO):
    """Lightning's CheckpointIO whose ``save_checkpoint`` returns once the snapshot is taken
    and writes the file in the background (:func:`qrnn.checkpoint.async_save`: temporary,
    fsync, rename; the file torch.save writes). Loading and removing a path first wait for
    that path's save; a failed save raises :class:`CheckpointError` from the next
    ``save_checkpoint`` or from ``teardown`` (end of fit). Remote (``scheme://``) paths are
    saved by Lightning's own blocking writer."""

    def __init__(self) -> None:
        super().__init__()
        self._pending: dict[str, SaveHandle] = {}  # path -> its latest save

    def save_checkpoint(self, checkpoint: dict, path: Any, storage_options: Optional[Any] = None) -> None:
        """Save ``checkpoint`` to ``path`` with :func:`qrnn.checkpoint.async_save` (creating
        the folder), returning once the snapshot is taken; raises :class:`CheckpointError`
        for an earlier save that failed (this one is still made). ``storage_options`` or a
        remote path: Lightning's own writer."""
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)  # its TypeError, or a remote file system
            return
        key = self._key(path)
        os.makedirs(os.path.dirname(key), exist_ok=True)  # as Lightning's own writer does
        self._forget_finished()
        try:
            self._pending[key] = async_save(checkpoint, key)
        except Exception as error:  # an earlier save failed; this one was still made
            later = getattr(error, "next_handle", None)
            if later is not None:
                self._pending[key] = later
            raise

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> dict:
        """Lightning's ``load_checkpoint``, after waiting for a pending save of ``path``."""
        self._settle(path)  # read what was saved last, not the file before it
        return super().load_checkpoint(path, *args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        """Lightning's ``remove_checkpoint``, after waiting for a pending save of ``path``."""
        self._settle(path)  # never race the rename of a pending save of this path
        super().remove_checkpoint(path)

    def teardown(self) -> None:
        """Wait for every pending save; raise the first failure nobody was told about."""
        self._pending.clear()
        wait_all()

    @staticmethod
    def _key(path: Any) -> str:
        return os.path.abspath(os.fsdecode(os.fspath(path)))

    def _settle(self, path: Any) -> None:
        if "://" in str(path):
            return
        handle = self._pending.pop(self._key(path), None)
        if handle is not None:
            handle.wait()  # a failure is raised by the next save or teardown

    def _forget_finished(self) -> None:
        for key in [k for k, handle in self._pending.items() if handle.done()]:
            del self._pending[key]
