"""qrnn-train's memory check in a real process under a real memory cgroup (v1 or v2,
whichever this machine has): a model that cannot fit is refused in one line, never left
for the kernel to OOM-kill with an empty stderr."""

import os
import subprocess
import sys

import torch

from cgroups import memory_cgroup
from qrnn.checkpoint.staging import memory_headroom
from qrnn.train.memory import available_bytes

LIMIT = 600 * 2**20


def _join(procs):
    def join():
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    return join


def test_a_model_larger_than_the_cgroup_is_refused_in_one_line(tmp_path):
    procs, cleanup, version = memory_cgroup(LIMIT)
    try:
        # About 53 million parameters: 840 MB with gradients and Adam's state, in 600 MB.
        run = subprocess.run(
            [sys.executable, "-m", "qrnn.train", "--hidden", "4000", "--layers", "3", "--optimizer", "adam",
             "--max-steps", "1", "--no-progress", "--sample-length", "0", "--precision", "fp32",
             "--checkpoint-dir", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=600, preexec_fn=_join(procs),
            env=dict(os.environ, OMP_NUM_THREADS="1"))
    finally:
        cleanup()
    assert run.returncode == 2, f"{version}: rc {run.returncode}, stderr {run.stderr[-2000:]!r}"
    assert run.stderr.startswith("qrnn-train: error: the model's ") and "available: lower --hidden (4000)" in \
        run.stderr and run.stderr.count("\n") == 1, run.stderr


def test_the_cpu_memory_figure_is_capped_by_this_process_cgroup():
    headroom = memory_headroom()
    free = available_bytes(torch.device("cpu"))
    assert free is not None
    if headroom is not None:
        assert free <= headroom[0]
