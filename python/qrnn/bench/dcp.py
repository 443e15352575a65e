"""Sharded checkpoints on 2 gloo ranks (processes on this machine): qrnn.checkpoint.dcp side
by side with torch.distributed.checkpoint's FileSystemWriter (synchronous save) and its
async_save (thread mode, default stager), the same sharded state saved by each in
interleaved rounds:

- blocked: how long the call keeps the training loop from its next step;
- to commit: from the call to a committed checkpoint (``.metadata`` renamed);
- extra memory: the peak resident memory a save adds on a rank (VmHWM, reset before each
  save), as a share of the rank's shard.

Each rank runs ``python -m qrnn.bench.dcp RANK WORLD INIT FOLDER MIB ROUNDS OUT``; figures
are rank 0's medians (memory: the larger of the two ranks' peaks)."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

from .checkpoint import _rss_bytes
from .common import Result

AREA = "dcp"
WORLD = 2
TENSORS = 8  # the rank's shard in this many tensors (layers)
METHODS = ("dcp_sync", "dcp_async", "qrnn_async", "qrnn_sync")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM
        return True
    except OSError:
        return False


def _rank(rank: int, world: int, init: str, folder: str, mib: float, rounds: int, out: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from qrnn.checkpoint import dcp as qdcp
    try:
        from torch.distributed.tensor import DTensor, Shard, init_device_mesh
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import DTensor, Shard
        from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (world,))
    per_tensor = int(mib * (1 << 20)) // world // TENSORS // 4
    shards = [torch.randn(per_tensor) for _ in range(TENSORS)]
    state: dict = {f"layer{i}.weight": DTensor.from_local(s, mesh, [Shard(0)], run_check=False)
                   for i, s in enumerate(shards)}
    state["step"] = 0
    shard_bytes = sum(s.numel() * s.element_size() for s in shards)
    samples: dict = {f"{m}_{k}": [] for m in METHODS for k in ("block", "total", "extra")}

    def save(method: str, path: str):
        if method == "dcp_sync":
            dcp.save(state, checkpoint_id=path)
            return None
        if method == "dcp_async":
            response = dcp.async_save(state, checkpoint_id=path)
            return response.upload_completion if hasattr(response, "upload_completion") else response
        if method == "qrnn_async":
            return qdcp.async_save(state, checkpoint_id=path)
        qdcp.save(state, checkpoint_id=path)
        return None

    can_peak = True
    for r in range(rounds + 1):  # round 0 warms every path (allocations, plan caches) and is not counted
        for method in METHODS:
            path = os.path.join(folder, f"{method}-{r}")
            dist.barrier()
            resident = _rss_bytes("VmRSS")
            can_peak = _reset_peak() and can_peak
            start = time.perf_counter()
            pending = save(method, path)
            returned = time.perf_counter()
            for s in shards:  # the next training step changes the parameters
                s.add_(1.0)
            if pending is not None:
                pending.result()
            finished = time.perf_counter()
            extra = _rss_bytes("VmHWM") - resident if can_peak else float("nan")
            if r > 0:
                samples[f"{method}_block"].append(returned - start)
                samples[f"{method}_total"].append(finished - start)
            if method.startswith("qrnn") or r > 0:  # ours: the first save allocates its staging image
                samples[f"{method}_extra"].append(extra)
            dist.barrier()
            if rank == 0:
                shutil.rmtree(path, ignore_errors=True)
    figures = {k: (statistics.median(v) if not k.endswith("extra") else max(v)) for k, v in samples.items() if v}
    figures["shard_bytes"] = shard_bytes
    with open(out, "w") as f:
        json.dump(figures, f)
    dist.barrier()
    dist.destroy_process_group()


def measure(mib: float, rounds: int, folder: str) -> list:
    """Both ranks' figures (dicts), from processes of their own."""
    init = os.path.join(folder, "rendezvous")
    outs = [os.path.join(folder, f"rank{r}.json") for r in range(WORLD)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "qrnn.bench.dcp", str(r), str(WORLD), init, folder, str(mib),
                               str(rounds), outs[r]], env=env, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    errors = [p.communicate(timeout=3600)[1] for p in procs]
    for r, (p, err) in enumerate(zip(procs, errors)):
        if p.returncode != 0:
            raise RuntimeError(f"dcp benchmark rank {r} failed:\n{err[-3000:]}")
    figures = []
    for out in outs:
        with open(out) as f:
            figures.append(json.load(f))
    return figures


def run(quick: bool = False) -> list:
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        return []
    mib = 16 if quick else 512  # the whole state; each rank holds half
    rounds = 1 if quick else 5
    folder = tempfile.mkdtemp(prefix="qrnn-bench-dcp-", dir=os.environ.get("QRNN_BENCH_DIR"))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ranks = measure(mib, rounds, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    f = ranks[0]
    shard = f["shard_bytes"]
    size = f"{mib:g} MiB state, {shard / 2**20:.0f} MiB per rank, {WORLD} ranks"
    ms = lambda s: f"{s * 1e3:.0f} ms"  # noqa: E731
    results = []
    ratio = f["qrnn_async_block"] / f["dcp_async_block"]
    results.append(Result(AREA, f"blocked per save, qrnn dcp.async_save vs DCP async_save ({size})", ratio, "x",
                          "<= 0.5x", ratio <= 0.5,
                          f"{ms(f['qrnn_async_block'])} vs {ms(f['dcp_async_block'])}; DCP sync save blocks "
                          f"{ms(f['dcp_sync_block'])}",
                          series={"qrnn (ms)": 1e3 * f["qrnn_async_block"],
                                  "DCP async (ms)": 1e3 * f["dcp_async_block"]}))
    ratio = f["qrnn_async_total"] / f["dcp_sync_total"]
    results.append(Result(AREA, f"to committed checkpoint, qrnn dcp.async_save vs DCP save ({size})", ratio, "x",
                          "<= 1.0x", ratio <= 1.0,
                          f"{ms(f['qrnn_async_total'])} vs {ms(f['dcp_sync_total'])}; qrnn dcp.save "
                          f"{ms(f['qrnn_sync_total'])}; DCP async_save {ms(f['dcp_async_total'])}"))
    extra = {m: max(r[f"{m}_extra"] for r in ranks) / shard for m in METHODS}
    results.append(Result(AREA, f"extra host memory during a save, qrnn dcp.async_save, share of the shard ({size})",
                          extra["qrnn_async"], "x", "<= 1.0x", extra["qrnn_async"] <= 1.0,
                          f"peak over resident, first save included (it allocates the reused staging image); "
                          f"DCP async_save {extra['dcp_async']:.2f}x, DCP save {extra['dcp_sync']:.2f}x, "
                          f"qrnn dcp.save {extra['qrnn_sync']:.2f}x"))
    return results


if __name__ == "__main__":
    _rank(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6]),
          sys.argv[7])
