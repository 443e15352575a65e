"""qrnn-train on many processes (torchrun, gloo on the CPU) against one process.

--batch-size is the global batch: with N processes each rank trains on its own contiguous
1/N of the batch columns and DDP averages the gradients, so N processes take the same
optimizer steps as one process given the whole batch. Checked here to float tolerance
(dropout off, so that no per-rank random masks enter), together with: only rank 0 writes
files, and --resume on a different number of processes (2 -> 1 at an epoch boundary,
1 -> 2 in the middle of an epoch, where the carried states are re-cut) continues the same
run as if it had never stopped.
"""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

from qrnn.checkpoint import load
from qrnn.train import main as train_main
from qrnn.train.data import default_text
from qrnn.train.state import regroup_carry

pytestmark = pytest.mark.slow

# About 29 steps per epoch: 1,826 training characters as 8 columns of 228, chunks of 8.
ARGS = ["--layers", "2", "--hidden", "32", "--emsize", "16", "--batch-size", "8", "--bptt", "8",
        "--dropout", "0", "--warmup", "5", "--lr", "3e-3", "--precision", "fp32", "--no-progress",
        "--sample-length", "0", "--keep-last", "10"]
TOLERANCE = 1e-5  # float32 parameters after up to 2 * 29 Adam steps, gradients summed in another order

# Runs qrnn-train and records, per rank, every call that writes into the run folder.
LAUNCHER = textwrap.dedent("""
    import os, sys
    import qrnn.checkpoint, qrnn.train.cli

    def recorded(owner, name):
        original = getattr(owner, name)
        def call(*args, **kwargs):
            with open(os.path.join(os.environ["WRITE_LOG"], "rank" + os.environ.get("RANK", "0")), "a") as fh:
                fh.write(name + "\\n")
            return original(*args, **kwargs)
        setattr(owner, name, call)

    recorded(qrnn.checkpoint.AsyncCheckpointer, "__init__")
    recorded(qrnn.checkpoint.AsyncCheckpointer, "save")
    recorded(qrnn.train.cli, "write_metrics")
    recorded(qrnn.train.cli, "plot_losses")
    sys.exit(qrnn.train.cli.main(sys.argv[1:]))
""")


def run_launch(command, env, folder, timeout):
    """(exit code or None on timeout, stdout, stderr) of a torchrun launch. Its output goes
    to files, so that a rank left behind cannot hold the test on an open pipe; on timeout
    every process of the launch (marked by an environment variable: torchrun starts its
    workers in sessions of their own) is killed."""
    folder.mkdir()
    marker = uuid.uuid4().hex
    env = dict(env, QRNN_TEST_LAUNCH=marker)
    with open(folder / "stdout", "w") as out, open(folder / "stderr", "w") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            _kill_marked(f"QRNN_TEST_LAUNCH={marker}".encode())
            process.kill()
            process.wait()
    return code, (folder / "stdout").read_text(), (folder / "stderr").read_text()


def _kill_marked(entry: bytes) -> None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if entry in fh.read().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def _checkpoints(run_dir):
    """{step: path} of the run's step checkpoints."""
    found = {}
    for name in os.listdir(run_dir):
        if name.startswith("ckpt-") and name.endswith(".pt"):
            found[int(name[5:-3])] = os.path.join(run_dir, name)
    return found


def _max_difference(a, b):
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run the tests compare (two torchrun launches, the rest in this process)."""
    root = tmp_path_factory.mktemp("ddp")
    data = root / "text.txt"
    data.write_text(default_text()[:2_000], encoding="utf-8")
    launcher = root / "launch.py"
    launcher.write_text(LAUNCHER)
    base = ["--data", str(data)] + ARGS
    dirs = {name: str(root / name) for name in ("one", "two", "two_then_one", "one_then_two")}
    logs = {name: root / f"writes-{name}" for name in ("two", "one_then_two")}
    outputs = {}

    def torchrun(name, argv):
        logs[name].mkdir()
        env = dict(os.environ, OMP_NUM_THREADS="1", WRITE_LOG=str(logs[name]))
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   str(launcher)] + argv
        code, stdout, stderr = run_launch(command, env, root / f"output-{name}", timeout=300)
        assert code == 0, (code, stdout[-2000:], stderr[-3000:])
        assert "ranks in sync: 2 processes" in stdout
        outputs[name] = stdout

    # One process, two epochs: the reference.
    assert train_main(base + ["--epochs", "2", "--checkpoint-dir", dirs["one"]]) == 0
    # Two processes, one epoch; a copy of that run continues on one process (2 -> 1 at the
    # epoch boundary).
    torchrun("two", base + ["--epochs", "1", "--checkpoint-dir", dirs["two"]])
    shutil.copytree(dirs["two"], dirs["two_then_one"])
    assert train_main(base + ["--epochs", "2", "--resume", "--checkpoint-dir", dirs["two_then_one"]]) == 0
    # One process stops mid-epoch; two processes continue (1 -> 2, carried states re-cut).
    assert train_main(base + ["--epochs", "2", "--max-steps", "10", "--checkpoint-dir", dirs["one_then_two"]]) == 0
    torchrun("one_then_two", base + ["--epochs", "2", "--resume", "--checkpoint-dir", dirs["one_then_two"]])
    epoch_steps = min(_checkpoints(dirs["one"]))  # the first checkpoint: end of epoch 1
    assert sorted(_checkpoints(dirs["one"])) == [epoch_steps, 2 * epoch_steps]
    return dict(dirs=dirs, logs=logs, outputs=outputs, epoch_steps=epoch_steps)


def test_two_processes_reach_the_parameters_of_one(runs):
    """After one epoch (29 steps), 2 processes with global batch 8 == 1 process with batch 8."""
    steps = runs["epoch_steps"]
    one_go = _checkpoints(runs["dirs"]["one"])
    one = load(one_go[steps])
    two = load(_checkpoints(runs["dirs"]["two"])[steps])
    assert one["progress"]["step"] == two["progress"]["step"] == steps
    assert two["progress"]["world"] == 2 and len(two["rng"]) == 2
    difference = _max_difference(one["model"], two["model"])
    print(f"max |parameter difference|, 1 vs 2 processes after {steps} steps: {difference:.3g}")
    assert difference < TOLERANCE
    # Training moves the parameters much further than that.
    later = load(one_go[2 * steps])
    assert _max_difference(one["model"], later["model"]) > 100 * TOLERANCE
    # The reported losses agree too (means over the global batch).
    for key in ("train_loss", "valid_loss"):
        assert one["history"][0][key] == pytest.approx(two["history"][0][key], rel=1e-4), key


def test_only_rank_0_writes(runs):
    steps = runs["epoch_steps"]
    for name, epochs in (("two", 1), ("one_then_two", 2)):
        log = runs["logs"][name]
        assert sorted(os.listdir(log)) == ["rank0"], name
        calls = (log / "rank0").read_text().split()
        assert calls.count("save") == epochs and calls.count("write_metrics") == epochs, (name, calls)
    # And the run folder holds what one process would have written.
    names = sorted(os.listdir(runs["dirs"]["two"]))
    assert names == ["best.pt", f"ckpt-{steps:012d}.pt", "loss.png", "metrics.jsonl"]


@pytest.mark.parametrize("name, note", [("two_then_one", "2 -> 1 processes at the epoch boundary"),
                                        ("one_then_two", "1 -> 2 processes at step 10, mid-epoch")])
def test_resume_on_another_number_of_processes(runs, name, note):
    steps = runs["epoch_steps"]
    reference = load(_checkpoints(runs["dirs"]["one"])[2 * steps])
    resumed_steps = _checkpoints(runs["dirs"][name])
    resumed = load(resumed_steps[2 * steps])
    assert resumed["progress"]["step"] == 2 * steps and resumed["progress"]["epoch"] == 2
    assert resumed["progress"]["world"] == (1 if name == "two_then_one" else 2)
    difference = _max_difference(reference["model"], resumed["model"])
    print(f"max |parameter difference| after {2 * steps} steps, {note}: {difference:.3g}")
    assert difference < TOLERANCE
    complete = [r for r in resumed["history"] if r["complete"]]
    for key in ("step", "lr"):
        assert [r[key] for r in complete] == [r[key] for r in reference["history"]], key
    if name == "one_then_two":
        assert "resuming" in runs["outputs"][name]


def test_mid_epoch_carry_is_recut_in_rank_order():
    """The carried states of 2 ranks re-cut for 1 and back: rank r holds the r-th slice."""
    batch, hidden = 4, 3
    whole = [(torch.randn(1, batch, hidden), torch.randn(1, batch, 2)), (torch.randn(1, batch, hidden), None)]
    per_rank = regroup_carry([whole], 2, batch_dim=1)
    assert torch.equal(per_rank[1][0][0], whole[0][0][:, 2:]) and per_rank[1][1][1] is None
    joined = regroup_carry(per_rank, 1, batch_dim=1)[0]
    for (c, tail), (c_ref, tail_ref) in zip(joined, whole):
        assert torch.equal(c, c_ref)
        assert (tail is None and tail_ref is None) or torch.equal(tail, tail_ref)
    assert regroup_carry([None, None], 1, batch_dim=1) == [None]
