"""QRNN under torch.distributed's sharding, on two gloo processes on the CPU. The processes
start once for the module and run every scenario; each test checks one scenario's results.

- FSDP2 as users apply it: ``fully_shard`` on each ``QRNNLayer``, then on the root model.
  A few training steps (the recurrent state carried between chunks) end with the
  parameters DDP reaches on the same data per rank.
- Its full state dict through ``qrnn.checkpoint``: saved mid-training, restored into a
  fresh per-layer-sharded model and optimizer; the continued run ends bit-identical to
  one that never stopped.
- DTensor inputs to the ops: sharded on the batch dimension (both ops), on the hidden
  dimension (ForgetMult) or replicated, they give the plain op's outputs and gradients;
  sharded on the time dimension (or the gate blocks), a ValueError that says what to do.

The processes import qrnn before ``torch.distributed.tensor``, so the ops' sharding rules
are registered at their first call given a DTensor; the other import order is checked in
one process (:func:`test_rules_registered_when_dtensor_is_loaded_first`).
"""

import copy
import datetime
import os
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import qrnn
from conftest import run_python
from qrnn.checkpoint import AsyncCheckpointer
from seeds import chosen_seed

try:  # FSDP2's public home and register_sharding: torch >= 2.6 and >= 2.5
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.experimental import register_sharding  # noqa: F401
except ImportError:
    fully_shard = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or fully_shard is None,
                       reason="needs torch.distributed with FSDP2 (fully_shard) and DTensor's register_sharding"),
]

F64 = torch.float64
WORLD = 2
INPUT, HIDDEN, CLASSES = 3, 4, 2
STEPS, CHUNKS, CHUNK, BATCH = 4, 2, 3, 2  # optimizer steps; chunks of CHUNK steps per optimizer step
RESUME_AT = 2
T = B = 5  # DTensor cases: one shape for both layouts, so only batch_first tells them apart
H = 6


class Tagger(nn.Module):
    """The root model: a QRNN and a linear head, the loss computed inside (a fresh scalar)."""

    def __init__(self):
        super().__init__()
        self.rnn = qrnn.QRNN(INPUT, HIDDEN, num_layers=2, window=2, dtype=F64)
        self.head = nn.Linear(HIDDEN, CLASSES, dtype=F64)

    def forward(self, x, state, target):
        out, state = self.rnn(x, state)
        return F.mse_loss(self.head(out), target), state


def shard_per_layer(model: Tagger) -> Tagger:
    """FSDP2's usual recipe: each block (here each QRNNLayer), then the root."""
    for layer in model.rnn.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def batches(seed: int, rank: int) -> list:
    """This rank's data: per optimizer step, CHUNKS (input, target) chunks."""
    generator = torch.Generator().manual_seed(seed + 1 + rank)
    return [[(torch.randn(CHUNK, BATCH, INPUT, generator=generator, dtype=F64),
              torch.randn(CHUNK, BATCH, CLASSES, generator=generator, dtype=F64)) for _ in range(CHUNKS)]
            for _ in range(STEPS)]


def train(model: nn.Module, optimizer, steps: list) -> None:
    for chunks in steps:
        optimizer.zero_grad()
        state = qrnn.QRNNState()
        for x, target in chunks:
            loss, state = model(x, state, target)
            loss.backward()
            state = state.detach()
        optimizer.step()


def full_state(model: nn.Module, optimizer) -> dict:
    """The whole model's and optimizer's state, on rank 0's CPU (other ranks get empty dicts;
    every rank must call it: it gathers)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {"model": get_model_state_dict(model, options=options),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=options)}


# ---- Scenarios (run in each process) ------------------------------------------------------------


def fsdp_against_ddp(rank: int, seed: int, folder: str) -> dict:
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel

    initial = Tagger()
    data = batches(seed, rank)
    sharded = shard_per_layer(copy.deepcopy(initial))
    layer_shards = [(isinstance(p, DTensor) and p.to_local().numel() < p.numel())
                    for layer in sharded.rnn.layers for p in layer.parameters()]
    optimizer = torch.optim.Adam(sharded.parameters(), lr=1e-2)
    train(sharded, optimizer, data)
    replicated = copy.deepcopy(initial)
    ddp = DistributedDataParallel(replicated)
    train(ddp, torch.optim.Adam(ddp.parameters(), lr=1e-2), data)
    return {"layer_shards": layer_shards, "initial": initial.state_dict(), "ddp": replicated.state_dict(),
            "fsdp": full_state(sharded, optimizer)["model"]}


def fsdp_checkpoint_resume(rank: int, seed: int, folder: str) -> dict:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    initial = Tagger()
    data = batches(seed, rank)

    def sharded_run(model):
        model = shard_per_layer(model)
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    model, optimizer = sharded_run(copy.deepcopy(initial))
    train(model, optimizer, data)
    uninterrupted = full_state(model, optimizer)

    model, optimizer = sharded_run(copy.deepcopy(initial))
    train(model, optimizer, data[:RESUME_AT])
    saved = full_state(model, optimizer)
    path = [None]
    if rank == 0:
        with AsyncCheckpointer(os.path.join(folder, "checkpoints")) as checkpointer:
            checkpointer.save(dict(saved, step=RESUME_AT), step=RESUME_AT)
            checkpointer.wait()  # committed: the other rank reads it next
            path = [checkpointer.latest()]
    dist.broadcast_object_list(path, src=0)

    model, optimizer = sharded_run(Tagger())  # fresh weights, fresh optimizer
    state = qrnn.checkpoint.load(path[0])
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, state["model"], options=options)
    set_optimizer_state_dict(model, optimizer, state["optimizer"], options=options)
    train(model, optimizer, data[state["step"]:])
    return {"uninterrupted": uninterrupted, "resumed": full_state(model, optimizer), "step": state["step"],
            "initial": initial.state_dict()}


def _distribute(mesh, t, placement, requires_grad=False):
    from torch.distributed.tensor import distribute_tensor

    return None if t is None else distribute_tensor(t, mesh, [placement]).requires_grad_(requires_grad)


def _outputs_and_grads(fn, inputs: list, cotangents: list) -> list:
    """fn's outputs (full tensors), then the gradients of the given cotangents with respect to
    each input that requires them."""
    from torch.distributed.tensor import DTensor

    outputs = fn(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    if isinstance(outputs[0], DTensor):
        cotangents = [_distribute(outputs[0].device_mesh, c, o.placements[0]) for c, o in zip(cotangents, outputs)]
    leaves = [t for t in inputs if t is not None and t.requires_grad]
    grads = torch.autograd.grad(outputs, leaves, cotangents)
    return [t.full_tensor() if isinstance(t, DTensor) else t for t in (*outputs, *grads)]


def _error_of(fn, *args, **kwargs):
    """(type name, message) of the exception fn raises, None when it returns."""
    try:
        fn(*args, **kwargs)
    except Exception as error:  # the tests check the type and message
        return type(error).__name__, str(error)
    return None


def dtensor_ops(rank: int, seed: int, folder: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    mesh = init_device_mesh("cpu", (WORLD,))
    results = {"forget_mult": {}, "qrnn_gates": {}, "linear_scan": {}, "refused": {}}
    for batch_first in (False, True):
        batch, time = (0, 1) if batch_first else (1, 0)
        layout = "batch_first" if batch_first else "time_major"
        f, x = torch.rand(T, B, H, dtype=F64), torch.randn(T, B, H, dtype=F64)
        h0 = torch.randn(B, H, dtype=F64)
        cotangent = [torch.randn(T, B, H, dtype=F64)]
        for mode, sequence, state in (("batch", Shard(batch), Shard(0)), ("hidden", Shard(2), Shard(1)),
                                      ("replicate", Replicate(), Replicate())):
            def forget_mult(f, x, h0, batch_first=batch_first):
                return qrnn.forget_mult(f, x, h0, batch_first=batch_first)

            got = _outputs_and_grads(forget_mult, [_distribute(mesh, f, sequence, True),
                                                   _distribute(mesh, x, sequence, True),
                                                   _distribute(mesh, h0, state, True)], cotangent)
            want = _outputs_and_grads(forget_mult, [t.clone().requires_grad_() for t in (f, x, h0)], cotangent)
            results["forget_mult"][f"{layout}-{mode}"] = (got, want)

            def linear_scan(a, b, h0, batch_first=batch_first):
                return qrnn.linear_scan(a, b, h0, reverse=True, batch_first=batch_first)

            got = _outputs_and_grads(linear_scan, [_distribute(mesh, f, sequence, True),
                                                   _distribute(mesh, x, sequence, True),
                                                   _distribute(mesh, h0, state, True)], cotangent)
            want = _outputs_and_grads(linear_scan, [t.clone().requires_grad_() for t in (f, x, h0)], cotangent)
            results["linear_scan"][f"{layout}-{mode}"] = (got, want)

        lengths = torch.randint(0, T + 1, (B,))
        for output_gate in (True, False):
            gates = torch.randn(T, B, (3 if output_gate else 2) * H, dtype=F64)
            mask = torch.rand(T, B, H, dtype=F64).round()
            cotangents = [torch.randn(T, B, H, dtype=F64), torch.randn(B, H, dtype=F64)]
            for mode, sequence, state in (("batch", Shard(batch), Shard(0)), ("replicate", Replicate(), Replicate())):
                def qrnn_gates(gates, c0, mask, lengths, output_gate=output_gate, batch_first=batch_first):
                    return qrnn.qrnn_gates(gates, c0, output_gate=output_gate, forget_mask=mask, forget_scale=0.9,
                                           lengths=lengths, batch_first=batch_first, reverse=not output_gate)

                got = _outputs_and_grads(qrnn_gates, [_distribute(mesh, gates, sequence, True),
                                                      _distribute(mesh, h0, state, True),
                                                      _distribute(mesh, mask, sequence),
                                                      _distribute(mesh, lengths, state)], cotangents)
                want = _outputs_and_grads(qrnn_gates, [gates.clone().requires_grad_(), h0.clone().requires_grad_(),
                                                       mask, lengths], cotangents)
                results["qrnn_gates"][f"{layout}-{mode}-{'fo' if output_gate else 'f'}"] = (got, want)

        gates = torch.randn(T, B, 3 * H, dtype=F64)
        refusals = {
            "forget_mult": (qrnn.forget_mult, _distribute(mesh, f, Shard(time)), _distribute(mesh, x, Shard(time))),
            "linear_scan": (qrnn.linear_scan, _distribute(mesh, f, Shard(time)), _distribute(mesh, x, Shard(time))),
            "qrnn_gates": (qrnn.qrnn_gates, _distribute(mesh, gates, Shard(time))),
            "qrnn_gates_blocks": (qrnn.qrnn_gates, _distribute(mesh, gates, Shard(2))),
        }
        for name, (op, *args) in refusals.items():
            results["refused"][f"{layout}-{name}"] = _error_of(op, *args, batch_first=batch_first)

    # The op called directly, first batch-sharded batch-first, then with the same placements
    # and shape time-major (time-sharded): the rules must not answer the second from the first.
    f = _distribute(mesh, torch.rand(T, B, H, dtype=F64), Shard(0))
    x = _distribute(mesh, torch.randn(T, B, H, dtype=F64), Shard(0))
    torch.ops.qrnn.forget_mult(f, x, None, True)
    # DTensor reports the rule's ValueError as a RuntimeError
    results["refused"]["direct-op-after-batch-first"] = _error_of(torch.ops.qrnn.forget_mult, f, x, None, False)
    return results


SCENARIOS = {"fsdp_against_ddp": fsdp_against_ddp, "fsdp_checkpoint_resume": fsdp_checkpoint_resume,
             "dtensor_ops": dtensor_ops}


def worker(rank: int, store: str, folder: str, seed: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=120))  # a rank left behind fails, never hangs
    results = {}
    try:
        for name, scenario in SCENARIOS.items():
            torch.manual_seed(seed)  # the same weights on every rank
            try:
                results[name] = scenario(rank, seed, folder)
            except Exception:
                results[name] = {"error": traceback.format_exc()}
            dist.barrier()
    finally:
        torch.save(results, os.path.join(folder, f"rank{rank}.pt"))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """{scenario: rank 0's results}, with the seed the processes drew their inputs from."""
    folder = tmp_path_factory.mktemp("sharded")
    seed = chosen_seed(request.config)
    seed = int.from_bytes(os.urandom(4), "little") >> 1 if seed is None else seed
    mp.start_processes(worker, args=(str(folder / "store"), str(folder), seed), nprocs=WORLD, start_method="spawn")
    results = [torch.load(folder / f"rank{rank}.pt", weights_only=True) for rank in range(WORLD)]
    return {name: dict(results[0][name], seed=seed, other_rank=results[1][name]) for name in SCENARIOS}


def scenario(runs, name: str) -> dict:
    result = runs[name]
    for rank_result in (result, result["other_rank"]):
        assert "error" not in rank_result, f"seed {result['seed']} (--seed to rerun):\n{rank_result['error']}"
    return result


def assert_same_state(a: dict, b: dict, exact: bool, what: str) -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        if isinstance(a[key], dict):
            assert_same_state(a[key], b[key], exact, f"{what}.{key}")
        elif isinstance(a[key], torch.Tensor):
            if exact:
                assert torch.equal(a[key], b[key]), f"{what}.{key} differs"
            else:
                torch.testing.assert_close(a[key], b[key], atol=1e-12, rtol=1e-12, msg=f"{what}.{key}")
        elif isinstance(a[key], list):
            assert len(a[key]) == len(b[key]), f"{what}.{key}"
            for i, (x, y) in enumerate(zip(a[key], b[key])):
                assert_same_state({i: x}, {i: y}, exact, f"{what}.{key}")
        else:
            assert a[key] == b[key], f"{what}.{key}"


def moved(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_fsdp2_per_layer_reaches_the_parameters_of_ddp(runs):
    result = scenario(runs, "fsdp_against_ddp")
    assert result["layer_shards"] and all(result["layer_shards"]), "fully_shard did not shard every layer"
    assert_same_state(result["fsdp"], result["ddp"], exact=False, what="fsdp vs ddp")
    assert moved(result["ddp"], result["initial"]) > 1e-3  # training moved them much further than the tolerance


def test_fsdp2_full_state_dict_checkpoint_resumes_bit_identically(runs):
    result = scenario(runs, "fsdp_checkpoint_resume")
    assert result["step"] == RESUME_AT
    assert_same_state(result["resumed"], result["uninterrupted"], exact=True, what="resumed vs uninterrupted")
    assert moved(result["uninterrupted"]["model"], result["initial"]) > 1e-3


@pytest.mark.parametrize("op", ["forget_mult", "linear_scan"])
def test_dtensor_scan_matches_the_plain_op(runs, op):
    cases = scenario(runs, "dtensor_ops")[op]
    assert len(cases) == 6
    for name, (got, want) in cases.items():
        torch.testing.assert_close(got, want, msg=lambda m, name=name: f"{name}: {m}")


def test_dtensor_qrnn_gates_matches_the_plain_op(runs):
    cases = scenario(runs, "dtensor_ops")["qrnn_gates"]
    assert len(cases) == 8
    for name, (got, want) in cases.items():
        torch.testing.assert_close(got, want, msg=lambda m, name=name: f"{name}: {m}")


def test_time_sharded_inputs_are_refused(runs):
    refused = scenario(runs, "dtensor_ops")["refused"]
    for layout, time in (("time_major", 0), ("batch_first", 1)):
        for op in ("forget_mult", "linear_scan", "qrnn_gates"):
            kind, message = refused[f"{layout}-{op}"]
            assert kind == "ValueError"
            assert message.startswith(f"qrnn.{op}: ") and f"sharded on its time dimension (dim {time})" in message
            assert "Replicate()" in message and f"batch dimension (dim {1 - time})" in message
            assert ("hidden one (dim 2)" in message) == (op != "qrnn_gates")
        kind, message = refused[f"{layout}-qrnn_gates_blocks"]
        assert kind == "ValueError" and "Z, F, O blocks" in message and "Replicate()" in message
    kind, message = refused["direct-op-after-batch-first"]
    assert "sharded on its time dimension (dim 0)" in message


def test_rules_registered_when_dtensor_is_loaded_first(tmp_path):
    """DTensor loaded before qrnn: the rules are registered when qrnn's ops are imported, so
    calling the op directly (no qrnn.forget_mult call first) runs on the shards."""
    proc = run_python(f"""
        import torch, torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor
        import qrnn

        dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0, world_size=1)
        mesh = init_device_mesh("cpu", (1,))
        f, x = torch.rand(4, 3, 5), torch.randn(4, 3, 5)
        h = torch.ops.qrnn.forget_mult(distribute_tensor(f, mesh, [Shard(1)]), distribute_tensor(x, mesh, [Shard(1)]),
                                       None, False)
        assert h.placements == (Shard(1),), h.placements
        torch.testing.assert_close(h.full_tensor(), qrnn.forget_mult(f, x))
        dist.destroy_process_group()
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
