"""Pickling a state's structure exactly as torch.save does, with the tensor bytes kept out:
each storage becomes a persistent id, and its bytes a record the C++ writer copies."""

from __future__ import annotations

import collections
import io
import pickle

import torch

from .. import _C

# Storage classes torch.save names for each dtype (legacy typed storages): the C++ writer's
# table (qrnn._C), plus quantized dtypes, which reduce through torch's own code and whose
# storages must keep their typed class (as an UntypedStorage they load as uint8 and the
# tensor cannot be rebuilt). Other dtypes are saved as torch.save does for them: an
# UntypedStorage and _rebuild_tensor_v3.
_LEGACY_STORAGE_NAMES = {getattr(torch, dtype): storage for dtype, storage in _C.checkpoint_storage_types}
_LEGACY_STORAGE_NAMES.update({
    torch.qint8: "QInt8Storage", torch.quint8: "QUInt8Storage", torch.qint32: "QInt32Storage",
    torch.quint4x2: "QUInt4x2Storage", torch.quint2x4: "QUInt2x4Storage",
})
_LEGACY_STORAGE = {dt: getattr(torch, name) for dt, name in _LEGACY_STORAGE_NAMES.items()}
_STORAGE_TYPES = frozenset([torch.UntypedStorage, torch.storage.TypedStorage, *_LEGACY_STORAGE.values()])


class StorageRef:
    """Stands in for a tensor's storage in the pickle; becomes a persistent id."""

    __slots__ = ("pid",)

    def __init__(self, pid: tuple):
        self.pid = pid


class Stored:
    """A storage the pickle refers to: its bytes become record ``data/<index>``."""

    __slots__ = ("storage", "nbytes", "device")

    def __init__(self, storage, nbytes: int, device: torch.device):
        self.storage = storage
        self.nbytes = nbytes
        self.device = device


class StatePickler(pickle.Pickler):
    """Pickles a state's structure exactly as torch.save does (protocol 2, each storage a
    persistent id ``("storage", type, key, location, numel)``), keeping tensor bytes out."""

    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.stored: list[Stored] = []
        self._refs: dict[int, tuple[StorageRef, torch.dtype]] = {}

    def _ref(self, storage: torch.UntypedStorage, dtype: torch.dtype) -> StorageRef:
        key = storage._cdata
        found = self._refs.get(key)
        if found is not None:
            ref, first_dtype = found
            if first_dtype != dtype and storage.nbytes() > 0:
                raise ValueError(
                    "state holds tensors that view the same storage as different dtypes "
                    f"({first_dtype} and {dtype}); torch.load cannot rebuild that: clone one of them")
            return ref
        nbytes = storage.nbytes()
        legacy = _LEGACY_STORAGE.get(dtype)
        pid: tuple
        if legacy is not None:
            pid = ("storage", legacy, str(len(self.stored)), torch.serialization.location_tag(storage),
                   nbytes // dtype.itemsize)
        else:
            pid = ("storage", torch.storage.UntypedStorage, str(len(self.stored)),
                   torch.serialization.location_tag(storage), nbytes)
        ref = StorageRef(pid)
        self._refs[key] = (ref, dtype)
        self.stored.append(Stored(storage, nbytes, storage.device))
        return ref

    def reducer_override(self, obj):
        if type(obj) is not torch.Tensor:
            return NotImplemented  # Parameters reduce to their .data, which comes back here
        if (obj.layout is not torch.strided or obj.is_quantized or obj.is_nested or obj.is_conj()
                or obj.is_neg() or obj.device.type == "meta" or obj.__dict__):
            return NotImplemented  # rare kinds: torch's own reduction, storages still come to us
        ref = self._ref(obj.untyped_storage(), obj.dtype)
        args: tuple = (ref, obj.storage_offset(), tuple(obj.size()), obj.stride(), obj.requires_grad,
                       collections.OrderedDict())
        if obj.dtype in _LEGACY_STORAGE:
            return torch._utils._rebuild_tensor_v2, args
        return torch._utils._rebuild_tensor_v3, args + (obj.dtype,)

    def persistent_id(self, obj):
        # Called for every object pickled: exact type checks only (isinstance on torch's
        # legacy storage classes goes through a Python metaclass and costs microseconds).
        kind = type(obj)
        if kind is StorageRef:
            return obj.pid
        if kind in _STORAGE_TYPES:
            if kind is torch.UntypedStorage:
                return self._ref(obj, torch.uint8).pid
            return self._ref(obj._untyped_storage, obj.dtype).pid
        return None


def pickle_state(state) -> tuple[bytes, list[Stored]]:
    """The data.pkl bytes of ``state`` and the storages it refers to, in key order (the
    writer stores storage i as record ``data/<i>``)."""
    buffer = io.BytesIO()
    pickler = StatePickler(buffer)
    pickler.dump(state)
    return buffer.getvalue(), pickler.stored
