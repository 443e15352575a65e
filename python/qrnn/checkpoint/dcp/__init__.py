"""Sharded checkpoints: qrnn's C++ writer as torch.distributed.checkpoint's storage.

    from qrnn.checkpoint import dcp
    future = dcp.async_save(state_dict, checkpoint_id=dcp.step_folder("runs/ckpt", step), keep_last=3)
    ...                                          # train on: the state was copied at the call
    dcp.load(state_dict, checkpoint_id=dcp.latest("runs/ckpt"))   # any number of ranks

Files are DCP's own layout (``__<rank>_0.distcp`` + ``.metadata``): plain
``torch.distributed.checkpoint.load`` reads them, and :class:`QRNNStorageReader` reads DCP's
files. A step folder is a checkpoint once its ``.metadata`` is committed, which happens after
every rank's file was written, fsynced and renamed, and is followed by a folder fsync.
"""

from .folders import checkpoints, latest, step_folder
from .saver import async_save, checkpoint_group, load, load_all, save, wait
from .storage import QRNNStorageReader, QRNNStorageWriter

__all__ = ["QRNNStorageWriter", "QRNNStorageReader", "async_save", "save", "load", "load_all", "wait",
           "checkpoint_group", "latest", "checkpoints", "step_folder"]
