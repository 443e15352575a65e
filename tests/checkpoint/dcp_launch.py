"""Starting the ranks of tests/checkpoint/dcp_worker.py as processes (gloo, file:// rendezvous)."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("dcp_worker.py")


def start(scenario: str, world: int, root, scratch, extra_env=None) -> list:
    """The processes of ranks 0..world-1, their output piped."""
    init = Path(scratch) / f"rendezvous-{uuid.uuid4().hex}"
    env = dict(os.environ, OMP_NUM_THREADS="1", **(extra_env or {}))
    return [subprocess.Popen([sys.executable, str(WORKER), scenario, str(rank), str(world), str(init), str(root)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for rank in range(world)]


def run(scenario: str, world: int, root, scratch, timeout: float = 120) -> list:
    """Run the scenario on `world` ranks; fail with the failing rank's output (or on a hang)."""
    procs = start(scenario, world, root, scratch)
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"{scenario} on {world} ranks hung for {timeout} s")
    for rank, (proc, (_, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"{scenario}: rank {rank} of {world} exited {proc.returncode}:\n{err[-4000:]}"
    return [out for out, _ in outputs]
