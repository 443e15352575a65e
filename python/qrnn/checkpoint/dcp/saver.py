"""Saving and loading through torch.distributed.checkpoint's planners with qrnn's storage:
``async_save`` (DCP's call, made non-blocking by the C++ writer: the caller waits for the
plan and the staging copy only), ``save`` and ``load``."""

from __future__ import annotations

import concurrent.futures
import inspect
import os
import threading
import warnings
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.futures import Future

from ..errors import CheckpointError, CorruptCheckpointError
from .storage import QRNNStorageReader, QRNNStorageWriter, background, read_metadata_file

try:
    from torch.distributed.checkpoint.stateful import Stateful
except ImportError:  # pragma: no cover - every supported torch has it
    Stateful = None  # type: ignore[assignment,misc]

_lock = threading.Lock()
_pending: Optional[concurrent.futures.Future] = None
_groups: dict = {}
_plans: dict = {}  # group -> (structure of the state, final plan, metadata) of its last save

_DTensor: Any
try:
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # torch 2.4
    try:
        from torch.distributed._tensor import DTensor as _DTensor
    except ImportError:
        _DTensor = None


class _Comm:
    """Object collectives of one save on a gloo group of its own (none in one process)."""

    def __init__(self, group: Any):
        self.group = group
        self.key = id(group)
        self.distributed = group is not None
        if self.distributed:
            self.rank = dist.get_rank(group)
            self.coordinator = dist.get_global_rank(group, 0) if hasattr(dist, "get_global_rank") else 0
        else:
            self.rank, self.coordinator = 0, 0

    @property
    def is_coordinator(self) -> bool:
        return self.rank == 0

    def gather(self, obj: Any) -> Optional[list]:
        if not self.distributed:
            return [obj]
        out = [None] * dist.get_world_size(self.group) if self.is_coordinator else None
        dist.gather_object(obj, out, dst=self.coordinator, group=self.group)
        return out

    def scatter(self, objs: Optional[list]) -> Any:
        if not self.distributed:
            assert objs is not None
            return objs[0]
        out: list = [None]
        dist.scatter_object_list(out, objs if self.is_coordinator else None, src=self.coordinator, group=self.group)
        return out[0]

    def all_true(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (one all_reduce)."""
        if not self.distributed:
            return flag
        value = torch.tensor([1 if flag else 0], dtype=torch.int32)
        dist.all_reduce(value, op=dist.ReduceOp.MIN, group=self.group)
        return bool(value.item())

    def broadcast(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.coordinator, group=self.group)
        return box[0]


def checkpoint_group(process_group: Any = None) -> Any:
    """A gloo group with the ranks of ``process_group`` (the default group when None), made at
    its first use and kept: a save's collectives never share the training's group (nor its
    NCCL communicator), so they cannot interleave with training collectives. None when
    torch.distributed is not initialized. Every rank of the default group must make its
    first call for the same group at the same point (``torch.distributed.new_group``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    ranks = tuple(dist.get_process_group_ranks(process_group)) if process_group is not None else None
    group = _groups.get(ranks)
    if group is None:
        group = _groups[ranks] = dist.new_group(ranks=list(ranks) if ranks else None, backend="gloo")
    return group


def _failure(error: BaseException) -> tuple:
    """An outcome to send to the other ranks: the error in one sentence."""
    if isinstance(error, OSError) and error.strerror:
        return ("error", error.strerror)
    return ("error", f"{type(error).__name__}: {error}")


def _raise_failures(gathered: list, what: str) -> None:
    failed = [f"rank {rank}: {outcome[1]}" for rank, outcome in enumerate(gathered) if outcome[0] != "ok"]
    if failed:
        raise CheckpointError(0, "; ".join(failed), operation=what)


def _call(method: Any, *args: Any, **kwargs: Any) -> Any:
    """``method(*args, **kwargs)`` with only the keyword arguments it takes (they grew across
    torch versions)."""
    params = inspect.signature(method).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return method(*args, **kwargs)


def _structure(value: Any) -> Any:
    """What a save plan depends on: keys, container shapes, and each tensor's shape, dtype
    and (for a DTensor) layout and this rank's place in it; never values. None for what it
    cannot describe (no cached plan then)."""
    if isinstance(value, dict):
        items = tuple((k, _structure(v)) for k, v in value.items())
        return None if any(v is None for _, v in items) else ("dict", items)
    if isinstance(value, (list, tuple)):
        parts = tuple(_structure(v) for v in value)
        return None if any(v is None for v in parts) else (type(value).__name__, parts)
    if _DTensor is not None and isinstance(value, _DTensor):
        mesh = value.device_mesh
        return ("dtensor", tuple(value.shape), value.dtype, tuple(str(p) for p in value.placements),
                tuple(mesh.shape), tuple(mesh.get_coordinate() or ()), tuple(value.to_local().shape))
    if type(value) is torch.Tensor or isinstance(value, torch.nn.Parameter):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, torch.Tensor):  # ShardedTensor and other subclasses: planned every time
        return None
    return type(value).__name__


def _plan(state_dict: dict, writer: Any, planner: Any, comm: _Comm, cacheable: bool) -> tuple:
    """DCP's planning (local plans gathered, the global plan made by the coordinator,
    scattered back); returns (metadata on the coordinator, the rank's final plan).

    Cached plans: when every rank's state has the structure of its previous save through
    this group (one all_reduce says so), the previous plan is reused; making a DTensor's
    plan costs more than copying its bytes (in the torch versions read)."""
    if Stateful is not None:
        state_dict = {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}
    local: tuple
    try:
        _call(writer.set_up_storage_writer, comm.is_coordinator, rank=comm.rank, use_collectives=True)
        _call(planner.set_up_planner, state_dict, storage_meta=writer.storage_meta(),
              is_coordinator=comm.is_coordinator)
        key = _structure(state_dict) if cacheable else None
        cached = _plans.get(comm.key)
        hit = key is not None and cached is not None and cached[0] == key
        if hit:
            assert cached is not None
            writer.prepare_local_plan(cached[1])  # the folder made, an old commit undone
    except Exception as error:  # every rank must reach the collectives: no hang on one failure
        hit, key, cached, local = False, None, None, _failure(error)
    else:
        local = ("ok", None)
    if comm.all_true(hit):
        assert cached is not None
        return cached[2], planner.finish_plan(cached[1])
    if local[0] == "ok":
        try:
            local = ("ok", writer.prepare_local_plan(planner.create_local_plan()))
        except Exception as error:
            local = _failure(error)
    gathered = comm.gather(local)
    central: Optional[list] = None
    metadata = None
    if comm.is_coordinator:
        assert gathered is not None
        if all(outcome[0] == "ok" for outcome in gathered):
            try:
                plans, metadata = planner.create_global_plan([outcome[1] for outcome in gathered])
                plans = writer.prepare_global_plan(plans)
                central = [("ok", plan) for plan in plans]
            except Exception as error:
                central = [_failure(error)] * len(gathered)
        else:
            central = [("error", "; ".join(o[1] for o in gathered if o[0] != "ok"))] * len(gathered)
    mine = comm.scatter(central)
    if mine[0] != "ok":
        _plans.pop(comm.key, None)
        raise CheckpointError(0, f"checkpoint planning failed: {mine[1]}", operation="plan")
    final = planner.finish_plan(mine[1])
    if key is not None:
        _plans[comm.key] = (key, final, metadata)
    return metadata, final


def _commit(writer: Any, written: Any, metadata: Any, comm: _Comm, result: concurrent.futures.Future) -> None:
    """Background: wait for the rank's file, gather every rank's results, the coordinator
    commits ``.metadata``; every rank learns the outcome."""
    try:
        local: tuple = ("ok", written.wait())
    except Exception as error:
        local = _failure(error)
    try:
        gathered = comm.gather(local)
        outcome: tuple = ("ok", None)
        if comm.is_coordinator:
            assert gathered is not None
            try:
                _raise_failures(gathered, "write")
                writer.finish(metadata, [o[1] for o in gathered])
            except Exception as error:
                outcome = _failure(error)
        outcome = comm.broadcast(outcome)
        if outcome[0] != "ok":
            raise CheckpointError(0, f"checkpoint '{writer.checkpoint_id}' was not committed: {outcome[1]}",
                                  operation="commit")
        result.set_result(writer.checkpoint_id)
    except BaseException as error:
        result.set_exception(error)


def async_save(state_dict: dict, *, checkpoint_id: Union[str, os.PathLike, None] = None,
               storage_writer: Optional[QRNNStorageWriter] = None, planner: Any = None, process_group: Any = None,
               keep_last: Optional[int] = None) -> concurrent.futures.Future:
    """torch.distributed.checkpoint's ``async_save``, on qrnn's writer: returns a
    ``concurrent.futures.Future`` (its result the checkpoint folder) once the plan is made and
    this rank's tensors are copied into the writer's staging image, which is reused from save
    to save (no per-save copy of the state, no process). From then on the state may change.
    The rank's file is written, fsynced and committed by a C++ thread; then, on a thread of
    this call, the ranks' results are gathered and the coordinator commits ``.metadata``.

    Every collective of the save runs on a gloo group of its own (:func:`checkpoint_group`),
    never on the training's. One save is in flight at a time: a call first waits for the
    previous one (a failure of it stays in its own future).

    Args:
        state_dict: as for ``torch.distributed.checkpoint.save`` (DTensors, tensors, Stateful
            objects, other picklable values).
        checkpoint_id: the folder (e.g. :func:`step_folder`).
        storage_writer: a :class:`QRNNStorageWriter` (made for ``checkpoint_id`` when None).
        planner: a SavePlanner (DCP's DefaultSavePlanner when None).
        process_group: the ranks that save (the default group when None).
        keep_last: retention across step folders, see :class:`QRNNStorageWriter`.
    """
    global _pending
    with _lock:
        previous = _pending
    if previous is not None:
        concurrent.futures.wait([previous])
    writer = storage_writer if storage_writer is not None else QRNNStorageWriter(keep_last=keep_last)
    writer.reset(checkpoint_id)
    cacheable = planner is None  # a planner of the caller's may plan differently each time
    planner = planner if planner is not None else DefaultSavePlanner()
    comm = _Comm(checkpoint_group(process_group))
    metadata, plan = _plan(state_dict, writer, planner, comm, cacheable)
    result: concurrent.futures.Future = concurrent.futures.Future()
    try:
        written = writer.write_data(plan, planner)
        writer.wait_staged()
    except Exception as error:
        # The other ranks wait in the commit's gather: they learn of this failure there.
        written = Future()
        written.set_exception(error)
        raise
    finally:
        background("commit").submit(_commit, writer, written, metadata, comm, result)
        with _lock:
            _pending = result
    return result


def save(state_dict: dict, *, checkpoint_id: Union[str, os.PathLike], process_group: Any = None,
         planner: Any = None, keep_last: Optional[int] = None) -> str:
    """:func:`async_save`, waited for: returns the committed folder; raises
    :class:`CheckpointError` when any rank failed."""
    return async_save(state_dict, checkpoint_id=checkpoint_id, process_group=process_group, planner=planner,
                      keep_last=keep_last).result()


def wait() -> None:
    """Wait for the save in flight, if any (its error stays in its future)."""
    with _lock:
        previous = _pending
    if previous is not None:
        concurrent.futures.wait([previous])


def load(state_dict: dict, *, checkpoint_id: Union[str, os.PathLike], process_group: Any = None,
         planner: Any = None) -> None:
    """``torch.distributed.checkpoint.load`` (in place, resharding to this run's layout) with
    :class:`QRNNStorageReader`: a damaged or hostile folder raises its one-line
    :class:`CorruptCheckpointError` (or UnsafeCheckpointError) on every rank, nothing loaded."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.api import CheckpointException
    read_metadata_file(os.fspath(checkpoint_id))  # its refusals as they are, on every rank, before DCP starts
    kwargs: dict = {"storage_reader": QRNNStorageReader(checkpoint_id), "process_group": process_group}
    if planner is not None:
        kwargs["planner"] = planner
    try:
        with warnings.catch_warnings():  # one process without torch.distributed is a use, not a mistake
            warnings.filterwarnings("ignore", "torch.distributed is (disabled|unavailable)", UserWarning)
            dcp_load(state_dict, checkpoint_id=checkpoint_id, **kwargs)
    except CheckpointException as error:
        for failure in getattr(error, "failures", {}).values():
            cause = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(cause, (CorruptCheckpointError, OSError)):
                raise cause from None
        raise


def load_all(checkpoint_id: Union[str, os.PathLike]) -> dict:
    """The whole checkpoint in ``checkpoint_id`` as one state dict, read in this process with
    no collectives (every shard joined into full tensors, other values as saved), with
    :func:`load`'s refusals of damaged or hostile folders. For a run that keeps full
    replicas (DDP), inspection, or conversion."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    read_metadata_file(os.fspath(checkpoint_id))
    state: dict = {}
    _load_state_dict(state, storage_reader=QRNNStorageReader(checkpoint_id), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return state


__all__ = ["async_save", "save", "load", "load_all", "wait", "checkpoint_group"]
