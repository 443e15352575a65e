"""qrnn-train meets its scheduler and its user, in real subprocesses: SIGTERM, SIGUSR1 and
Ctrl-C (during a step, during a save, to a PID 1 of a container) stop it with a checkpoint of
the position reached and exit status 128 + the signal, a second Ctrl-C at once; --resume auto
continues bit-identically; a kill between a best checkpoint's commit and its promotion to
best.pt is repaired on resume; a bare --resume picks the unfinished run under runs/; a second
qrnn-train on a run folder in use is refused at start-up.

Faults come from tests/train/fault_launcher.py (see there); the torchrun cases (restarts,
two nodes, a hung rank) are in test_distributed.py."""

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

import qrnn
from conftest import assert_same_training_state
from qrnn.checkpoint import load
from qrnn.train import CheckpointConfig, PrecisionConfig, Trainer, TrainingStopped
from qrnn.train import main as train_main
from qrnn.train.checkpoints import restore_best
from qrnn.train.data import default_text
from qrnn.train.stopping import with_ctrl_c

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


def _default_sigint():
    """In the child: Ctrl-C's default disposition (a test run in the background of a shell
    inherits SIGINT ignored, and qrnn-train leaves an ignored SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _launch(base, run_dir, fault, extra, prefix=(), env=(), cwd=None):
    env = dict(os.environ, FAULT=fault, FAULT_ONCE=f"{run_dir}.fault", OMP_NUM_THREADS="1", **dict(env))
    command = [*prefix, sys.executable, LAUNCHER, *base, "--checkpoint-dir", str(run_dir), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=cwd, preexec_fn=_default_sigint)


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


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_during_a_step_checkpoints_the_position_and_resumes_bit_identical(base, reference, tmp_path,
                                                                                       name):
    """SIGTERM, or SIGINT (Ctrl-C), mid-step: the run stops at that step with exit status 128 +
    the signal and one line naming the file saved and how to continue, the partial epoch
    checkpointed; the same command line resumes it bit-identically."""
    run_dir = tmp_path / "run"
    code, _, err = _run(base, run_dir, f"{name}@step@12", ["--epochs", "2"])
    assert code == 128 + getattr(signal, name), err[-2000:]
    assert err == (f"qrnn-train: stopped by {name} at step 12 (epoch 1, batch 12 of {EPOCH_STEPS}): saved "
                   f"{run_dir}/ckpt-000000000012.pt; continue with --resume --checkpoint-dir {run_dir}\n")
    stopped = load(_latest(run_dir))
    assert stopped["progress"]["step"] == 12 and stopped["progress"]["position"] == 12
    _assert_only_committed_files(run_dir)
    # The same command line continues it, and it ends as if never stopped.
    assert train_main(base + ["--epochs", "2", "--checkpoint-dir", str(run_dir)]) == 0
    assert_same_training_state(reference, load(_latest(run_dir)))


def test_a_second_ctrl_c_during_the_save_exits_at_once(base, reference, tmp_path):
    """The first Ctrl-C asks for a stop; a second one while its save is in flight (the main
    thread then hangs) ends the process at once with status 130 and one line. The last
    committed checkpoint stands, and resuming from it ends bit-identical."""
    run_dir = tmp_path / "run"
    # Saves at steps 5 and 10 (--save-every 5); the stop's save at step 12 is the third.
    code, _, err = _run(base, run_dir, "SIGINT@step@12,SIGINT@hang@3", ["--epochs", "2"])
    assert code == 128 + signal.SIGINT, err[-2000:]
    assert err == ("qrnn-train: SIGINT again: exiting now, without waiting for the stop (the last committed "
                   "checkpoint stands; continue with --resume)\n")
    assert load(_latest(run_dir))["progress"]["step"] in (10, 12)
    assert train_main(base + ["--epochs", "2", "--checkpoint-dir", str(run_dir)]) == 0
    assert_same_training_state(reference, load(_latest(run_dir)))
    _assert_only_committed_files(run_dir)  # the abandoned save's temporary and the lock are gone


class _Lines:
    """The lines a process writes to a pipe, read on a thread (waiting never blocks the test)."""

    def __init__(self, pipe):
        self.lines: queue.Queue = queue.Queue()
        self.seen: list = []
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe):
        for line in pipe:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text, timeout=120):
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"ended without {text!r}: {''.join(self.seen)[-2000:]}")
            self.seen.append(line)
            if text in line:
                return line

    def rest(self):
        self.thread.join(timeout=120)
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                self.seen.append(line)
        return "".join(self.seen)


def test_a_second_run_on_a_folder_in_use_is_refused_at_start_up(base, tmp_path):
    """While a run trains in a folder, a second qrnn-train on it is refused before it reads
    data or trains: exit status 2, one line naming the first process; the first carries on
    and stops on Ctrl-C as usual."""
    run_dir = tmp_path / "run"
    first = _launch(base, run_dir, "", ["--epochs", "200"], env={"PYTHONUNBUFFERED": "1"})
    try:
        out, err = _Lines(first.stdout), _Lines(first.stderr)
        out.wait_for("run folder:")  # set-up done: the first run holds the folder
        second = subprocess.run([sys.executable, "-m", "qrnn.train", *base, "--checkpoint-dir", str(run_dir),
                                 "--epochs", "200"], capture_output=True, text=True, timeout=120,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert second.returncode == 2, second.stderr[-2000:]
        assert second.stderr == (f"qrnn-train: error: {run_dir} is in use by pid {first.pid} on host "
                                 f"{socket.gethostname()}: wait for that run to end (or stop it), or pass "
                                 "another --checkpoint-dir\n")
        assert second.stdout == ""  # refused before the data was read
        assert first.poll() is None
        out.wait_for("epoch   1 |")  # the first run trains on, unaffected
        first.send_signal(signal.SIGINT)
        first.wait(timeout=120)
    finally:
        first.kill()
    assert first.returncode == 128 + signal.SIGINT, err.rest()[-2000:]
    stderr = err.rest()
    assert stderr.startswith("qrnn-train: stopped by SIGINT at step ") and stderr.count("\n") == 1, stderr
    assert load(_latest(run_dir))["progress"]["step"] >= EPOCH_STEPS
    _assert_only_committed_files(run_dir)


def _bare_resume(cwd, *extra):
    return subprocess.run([sys.executable, "-m", "qrnn.train", "--resume", "--no-progress", "--sample-length", "0",
                           *extra], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_bare_resume_picks_the_unfinished_run_and_says_so(base, tmp_path, monkeypatch):
    """--resume without --checkpoint-dir continues the one unfinished run under runs/ (not the
    newest finished one) and says which; once every run is finished it names the newest and
    says it is finished (exit status 0, nothing trained); several unfinished runs: it asks
    for --checkpoint-dir (exit status 2)."""
    monkeypatch.chdir(tmp_path)
    fresh = base[:-2]  # without --resume auto
    assert train_main(fresh + ["--epochs", "1", "--max-steps", "12", "--checkpoint-dir", "runs/stopped"]) == 0
    old = time.time() - 100  # the unfinished run is the older one
    for path in [tmp_path / "runs" / "stopped", *(tmp_path / "runs" / "stopped").iterdir()]:
        os.utime(path, (old, old))
    assert train_main(fresh + ["--epochs", "1", "--checkpoint-dir", "runs/finished"]) == 0

    resumed = _bare_resume(tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert ("--resume: runs/stopped, the only unfinished run of 2 under runs/ (--checkpoint-dir DIR "
            "picks another)\n") in resumed.stdout
    assert "run folder: runs/stopped (resuming ckpt-000000000012.pt: epoch 1, step 12)" in resumed.stdout
    assert resumed.stderr == ""
    assert load(_latest(tmp_path / "runs" / "stopped"))["progress"]["step"] == EPOCH_STEPS

    again = _bare_resume(tmp_path)  # both finished: the newest is named, and said to be finished
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout == "--resume: runs/stopped, the newest of 2 runs under runs/, all finished\n"
    assert again.stderr == (f"qrnn-train: runs/stopped has finished its 1 epoch (step {EPOCH_STEPS}): nothing to "
                            "train; pass --epochs N above 1 to train it further\n")
    assert load(_latest(tmp_path / "runs" / "stopped"))["progress"]["step"] == EPOCH_STEPS

    for name in ("second", "third"):
        assert train_main(fresh + ["--epochs", "1", "--max-steps", "3", "--checkpoint-dir", f"runs/{name}"]) == 0
    ambiguous = _bare_resume(tmp_path)
    assert ambiguous.returncode == 2 and ambiguous.stdout == ""
    assert ambiguous.stderr == ("qrnn-train: error: --resume: 2 unfinished runs under runs/ (runs/third, "
                                "runs/second): pass --checkpoint-dir DIR to choose one\n")


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

def _tiny_trainer(tmp_path, **checkpointing):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    return Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.functional.mse_loss,
                   precision=PrecisionConfig("fp32"),
                   checkpointing=CheckpointConfig(str(tmp_path), keep_last=None, **checkpointing), progress=False)


def _steps(run_dir):
    with qrnn.checkpoint.AsyncCheckpointer(run_dir) as scanner:
        return [load(path)["progress"]["step"] for path in scanner.checkpoints(order="step")]


def test_trainer_saves_every_n_steps_and_every_interval(tmp_path):
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
    _tiny_trainer(tmp_path / "every", save_every=2).fit(data, epochs=2)
    assert _steps(tmp_path / "every") == [2, 4, 5, 6, 8, 10]  # epoch ends at 5 and 10
    _tiny_trainer(tmp_path / "interval", save_interval=1e-9).fit(data, epochs=1)  # minutes: due before every step
    assert _steps(tmp_path / "interval") == [1, 2, 3, 4, 5]
    assert CheckpointConfig(save_interval=1.5).interval_seconds == 90.0  # --save-interval's unit, minutes
    assert CheckpointConfig().interval_seconds is None


def test_load_state_dict_writes_nothing_and_restore_best_repromotes(tmp_path):
    """Trainer.load_state_dict only loads: re-promoting best.pt after a kill cut its promotion
    short is the checkpoint component's restore_best, which qrnn-train --resume calls."""
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(5)]
    trainer = _tiny_trainer(tmp_path)
    trainer.fit(data, valid_data=data[:2], epochs=2)
    best_step = trainer.best_step
    os.remove(tmp_path / "best.pt")  # as if killed between the commit and the promotion
    before = sorted(os.listdir(tmp_path))
    resumed = _tiny_trainer(tmp_path)
    resumed.load_state_dict(load(_latest(tmp_path)))
    assert sorted(os.listdir(tmp_path)) == before and resumed.best_step == best_step is not None
    assert restore_best(str(tmp_path), resumed.best_step)
    assert load(tmp_path / "best.pt")["progress"]["step"] == best_step


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


def test_ctrl_c_is_a_stop_request_unless_ignored():
    """qrnn-train catches SIGINT as a stop request, except in a process that ignores it (a
    job a shell starts in the background): that one keeps ignoring it."""
    # Set both states explicitly: pytest itself may run as a background job ignoring SIGINT.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert with_ctrl_c() == (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert with_ctrl_c() == (signal.SIGTERM, signal.SIGUSR1)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_sigterm_with_sharded_checkpoints_saves_the_step_folder_and_resumes_bit_identical(base, reference, tmp_path):
    """--checkpoint-format dcp: SIGTERM mid-step checkpoints the position as a committed
    step folder (every rank's part, then .metadata); the same command line resumes it (the
    format is kept from the checkpoint) and ends where the file-format run that never
    stopped ends."""
    from qrnn.train.checkpoints import load_checkpoint
    from qrnn.train.runs import latest_checkpoint
    run_dir = tmp_path / "run"
    code, _, err = _run(base, run_dir, "SIGTERM@step@12", ["--epochs", "2", "--checkpoint-format", "dcp"])
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert err == (f"qrnn-train: stopped by SIGTERM at step 12 (epoch 1, batch 12 of {EPOCH_STEPS}): saved "
                   f"{run_dir}/step-000000000012; continue with --resume --checkpoint-dir {run_dir}\n")
    assert load_checkpoint(latest_checkpoint(str(run_dir)))["progress"]["position"] == 12
    assert not any(name.endswith(".pt") or name.startswith(".") for name in os.listdir(run_dir))
    assert train_main(base + ["--epochs", "2", "--checkpoint-dir", str(run_dir)]) == 0
    latest = latest_checkpoint(str(run_dir))
    assert os.path.basename(latest).startswith("step-")
    assert_same_training_state(reference, load_checkpoint(latest))
