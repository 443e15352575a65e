"""One rank of the sharded-checkpoint tests (tests/checkpoint/test_dcp_*.py), started as a
process of its own: ``python dcp_worker.py SCENARIO RANK WORLD INIT_FILE ROOT``.

Scenarios:
- ``train``: a small model under FSDP2 trains STEPS steps on a global batch split across
  the ranks; after RESUME_AT steps it saves the model and Adam state with
  ``qrnn.checkpoint.dcp.async_save`` and takes the next optimizer step right after the call
  (the checkpoint must hold the values at the call); it also saves the same state with DCP's
  own FileSystemWriter. Rank 0 writes the final full parameters to ROOT/final-W.pt.
- ``resume``: the same model on WORLD ranks loads the latest step folder (resharding from
  the world that saved it), trains to STEPS, writes ROOT/resumed-W-<folder>.pt.
- ``crash``: saves step after step (a DTensor whose values say the step, and the step as a
  byte item) until killed; prints each step it started.
- ``fail``: commits step 1, then the last rank's disk fails during step 2, then rank 0
  fails before writing at step 3; prints whether each save was refused.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from qrnn.checkpoint import dcp as qdcp

STEPS, RESUME_AT, BATCH = 6, 3, 4
CRASH_NUMEL = 1 << 17  # float64 elements of the crash test's tensor (1 MiB)


def crash_values(step: int) -> torch.Tensor:
    return torch.arange(CRASH_NUMEL, dtype=torch.float64) + step * 1e6


def model_and_optimizer():
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8, dtype=torch.float64), nn.Tanh(), nn.Linear(8, 3, dtype=torch.float64))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=0.05)


def train_step(model, optimizer, step: int, rank: int, world: int) -> None:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 4, generator=generator, dtype=torch.float64)
    y = torch.randn(BATCH, 3, generator=generator, dtype=torch.float64)
    per = BATCH // world
    mine = slice(rank * per, (rank + 1) * per)
    optimizer.zero_grad()
    F.mse_loss(model(x[mine]), y[mine]).backward()
    optimizer.step()


def state(model, optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def full_parameters(model) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def train(rank: int, world: int, root: str) -> None:
    import torch.distributed.checkpoint as dcp
    model, optimizer = model_and_optimizer()
    future = None
    for step in range(1, STEPS + 1):
        train_step(model, optimizer, step, rank, world)
        if step == RESUME_AT:
            saved = state(model, optimizer)
            dcp.save(saved, checkpoint_id=os.path.join(root, "dcp-own"))  # DCP's FileSystemWriter
            future = qdcp.async_save(saved, checkpoint_id=qdcp.step_folder(root, step), keep_last=2)
    assert future is not None
    future.result(timeout=60)
    final = full_parameters(model)
    if rank == 0:
        torch.save(final, os.path.join(root, f"final-{world}.pt"))


def resume(rank: int, world: int, root: str, folder: str) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict
    model, optimizer = model_and_optimizer()
    loaded = state(model, optimizer)
    qdcp.load(loaded, checkpoint_id=folder)
    set_state_dict(model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    for step in range(RESUME_AT + 1, STEPS + 1):
        train_step(model, optimizer, step, rank, world)
    final = full_parameters(model)
    if rank == 0:
        torch.save(final, os.path.join(root, f"resumed-{world}-{os.path.basename(folder)}.pt"))


_mesh = []


def crash_state(step: int, rank: int, world: int) -> dict:
    """This rank's shard of step's values, and the step as a byte item."""
    try:
        from torch.distributed.tensor import DTensor, Shard, init_device_mesh
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import DTensor, Shard
        from torch.distributed.device_mesh import init_device_mesh
    if not _mesh:
        _mesh.append(init_device_mesh("cpu", (world,)))
    mesh = _mesh[0]
    local = crash_values(step).chunk(world)[rank].clone()
    return {"w": DTensor.from_local(local, mesh, [Shard(0)], run_check=False), "step": step}


def crash(rank: int, world: int, root: str) -> None:
    step = 0
    while True:
        step += 1
        print(f"start {step}", flush=True)
        qdcp.async_save(crash_state(step, rank, world), checkpoint_id=qdcp.step_folder(root, step), keep_last=3)


def fail(rank: int, world: int, root: str) -> None:
    """Step 1 commits; at step 2 the last rank's disk fails (ENOSPC): every rank's save must
    raise, naming that rank, and step 2 must stay uncommitted."""
    import errno

    from qrnn import _C
    from qrnn.checkpoint import CheckpointError
    from qrnn.checkpoint.dcp import storage
    qdcp.save(crash_state(1, rank, world), checkpoint_id=qdcp.step_folder(root, 1))
    if rank == world - 1:
        storage._writer = _C._testing.checkpoint_writer_with_faults(fail_after_bytes=0, fail_errno=errno.ENOSPC)
    try:
        qdcp.save(crash_state(2, rank, world), checkpoint_id=qdcp.step_folder(root, 2))
    except CheckpointError as error:
        print(f"refused: {error}", flush=True)
    else:
        print("saved", flush=True)
    # Step 3: rank 0 fails before its file is even queued; the others learn it in the commit.
    storage._writer = None
    if rank == 0:
        def failing(self, plan, planner):
            raise RuntimeError("injected write_data failure")
        storage.QRNNStorageWriter.write_data = failing  # type: ignore[method-assign]
    try:
        qdcp.save(crash_state(3, rank, world), checkpoint_id=qdcp.step_folder(root, 3))
    except (CheckpointError, RuntimeError) as error:
        print(f"refused 3: {error}", flush=True)
    else:
        print("saved 3", flush=True)


def main() -> None:
    scenario, rank, world, init_file, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        if scenario == "train":
            train(rank, world, root)
        elif scenario == "resume":
            resume(rank, world, root, qdcp.latest(root))
        elif scenario == "crash":
            crash(rank, world, root)
        elif scenario == "fail":
            fail(rank, world, root)
        else:
            raise SystemExit(f"unknown scenario {scenario}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
