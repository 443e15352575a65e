"""torch.distributed.checkpoint's storage interfaces on the C++ checkpoint writer.

Files are laid out as DCP's ``FileSystemWriter`` lays them out, so that plain
``torch.distributed.checkpoint.load`` reads them: a rank's items go to ``__<rank>_0.distcp``,
each tensor a complete ``torch.save`` archive at its byte range and each byte item raw, and
the coordinator writes ``.metadata``, a pickled ``Metadata`` whose ``storage_data`` maps every
item to ``_StorageInfo(relative_path, offset, length)``.

Commit protocol: every rank's file is written by the writer thread to a locked temporary,
fsynced, renamed and its folder fsynced; only when every rank reported its file committed
does the coordinator write ``.metadata`` the same way (temporary, fsync, rename, folder
fsync). A folder without ``.metadata`` is no checkpoint: ``latest()`` skips it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import io
import mmap
import os
import pathlib
import pickle
import struct
import threading
import uuid
from typing import Any, Optional, Union

import torch
from torch.distributed.checkpoint import filesystem as _filesystem
from torch.distributed.checkpoint import metadata as _metadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ... import _C
from ..checkpointer import _checkpoint_error
from ..errors import CheckpointError, CorruptCheckpointError, UnsafeCheckpointError
from ..pickler import _LEGACY_STORAGE, StorageRef
from ..reader import _check_archive, _messages, refused_global
from ..staging import StagingSlot
from . import folders

METADATA = ".metadata"
_SUFFIX = ".distcp"
_StorageInfo = _filesystem._StorageInfo
_HAS_TRANSFORMS = any(f.name == "transform_descriptors" for f in dataclasses.fields(_StorageInfo))

# ---- the process's writer --------------------------------------------------------------

_writer_lock = threading.Lock()
_writer: Any = None
_writer_pid = 0


def writer() -> Any:
    """The process's C++ writer for DCP saves (one pending save: its staging image, reused
    from save to save, is the only copy of the rank's shard it holds); a fresh one in a
    forked child."""
    global _writer, _writer_pid
    with _writer_lock:
        if _writer is None or _writer_pid != os.getpid():
            _writer, _writer_pid = _C.CheckpointWriter(max_pending=1), os.getpid()
        return _writer


_threads: dict = {}


def background(role: str) -> concurrent.futures.ThreadPoolExecutor:
    """A thread of its own per role ("file": waits for the rank's file; "commit": the
    save's collectives and .metadata), started once per process: no thread start (which
    waits for the new thread to run, behind the staging copy) in the caller's path."""
    key = (role, os.getpid())
    with _writer_lock:
        pool = _threads.get(key)
        if pool is None:
            pool = _threads[key] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"qrnn-dcp-{role}")
        return pool


# ---- writing ---------------------------------------------------------------------------


class _Rebuild:
    """Pickles as torch.save pickles a contiguous tensor of its own storage."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __reduce__(self):
        t = self.tensor
        legacy = _LEGACY_STORAGE.get(t.dtype)
        stride, running = [], 1
        for size in reversed(t.shape):
            stride.append(running)
            running *= size
        args: tuple = (tuple(t.shape), tuple(reversed(stride)), False, collections.OrderedDict())
        if legacy is not None:
            ref = StorageRef(("storage", legacy, "0", "cpu", t.numel()))
            return torch._utils._rebuild_tensor_v2, (ref, 0) + args
        ref = StorageRef(("storage", torch.UntypedStorage, "0", "cpu", t.numel() * t.element_size()))
        return torch._utils._rebuild_tensor_v3, (ref, 0) + args + (t.dtype,)


class _TensorPickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if type(obj) is StorageRef else None


def tensor_pickle(tensor: torch.Tensor) -> bytes:
    """The data.pkl of ``torch.save(tensor)`` for a contiguous CPU tensor, storage ``0``
    holding exactly its bytes."""
    if tensor.layout is not torch.strided or tensor.is_quantized or tensor.is_nested:
        raise ValueError(f"qrnn.checkpoint.dcp saves strided tensors only, got {tensor.layout} / {tensor.dtype}")
    buffer = io.BytesIO()
    _TensorPickler(buffer, protocol=2).dump(_Rebuild(tensor))
    return buffer.getvalue()


def _storage_info(path: str, offset: int, length: int) -> Any:
    if _HAS_TRANSFORMS:
        return _StorageInfo(relative_path=path, offset=offset, length=length, transform_descriptors=None)
    return _StorageInfo(relative_path=path, offset=offset, length=length)


def _save_error(status: Any) -> CheckpointError:
    number, operation, path, message = status.error()
    return CheckpointError(number, message, path, operation=operation)


class _FolderId:
    """What DCP asks a storage of its checkpoint_id: the folder, a path."""

    path: str

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Union[str, os.PathLike]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


class QRNNStorageWriter(_FolderId, StorageWriter):
    """A ``torch.distributed.checkpoint`` StorageWriter on qrnn's C++ checkpoint writer.

    ``write_data`` hands the rank's items to the writer's threads (the staging copy and the
    writes run with the GIL released) and returns at once; the returned future completes
    when the rank's file is committed. ``staged()``/``wait_staged()`` tell when the tensors
    were copied (from then on they may change). Files load with DCP's own
    ``FileSystemReader``; ``finish`` commits ``.metadata`` and fsyncs the folder.

    Args:
        path: the checkpoint folder (created with its missing parents, each fsynced).
        keep_last: when ``path`` is a step folder (``step-<n>``, see :func:`step_folder`),
            delete all but the ``keep_last`` newest committed step folders next to it after
            the commit (None keeps all).
        sync: fsync files and folders (False: fast, not durable across a machine crash).
    """

    def __init__(self, path: Union[str, os.PathLike] = "", *, keep_last: Optional[int] = None, sync: bool = True):
        super().__init__()
        self.path = os.path.abspath(os.fspath(path)) if path else ""
        self.keep_last = keep_last
        self.sync = sync
        self.is_coordinator = False
        self.rank = 0
        self.save_id = uuid.uuid4().hex
        self._status: Any = None
        self._opened: Any = None

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        if checkpoint_id:
            self.path = os.path.abspath(os.fspath(checkpoint_id))
        self.save_id = uuid.uuid4().hex
        self._status = self._opened = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        if rank is None:
            rank = torch.distributed.get_rank() if _distributed() else 0
        self.rank = rank

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        folder = self._folder()
        if self.is_coordinator:
            # Overwriting a step: it stops being a checkpoint before any file changes.
            folders.decommit(folder)
        if plan.storage_data is None:
            plan = dataclasses.replace(plan, storage_data=_filesystem._StoragePrefix(f"__{self.rank}_"))
        return plan

    def prepare_global_plan(self, plans: list) -> list:
        return [plan if plan.storage_data is not None else
                dataclasses.replace(plan, storage_data=_filesystem._StoragePrefix(f"__{i}_"))
                for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        name = f"{plan.storage_data.prefix}0{_SUFFIX}"
        tensors: list = []  # (item, contiguous tensor)
        raw: list = []      # (item, memoryview of its bytes)
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                raw.append((item, data.getbuffer()))
            else:
                assert isinstance(data, torch.Tensor)
                tensor = data.detach()
                tensors.append((item, tensor if tensor.is_contiguous() else tensor.contiguous()))
        on_gpu = [t.device.type == "cuda" for _, t in tensors]
        archives: list = [(tensor_pickle(t), [(0 if gpu else t.data_ptr(), _nbytes(t))])
                          for (_, t), gpu in zip(tensors, on_gpu)]
        if raw:
            archives.append((None, [(_address(view), len(view)) for _, view in raw]))
        target = os.path.join(self.path, name)
        planned = _C.checkpoint_plan(target, b"", [], archives=archives, folder=self._folder())  # laid out once
        record_offsets, starts, sizes = planned.record_offsets, planned.archive_offsets, planned.archive_sizes
        results = [WriteResult(index=item.index, size_in_bytes=size, storage_data=_storage_info(name, start, size))
                   for (item, _), start, size in zip(tensors, starts, sizes)]
        for (item, view), offset in zip(raw, record_offsets[len(tensors):]):
            results.append(WriteResult(index=item.index, size_in_bytes=len(view),
                                       storage_data=_storage_info(name, offset, len(view))))
        address = capacity = 0
        if any(on_gpu):  # device -> pinned image, the only host copy, reused from save to save
            slot = _pinned_slot(planned.staging_size)
            _copy_from_gpu(slot, [t for (_, t), gpu in zip(tensors, on_gpu) if gpu],
                           [o for o, gpu in zip(record_offsets, on_gpu) if gpu])
            address, capacity = slot.address, slot.capacity
        keep = [t for _, t in tensors] + [view for _, view in raw]  # alive until written
        self._status = status = writer().submit(planned, staging=address, staging_capacity=capacity)
        _last_status[0] = status
        future: Future = Future()
        background("file").submit(self._complete, status, future, results, keep)
        return future

    @staticmethod
    def _complete(status: Any, future: Future, results: list, keep: list) -> None:
        status.wait()
        keep.clear()
        if status.ok():
            future.set_result(results)
        else:
            future.set_exception(_save_error(status))

    def staged(self) -> bool:
        return self._status is None or self._status.staged()

    def wait_staged(self) -> None:
        """Block until the tensors written by the last ``write_data`` are copied."""
        if self._status is not None:
            self._status.wait_staged()

    def finish(self, metadata: Any, results: list) -> None:
        storage = {}
        for rank_results in results:
            storage.update({r.index: r.storage_data for r in rank_results})
        metadata.storage_data = storage
        version = getattr(_metadata, "CURRENT_DCP_VERSION", None) or getattr(_filesystem, "CURRENT_DCP_VERSION", None)
        if version is not None and hasattr(metadata, "version"):
            metadata.version = version
        if hasattr(metadata, "storage_meta"):
            metadata.storage_meta = self.storage_meta()
        data = pickle.dumps(metadata)
        folder = self._folder()
        try:
            folder.write_file(METADATA, data, sync=self.sync)
        except OSError as error:
            raise _checkpoint_error(error, operation="commit") from None
        if self.keep_last is not None:
            folders.apply_retention(self.path, self.keep_last)

    def storage_meta(self) -> Any:
        meta = getattr(_metadata, "StorageMeta", None)
        return None if meta is None else meta(checkpoint_id=self.path, save_id=self.save_id)

    def _folder(self) -> Any:
        """The checkpoint folder, made (with its parents, each fsynced) and opened once per save."""
        if not self.path:
            raise ValueError("QRNNStorageWriter needs a checkpoint_id (a folder)")
        if self._opened is None or self._opened.path != self.path:
            try:
                self._opened = _C.CheckpointFolder(self.path, True)
            except OSError as error:
                raise _checkpoint_error(error, operation="open") from None
        return self._opened


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view)) if len(view) else 0


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# The pinned staging image of GPU shards and the save that last used it (the writer has one
# save pending at most, so waiting for the last one frees the image).
_slot = StagingSlot()
_last_status: list = [None]


def _pinned_slot(nbytes: int) -> StagingSlot:
    if _last_status[0] is not None:
        _last_status[0].wait()
    _slot.ensure(nbytes, pinned=True)
    return _slot


def _copy_from_gpu(slot: StagingSlot, tensors: list, offsets: list) -> None:
    """Device -> pinned copies on a side stream after the work queued so far; waited for, so
    the tensors may change when write_data returns."""
    image = slot.image
    assert image is not None
    stream = torch.cuda.Stream(device=tensors[0].device)
    stream.wait_stream(torch.cuda.current_stream(tensors[0].device))
    with torch.cuda.stream(stream):
        for tensor, offset in zip(tensors, offsets):
            n = _nbytes(tensor)
            if n:
                image[offset:offset + n].copy_(tensor.reshape(-1).view(torch.uint8), non_blocking=True)
    stream.synchronize()


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


# ---- reading ---------------------------------------------------------------------------

# What a DCP .metadata pickle refers to, and nothing else (no code: a pickle naming anything
# else is refused before it is built).
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
     ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}
# StorageMeta.checkpoint_id may be a path: pathlib's classes (in pathlib._local on Python 3.13+).
_PATHS = {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}
_TORCH_VALUES = (torch.dtype, torch.memory_format, torch.layout)  # torch.float32, torch.strided, ...
_MAX_METADATA = 1 << 30  # a .metadata larger than this is not one (it is ~100 bytes per chunk)


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module in ("pathlib", "pathlib._local") and name in _PATHS:
            return getattr(pathlib, name)
        if module == "torch" and isinstance(getattr(torch, name, None), _TORCH_VALUES):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name} was not an allowed global")


def _plain_name(name: Any) -> bool:
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and "\0" not in name and name.isprintable())


def read_metadata_file(folder: str) -> Any:
    """The checked ``Metadata`` of the checkpoint in ``folder``: no code in the pickle, every
    item in a file of the folder (a plain name) within that file's size."""
    path = os.path.join(folder, METADATA)
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > _MAX_METADATA:
                raise CorruptCheckpointError(path, None, f"{size} bytes, more than a DCP .metadata holds")
            data = file.read()
    except FileNotFoundError:
        raise CorruptCheckpointError(path, None, "missing: the folder holds no committed checkpoint") from None
    try:
        meta = _MetadataUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as error:
        name = refused_global(str(error))
        if name is not None:
            raise UnsafeCheckpointError(path, name) from None
        raise CorruptCheckpointError(path, None, f"truncated or not a DCP metadata pickle ({error})") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, struct.error) as error:
        raise CorruptCheckpointError(path, None, f"truncated or not a DCP metadata pickle "
                                                 f"({type(error).__name__})") from None
    if not isinstance(meta, _metadata.Metadata) or not isinstance(getattr(meta, "storage_data", None), dict):
        raise CorruptCheckpointError(path, None, "not a DCP Metadata with storage data")
    sizes: dict = {}
    for index, info in meta.storage_data.items():
        name = getattr(info, "relative_path", "")
        if not isinstance(info, _StorageInfo) or not _plain_name(name):
            raise CorruptCheckpointError(path, None, f"item {getattr(index, 'fqn', index)!r} names a file outside "
                                                     f"the folder: {name!r}")
        if getattr(info, "transform_descriptors", None):
            raise CorruptCheckpointError(path, None, "stream transforms (compression, encryption) are not read here")
        if name not in sizes:
            try:
                sizes[name] = os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:
                raise CorruptCheckpointError(path, None, f"shard file '{name}' is missing") from None
        offset, length = info.offset, info.length
        if (not isinstance(offset, int) or not isinstance(length, int) or offset < 0 or length < 0
                or offset + length > sizes[name]):
            raise CorruptCheckpointError(path, None, f"item {getattr(index, 'fqn', index)!r} claims bytes "
                                                     f"{offset}..{offset}+{length} of '{name}', which holds "
                                                     f"{sizes[name]}")
    return meta


def check_item(path: str, view: memoryview, offset: int, length: int) -> None:
    """The zip structure of the archive at [offset, offset + length) of a mapped file: every
    declared size and offset within it, so loading it allocates no more than it holds."""
    if offset + length > len(view):
        raise CorruptCheckpointError(path, None, f"shorter than its .metadata says ({offset}+{length})")
    try:
        problem = _check_archive(view[offset:offset + length], length, check_crc=False)
    except (ValueError, IndexError, UnicodeDecodeError, OverflowError, struct.error) as error:
        problem = (None, f"unreadable zip structure ({type(error).__name__})")
    if problem is not None:
        raise CorruptCheckpointError(f"{path}@{offset}", problem[0], problem[1])


def load_value(path: str, view: memoryview, offset: int, length: int) -> Any:
    """The object of a checked archive, unpickled with ``weights_only=True``: a pickle that
    holds code is refused in one line, nothing in it run."""
    try:
        return torch.load(io.BytesIO(view[offset:offset + length]), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, AssertionError) as error:
        raise UnsafeCheckpointError(f"{path}@{offset}", refused_global(_messages(error))) from None


def load_tensor(path: str, view: memoryview, offset: int, length: int) -> torch.Tensor:
    tensor = load_value(path, view, offset, length)
    if not isinstance(tensor, torch.Tensor):
        raise CorruptCheckpointError(f"{path}@{offset}", None, "holds no tensor")
    return tensor


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if offset != 0 or length != tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


class QRNNStorageReader(_FolderId, StorageReader):
    """A ``torch.distributed.checkpoint`` StorageReader for folders written by
    :class:`QRNNStorageWriter` or by DCP's own ``FileSystemWriter`` (torch.save serialization),
    with ``qrnn.checkpoint.load``'s refusals of hostile files: a ``.metadata`` that holds code,
    is truncated, names files outside the folder, missing files or bytes beyond a file's
    end raises one :class:`CorruptCheckpointError` (or :class:`UnsafeCheckpointError`)
    before any tensor is loaded."""

    def __init__(self, path: Union[str, os.PathLike] = ""):
        super().__init__()
        self.path = os.fspath(path) if path else ""
        self.storage_data: dict = {}

    def reset(self, checkpoint_id: Union[str, os.PathLike, None] = None) -> None:
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.storage_data = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        meta = read_metadata_file(self.path)
        if hasattr(meta, "storage_meta") and meta.storage_meta is None and hasattr(_metadata, "StorageMeta"):
            meta.storage_meta = _metadata.StorageMeta()
        if getattr(meta, "storage_meta", None) is not None and hasattr(meta.storage_meta, "load_id"):
            meta.storage_meta.load_id = uuid.uuid4().hex
        return meta

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list) -> list:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        per_file: dict = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        with contextlib.ExitStack() as stack:
            views = {name: self._map(name, stack) for name in per_file}
            # Every archive's structure, and every byte item's value, first: nothing is loaded
            # from a damaged folder. DCP's planners unpickle byte items with weights_only=False:
            # they get the re-serialized value the weights-only unpickler accepted instead.
            values: dict = {}
            for name, items in per_file.items():
                path = os.path.join(self.path, name)
                for item in items:
                    info = self.storage_data[item.storage_index]
                    check_item(path, views[name], info.offset, info.length)
                    if item.type == LoadItemType.BYTE_IO:
                        values[id(item)] = load_value(path, views[name], info.offset, info.length)
            for name, items in per_file.items():
                path, view = os.path.join(self.path, name), views[name]
                for item in sorted(items, key=lambda i: self.storage_data[i.storage_index].offset):
                    info = self.storage_data[item.storage_index]
                    if item.type == LoadItemType.BYTE_IO:
                        checked = io.BytesIO()
                        torch.save(values.pop(id(item)), checked)
                        checked.seek(0)
                        planner.load_bytes(item, checked)
                        continue
                    tensor = _narrow(load_tensor(path, view, info.offset, info.length), item.storage_offsets,
                                     item.lengths)
                    target = planner.resolve_tensor(item).detach()
                    if target.size() != tensor.size():
                        raise CorruptCheckpointError(path, None, f"item {item.storage_index.fqn!r} has size "
                                                                 f"{tuple(tensor.size())}, its metadata says "
                                                                 f"{tuple(target.size())}")
                    target.copy_(tensor)
                    planner.commit_tensor(item, target)
        future: Future = Future()
        future.set_result(None)
        return future

    def _map(self, name: str, stack: contextlib.ExitStack) -> memoryview:
        """The shard file, mapped read-only (pages read as items are loaded)."""
        path = os.path.join(self.path, name)
        try:
            file = stack.enter_context(open(path, "rb"))
        except FileNotFoundError:
            raise CorruptCheckpointError(os.path.join(self.path, METADATA), None,
                                         f"shard file '{name}' is missing") from None
        if os.fstat(file.fileno()).st_size == 0:
            return memoryview(b"")
        mapped = stack.enter_context(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))
        view = memoryview(mapped)
        stack.callback(view.release)
        return view



__all__ = ["QRNNStorageWriter", "QRNNStorageReader", "METADATA"]
