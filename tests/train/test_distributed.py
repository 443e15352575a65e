"""qrnn-train on many processes (torchrun, gloo on the CPU) against one process.

--batch-size is the global batch: with N processes each rank trains on its own contiguous
1/N of the batch columns and DDP averages the gradients, so N processes take the same
optimizer steps as one process given the whole batch. Checked here to float tolerance
(dropout off, so that no per-rank random masks enter), together with: only rank 0 writes
files, and --resume on a different number of processes (2 -> 1 at an epoch boundary,
1 -> 2 in the middle of an epoch, where the carried states are re-cut) continues the same
run as if it had never stopped. Faults (tests/train/fault_launcher.py): a torchrun restart
after a rank dies and a two-node run (--resume auto) end bit-identical to the uninterrupted
run; a hung rank fails the job in bounded time with one line naming it; ranks whose clocks
disagree still stop at the same step.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

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
    import qrnn.checkpoint, qrnn.train.cache, qrnn.train.cli, qrnn.train.report

    def recorded(owner, name):
        original = getattr(owner, name)
        def call(*args, **kwargs):
            with open(os.path.join(os.environ["WRITE_LOG"], "rank" + os.environ.get("RANK", "0")), "a") as fh:
                fh.write(name + "\\n")
            return original(*args, **kwargs)
        setattr(owner, name, call)

    recorded(qrnn.checkpoint.AsyncCheckpointer, "__init__")
    recorded(qrnn.checkpoint.AsyncCheckpointer, "save")
    recorded(qrnn.train.report, "write_metrics")
    recorded(qrnn.train.report, "plot_losses")
    recorded(qrnn.train.cache, "_build")  # tokenizing the corpus into its cache
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
    return dict(dirs=dirs, logs=logs, outputs=outputs, epoch_steps=epoch_steps, base=base, root=root)


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


# ---------------------------------------------------------------- faults

FAULT_LAUNCHER = str(Path(__file__).with_name("fault_launcher.py"))
RECOVERY = ["--save-every", "5", "--resume", "auto"]  # one command line for starts and restarts


def _fault_env(folder, fault, **extra):
    (folder / "exit").mkdir(parents=True)
    return dict(os.environ, OMP_NUM_THREADS="1", FAULT=fault, FAULT_ONCE=str(folder / "fault-fired"),
                EXIT_LOG=str(folder / "exit"), **extra)


def _torchrun(*options):
    return [sys.executable, "-m", "torch.distributed.run", *options, "--monitor-interval", "0.2"]


def _worker_stderr(log_dir):
    """{(attempt, local rank): stderr} of a torchrun launched with --log-dir and --redirects 3."""
    return {(path.parent.parent.name, path.parent.name): path.read_text()
            for path in Path(log_dir).glob("*/attempt_*/*/stderr.log")}


def _qrnn_lines(text):
    return [line for line in text.splitlines() if line.startswith("qrnn-train:")]


def _assert_same_model(a, b):
    assert a["progress"]["step"] == b["progress"]["step"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_torchrun_restart_after_a_rank_dies_resumes_bit_identical(runs):
    """--max-restarts=1 --resume auto: rank 1 is SIGKILLed at step 17; rank 0 reports it on one
    line; the restarted workers resume from step 15 and end bit-identical to the uninterrupted
    2-process run. --resume auto continues a folder that holds checkpoints and starts afresh
    in one that holds none, so the same command line serves the first start and every restart."""
    steps, folder = runs["epoch_steps"], runs["root"] / "restart"
    run_dir = folder / "run"
    env = _fault_env(folder, "SIGKILL@step@17@1")
    command = _torchrun("--standalone", "--nproc_per_node=2", "--max-restarts=1", "--log-dir", str(folder / "logs"),
                        "--redirects", "3") + [FAULT_LAUNCHER] + runs["base"] + RECOVERY + [
                            "--epochs", "1", "--checkpoint-dir", str(run_dir)]
    code, out, err = run_launch(command, env, folder / "launch", timeout=240)
    assert code == 0, (out[-2000:], err[-3000:])
    exits = {name: (folder / "exit" / name).read_text() for name in os.listdir(folder / "exit")}
    # Rank 0 of the failed attempt returns 2 after its one-line report, unless the agent's
    # SIGTERM (sent once rank 1 died) ends it first: a race, decided by the machine's load.
    assert exits.pop("rank0-attempt0", "2") == "2", exits
    assert exits == {"rank0-attempt1": "0", "rank1-attempt1": "0"}
    stderr = _worker_stderr(folder / "logs")
    assert _qrnn_lines(stderr[("attempt_0", "0")]) == [
        "qrnn-train: error: rank 0: rank 1 of 2 stopped answering at step 16 (dead, or hung past --dist-timeout "
        "300 s): " + _qrnn_lines(stderr[("attempt_0", "0")])[0].split("300 s): ", 1)[1]]
    assert "Traceback" not in stderr[("attempt_0", "0")]
    _assert_same_model(load(_checkpoints(runs["dirs"]["two"])[steps]), load(_checkpoints(str(run_dir))[steps]))


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_nodes_match_one_node_and_recover(runs):
    """Two torchrun agents as two nodes (c10d rendezvous on 127.0.0.1, one process each, the
    same global batch); the second node's worker is SIGKILLed at step 17, both agents restart
    their workers, which resume with --resume auto: the parameters equal those of one node
    with two processes, bit for bit."""
    steps, folder = runs["epoch_steps"], runs["root"] / "two-nodes"
    run_dir = folder / "run"
    env = _fault_env(folder, "SIGKILL@step@17@1")
    agent = _torchrun("--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d",
                      f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--rdzv-id=qrnn-test", "--max-restarts=1")
    train = [FAULT_LAUNCHER] + runs["base"] + RECOVERY + ["--epochs", "1", "--checkpoint-dir", str(run_dir)]
    folder.joinpath("node1").mkdir()
    with open(folder / "node1" / "output", "w") as node1_output:
        node1 = subprocess.Popen(agent + train, stdout=node1_output, stderr=subprocess.STDOUT, env=env)
        try:
            code, out, err = run_launch(agent + train, env, folder / "node0", timeout=240)
            node1_code = node1.wait(timeout=60)
        finally:
            node1.kill()
    assert code == 0 and node1_code == 0, (out[-2000:], err[-3000:], (folder / "node1" / "output").read_text()[-3000:])
    assert (folder / "fault-fired").exists() and "ranks in sync: 2 processes" in out + (
        folder / "node1" / "output").read_text()
    _assert_same_model(load(_checkpoints(runs["dirs"]["two"])[steps]), load(_checkpoints(str(run_dir))[steps]))


def _pids(marker, rank):
    """Pids of the launch's workers of `rank` (processes with both environment entries)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                entries = fh.read().split(b"\0")
        except OSError:
            continue
        if marker in entries and f"RANK={rank}".encode() in entries and b"LOCAL_RANK=" + str(rank).encode() in entries:
            found.append(int(pid))
    return found


def test_a_hung_rank_fails_the_job_in_bounded_time_naming_it(runs):
    """Rank 1 SIGSTOPs itself at step 7; with --dist-timeout 5 rank 0 gives up and names it on
    one line, exit 2. (Once rank 0 is gone the test resumes rank 1, which torchrun would
    otherwise SIGKILL after its own 30 s.) The wait is --dist-timeout's, not torch's default of
    30 minutes."""
    folder = runs["root"] / "hung"
    marker = f"QRNN_TEST_HUNG={uuid.uuid4().hex}"
    env = _fault_env(folder, "SIGSTOP@step@7@1", QRNN_TEST_HUNG=marker.split("=")[1])
    command = _torchrun("--standalone", "--nproc_per_node=2", "--log-dir", str(folder / "logs"), "--redirects", "3") + [
        FAULT_LAUNCHER] + runs["base"] + ["--epochs", "1", "--dist-timeout", "5",
                                          "--checkpoint-dir", str(folder / "run")]
    folder.joinpath("launch").mkdir()
    with open(folder / "launch" / "output", "w") as output:
        launch = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + 120
            while launch.poll() is None and time.monotonic() < deadline:
                if (folder / "exit" / "rank0-attempt0").exists():
                    for pid in _pids(marker.encode(), 1):
                        os.kill(pid, signal.SIGCONT)
                time.sleep(0.2)
            code = launch.wait(timeout=30)
        finally:
            _kill_marked(marker.encode())
            launch.kill()
    assert code != 0
    assert (folder / "exit" / "rank0-attempt0").read_text() == "2"
    rank0 = _worker_stderr(folder / "logs")[("attempt_0", "0")]
    lines = _qrnn_lines(rank0)
    assert len(lines) == 1 and "Traceback" not in rank0, rank0[-3000:]
    assert lines[0].startswith("qrnn-train: error: rank 0: rank 1 of 2 stopped answering at step 6 "
                               "(dead, or hung past --dist-timeout 5 s)"), lines


def test_ranks_whose_clocks_disagree_stop_at_the_same_step(runs):
    """Rank 1's clock runs 100 times too fast: the time budget is rank 0's alone, so both
    ranks stop together and stay in sync (a rank leaving fit() on its own clock would leave the
    others waiting in a collective it never joins)."""
    folder = runs["root"] / "clocks"
    env = _fault_env(folder, "", CLOCK="1@100")
    command = _torchrun("--standalone", "--nproc_per_node=2") + [FAULT_LAUNCHER] + runs["base"] + [
        "--epochs", "20", "--time-budget", "3", "--dist-timeout", "20", "--checkpoint-dir", str(folder / "run")]
    code, out, err = run_launch(command, env, folder / "launch", timeout=120)
    assert code == 0, (out[-2000:], err[-3000:])
    assert "ranks in sync: 2 processes" in out
    # Stopped by the budget (an epoch takes well under a second here), not by --epochs.
    saved = load(_latest_step(folder / "run"))
    assert 0 < saved["progress"]["step"] < 20 * runs["epoch_steps"]


def _latest_step(run_dir):
    found = _checkpoints(str(run_dir))
    return found[max(found)]


def test_two_ranks_on_a_cold_cache_tokenize_once(tmp_path):
    """The corpus cache under torchrun: one rank builds it, the other waits and maps it; the
    header says which process built it."""
    data = tmp_path / "cold.txt"
    data.write_text(default_text()[:3_000], encoding="utf-8")
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    log = tmp_path / "writes"
    log.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", WRITE_LOG=str(log))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(launcher),
               "--data", str(data), "--epochs", "1", "--max-steps", "2", "--checkpoint-dir", str(tmp_path / "run")]
    code, stdout, stderr = run_launch(command + ARGS, env, tmp_path / "output", timeout=300)
    assert code == 0, (code, stdout[-2000:], stderr[-3000:])
    builds = sum(path.read_text().split().count("_build") for path in log.iterdir())
    assert builds == 1
    line = next(line for line in stdout.splitlines() if line.startswith("corpus cache: ") and "(built" in line)
    assert "(built here in" in line or "(rank 1)" in line, line
