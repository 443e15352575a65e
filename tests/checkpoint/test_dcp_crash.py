"""kill -9 of a rank while two gloo ranks save sharded checkpoints back to back with
qrnn.checkpoint.dcp.async_save: whatever the moment, ``latest()`` names a step folder that
loads, and every committed step folder loads bit-identically to the values of its step.

Each kill point costs a start of two processes (a few seconds), so CI runs
QRNN_DCP_KILL_POINTS (default 3) random points; the benchmark area ``dcp`` (and
``QRNN_DCP_KILL_POINTS=20`` here) runs the 20 of the issue's target.
"""

import os
import random
import signal
import time

import dcp_launch
import pytest
import torch
import torch.distributed as dist

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                       reason="needs torch.distributed (gloo)"),
]

KILL_POINTS = int(os.environ.get("QRNN_DCP_KILL_POINTS", "3"))


def check_committed(root) -> int:
    """Every committed step folder loads exactly its step's values; returns how many."""
    from dcp_worker import CRASH_NUMEL, crash_values

    from qrnn.checkpoint import dcp as qdcp
    committed = qdcp.checkpoints(root)
    assert committed and qdcp.latest(root) == committed[-1]
    for folder in committed:
        step = int(os.path.basename(folder).split("-")[1])
        loaded = {"w": torch.empty(CRASH_NUMEL, dtype=torch.float64), "step": -1}
        qdcp.load(loaded, checkpoint_id=folder)
        assert loaded["step"] == step, folder
        assert torch.equal(loaded["w"], crash_values(step)), f"{folder} does not hold step {step}'s values"
    return len(committed)


def kill_during_saves(root, scratch, rng: random.Random) -> str:
    from qrnn.checkpoint import dcp as qdcp
    procs = dcp_launch.start("crash", 2, root, scratch)
    try:
        deadline = time.monotonic() + 120
        while qdcp.latest(root) is None:  # at least one committed step, then any moment
            assert all(p.poll() is None for p in procs), [p.communicate()[1][-3000:] for p in procs]
            assert time.monotonic() < deadline, "no step was committed in 120 s"
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.4))
        victim = rng.randrange(2)
        procs[victim].send_signal(signal.SIGKILL)
        time.sleep(rng.uniform(0, 0.05))  # the other rank runs on into a collective, or not
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    return f"rank {victim}"


@pytest.mark.skipif(KILL_POINTS < 1, reason="QRNN_DCP_KILL_POINTS=0")
def test_kill_9_of_a_rank_at_random_points_leaves_loadable_checkpoints(tmp_path):
    rng = random.Random(random.getrandbits(32))  # replayable: the test seed seeds `random`
    for point in range(KILL_POINTS):
        root = tmp_path / f"run-{point}"
        who = kill_during_saves(root, tmp_path, rng)
        assert check_committed(root) >= 1, who
        # No leftovers of the dead saves are taken for checkpoints, and a new run into the
        # same folder commits over them.
        from qrnn.checkpoint import dcp as qdcp
        latest = qdcp.latest(root)
        assert latest is not None and os.path.isfile(os.path.join(latest, ".metadata"))


def test_a_rank_whose_write_fails_fails_the_save_on_every_rank_and_commits_nothing(tmp_path):
    """The coordinator commits .metadata only after every rank's file is committed: when the
    last rank's disk is full, or rank 0 fails before writing, every rank's save raises
    (naming the cause), nothing hangs, and ``latest()`` stays at the previous step."""
    from qrnn.checkpoint import dcp as qdcp
    outputs = dcp_launch.run("fail", 2, tmp_path / "ckpt", tmp_path, timeout=120)
    for out in outputs:
        assert "refused:" in out and "rank 1" in out and "No space left on device" in out, out
        assert "refused 3:" in out and "injected write_data failure" in out, out
    assert qdcp.latest(tmp_path / "ckpt") == str(tmp_path / "ckpt" / "step-000000000001")
    for step in (2, 3):
        assert not os.path.exists(tmp_path / "ckpt" / f"step-00000000000{step}" / ".metadata")
    check_committed(tmp_path / "ckpt")
