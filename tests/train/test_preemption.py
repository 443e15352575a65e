"""qrnn-train meets its scheduler, in real subprocesses: SIGTERM and SIGUSR1 (during a step,
during a save, to a PID 1 of a container) stop it with a checkpoint of the position reached
and exit status 128 + the signal; --resume auto continues bit-identically; a kill between a
best checkpoint's commit and its promotion to best.pt is repaired on resume.

Faults come from tests/train/fault_launcher.py (see there); the torchrun cases (restarts,
two nodes, a hung rank) are in test_distributed.py."""

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

import qrnn
from conftest import assert_same_training_state
from qrnn.checkpoint import load
from qrnn.train import Trainer, TrainingStopped
from qrnn.train import main as train_main
from qrnn.train.data import default_text

pytestmark = pytest.mark.slow

LAUNCHER = str(Path(__file__).with_name("fault_launcher.py"))
# About 29 steps per epoch (1,826 training characters as 8 columns, chunks of 8); a
# checkpoint every 5 steps; one command line for first starts and resumes.
ARGS = ["--layers", "2", "--hidden", "32", "--emsize", "16", "--batch-size", "8", "--bptt", "8",
        "--dropout", "0", "--warmup", "5", "--lr", "3e-3", "--precision", "fp32", "--no-progress",
        "--sample-length", "0", "--keep-last", "20", "--save-every", "5", "--resume", "auto"]
EPOCH_STEPS = 29


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    data = tmp_path_factory.mktemp("preempt") / "text.txt"
    data.write_text(default_text()[:2_000], encoding="utf-8")
    return ["--data", str(data)] + ARGS


@pytest.fixture(scope="module")
def reference(base, tmp_path_factory):
    """Two epochs in one go, in this process: what every interrupted run must end as."""
    run_dir = str(tmp_path_factory.mktemp("reference") / "run")
    assert train_main(base + ["--epochs", "2", "--checkpoint-dir", run_dir]) == 0
    return load(_latest(run_dir))


def _latest(run_dir):
    with qrnn.checkpoint.AsyncCheckpointer(run_dir) as scanner:
        return scanner.latest()


def _launch(base, run_dir, fault, extra, prefix=(), env=()):
    env = dict(os.environ, FAULT=fault, FAULT_ONCE=f"{run_dir}.fault", OMP_NUM_THREADS="1", **dict(env))
    command = [*prefix, sys.executable, LAUNCHER, *base, "--checkpoint-dir", str(run_dir), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _run(base, run_dir, fault, extra, timeout=120):
    process = _launch(base, run_dir, fault, extra)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        process.kill()
    return process.returncode, out, err


def _assert_only_committed_files(run_dir):
    """No temporaries (the writer's dot-files, best.pt.tmp) are left in the run folder."""
    for name in os.listdir(run_dir):
        assert name in ("best.pt", "metrics.jsonl", "loss.png") or (
            name.startswith("ckpt-") and name.endswith(".pt")), name


def test_sigterm_during_a_step_checkpoints_the_position_and_resumes_bit_identical(base, reference, tmp_path):
    """SIGTERM mid-step: the run stops at that step with exit status 143 and one line, the
    partial epoch checkpointed; the same command line resumes it bit-identically."""
    run_dir = tmp_path / "run"
    code, _, err = _run(base, run_dir, "SIGTERM@step@12", ["--epochs", "2"])
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert err.strip() == (f"qrnn-train: stopped by SIGTERM at step 12, checkpointed in {run_dir}; "
                           "continue with --resume")
    stopped = load(_latest(run_dir))
    assert stopped["progress"]["step"] == 12 and stopped["progress"]["position"] == 12
    _assert_only_committed_files(run_dir)
    # The same command line continues it, and it ends as if never stopped.
    assert train_main(base + ["--epochs", "2", "--checkpoint-dir", str(run_dir)]) == 0
    assert_same_training_state(reference, load(_latest(run_dir)))


def test_sigusr1_during_a_save_commits_it_and_promotes_best_pt(base, tmp_path):
    """The 6th save (the end of epoch 1, a new best) is in flight when SIGUSR1 comes: it
    commits, best.pt becomes it, nothing is left half-written, and the exit status is 138."""
    run_dir = tmp_path / "run"
    code, _, err = _run(base, run_dir, "SIGUSR1@save@6", ["--epochs", "2"])
    assert code == 128 + signal.SIGUSR1, err[-2000:]
    assert "stopped by SIGUSR1" in err and err.count("\n") == 1
    latest = _latest(run_dir)
    assert os.path.basename(latest) == f"ckpt-{EPOCH_STEPS:012d}.pt"
    assert load(latest)["progress"]["best_step"] == EPOCH_STEPS
    assert os.path.samefile(run_dir / "best.pt", latest)
    _assert_only_committed_files(run_dir)


def test_kill_before_best_pt_promotion_is_repaired_on_resume(base, tmp_path):
    """SIGKILL after the best checkpoint committed, before best.pt: the resumed run promotes
    it (each checkpoint records best_step)."""
    run_dir = tmp_path / "run"
    code, _, err = _run(base, run_dir, "SIGKILL@best@1", ["--epochs", "1"])
    assert code == -signal.SIGKILL, err[-2000:]
    assert not (run_dir / "best.pt").exists()
    # A link planted as best.pt is replaced, one planted as best.pt.tmp (not a name the writer
    # uses: its temporaries are hidden, unique names) is neither followed nor touched.
    (tmp_path / "outside").write_text("not a checkpoint")
    (run_dir / "best.pt").symlink_to(tmp_path / "outside")
    (run_dir / "best.pt.tmp").symlink_to(tmp_path / "elsewhere")
    assert train_main(base + ["--epochs", "1", "--checkpoint-dir", str(run_dir)]) == 0
    assert not (run_dir / "best.pt").is_symlink()
    assert os.path.samefile(run_dir / "best.pt", run_dir / f"ckpt-{EPOCH_STEPS:012d}.pt")
    assert not (tmp_path / "elsewhere").exists() and (tmp_path / "outside").read_text() == "not a checkpoint"
    (run_dir / "best.pt.tmp").unlink()
    _assert_only_committed_files(run_dir)


def test_a_stop_that_overruns_its_grace_exits_at_once(base, tmp_path):
    """The main thread hangs after SIGTERM: --stop-grace 2 ends the process with 143 and one
    line; the checkpoints committed before stand."""
    run_dir = tmp_path / "run"
    code, _, err = _run(base, run_dir, "SIGTERM@hang@2", ["--epochs", "2", "--stop-grace", "2"], timeout=60)
    assert code == 128 + signal.SIGTERM
    assert err.strip() == ("qrnn-train: SIGTERM: not stopped within the 2 s grace; exiting now "
                           "(the last committed checkpoint stands)")
    assert load(_latest(run_dir))["progress"]["step"] in (5, 10)


def _pid_1_prefix():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a new PID namespace needs root and unshare")
    prefix = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")
    probe = subprocess.run([*prefix, "sh", "-c", "echo $$"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        pytest.skip(f"unshare --pid does not work here: {probe.stderr.strip()}")
    return prefix


def _pid_1_of(marker: str):
    """The host pid of the process that is PID 1 of its namespace and carries `marker`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if marker.encode() not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/status") as fh:
                nspid = next(line for line in fh if line.startswith("NSpid:")).split()[1:]
        except (OSError, StopIteration):
            continue
        if nspid[-1] == "1" and len(nspid) > 1:
            return int(pid)
    return None


def test_pid_1_of_a_container_stops_on_sigterm(base, tmp_path):
    """A PID 1 without a handler ignores SIGTERM (Kubernetes then SIGKILLs it after its
    grace period); qrnn-train installs its handlers, so as PID 1 it stops and checkpoints."""
    prefix = _pid_1_prefix()
    run_dir = tmp_path / "run"
    token = uuid.uuid4().hex
    process = _launch(base, run_dir, "", ["--epochs", "200"], prefix=prefix, env={"QRNN_TEST_PID1": token})
    try:
        deadline = time.monotonic() + 90
        while (not run_dir.is_dir() or _latest(run_dir) is None) and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.2)
        pid = _pid_1_of(f"QRNN_TEST_PID1={token}")
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "stopped by SIGTERM" in err
    stopped = load(_latest(run_dir))
    assert 0 < stopped["progress"]["step"] < 200 * EPOCH_STEPS
    _assert_only_committed_files(run_dir)


# ---------------------------------------------------------------- the library form

def _tiny_trainer(tmp_path, **options):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.mse_loss, precision="fp32",
                   checkpoint_dir=str(tmp_path), keep_last=None, progress=False, **options)


def _steps(run_dir):
    with qrnn.checkpoint.AsyncCheckpointer(run_dir) as scanner:
        return [load(path)["progress"]["step"] for path in scanner.checkpoints(order="step")]


def test_trainer_saves_every_n_steps_and_every_interval(tmp_path):
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
    _tiny_trainer(tmp_path / "every", save_every=2).fit(data, epochs=2)
    assert _steps(tmp_path / "every") == [2, 4, 5, 6, 8, 10]  # epoch ends at 5 and 10
    _tiny_trainer(tmp_path / "interval", save_interval=1e-9).fit(data, epochs=1)  # due before every step
    assert _steps(tmp_path / "interval") == [1, 2, 3, 4, 5]


def test_trainer_fit_stops_on_a_signal_with_a_checkpoint(tmp_path):
    """In this process: SIGUSR1 during step 3 -> TrainingStopped (a SystemExit, code 138)
    after the checkpoint of step 3 (mid-epoch) committed; the handlers are restored."""
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(6)]
    trainer = _tiny_trainer(tmp_path)
    trainer.module.register_forward_hook(
        lambda *_: os.kill(os.getpid(), signal.SIGUSR1) if trainer.step == 2 and trainer.module.training else None)
    with pytest.raises(TrainingStopped) as stopped:
        trainer.fit(data, valid_data=data[:2], epochs=2)
    assert stopped.value.code == 128 + signal.SIGUSR1 and stopped.value.step == 3
    assert _steps(tmp_path) == [3]
    progress = load(_latest(tmp_path))["progress"]
    assert progress["position"] == 3 and progress["epoch"] == 0
    assert trainer.history[-1]["valid_loss"] is None and not trainer.history[-1]["complete"]
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
