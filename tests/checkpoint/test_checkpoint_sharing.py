"""qrnn.checkpoint shared between processes: savers in other PID namespaces (containers) and
on other hosts, a saver that is always PID 1, forked children, several checkpointers and
hooks on one optimizer, retention after a rollback, one transient failure, and readers
polling and loading while a writer commits."""

import errno
import fcntl
import itertools
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from qrnn import _C
from qrnn.checkpoint import AsyncCheckpointer, CheckpointError, load
from qrnn.checkpoint import reader as checkpoint_reader
from qrnn.checkpoint._testing import FaultyCheckpointer

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def temporaries(folder):
    return sorted(n for n in os.listdir(folder) if _C.checkpoint_is_temporary(n))


def run_python(script, *args, timeout=180, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(script), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def other_pid_namespace():
    """Command prefix that runs a process as PID 1 of a new PID namespace (a container's view)."""
    if not IS_ROOT or not shutil.which("unshare"):
        pytest.skip("a new PID namespace needs root and unshare")
    probe = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", "echo $$"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        pytest.skip(f"unshare --pid does not work here: {probe.stderr.strip()}")
    return ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")


# ---- 1. ownership across namespaces and hosts --------------------------------------

def lock_like_a_writer(fd):
    """The advisory lock a writer holds on its temporary (an open-file-description lock)."""
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))


@pytest.mark.skipif(not hasattr(fcntl, "F_OFD_SETLK"), reason="needs open-file-description locks")
def test_a_live_writers_temporary_survives_readers_and_writers(tmp_path):
    """A temporary named after a PID that does not exist here (a saver in another container or
    on another host) but locked by its writer is never deleted; once the lock is gone it is
    stale and the next writer's first save removes it. The lock, not the PID, decides: a PID
    from another namespace looks dead here."""
    foreign = tmp_path / ".ckpt-000000000005.pt.tmp-999999-0123456789012345"
    assert _C.checkpoint_is_temporary(foreign.name)
    fd = os.open(foreign, os.O_RDWR | os.O_CREAT, 0o644)
    lock_like_a_writer(fd)
    try:
        for _ in range(5):
            reader = AsyncCheckpointer(tmp_path)
            assert reader.latest() is None and reader.checkpoints() == []
            reader.close()
        with AsyncCheckpointer(tmp_path, prefix="eval-") as writer:  # a writer's cleanup runs too
            writer.save({"x": torch.ones(3)}, 1).result()
        assert _C.checkpoint_remove_stale_temporaries(str(tmp_path)) == 0
        assert foreign.exists()
    finally:
        os.close(fd)  # the writer is gone: its lock with it
    assert temporaries(tmp_path) == [foreign.name]  # readers still delete nothing
    AsyncCheckpointer(tmp_path).close()
    assert foreign.exists()
    with AsyncCheckpointer(tmp_path) as writer:
        writer.save({"x": torch.ones(3)}, 2).result()
    assert temporaries(tmp_path) == []


SAVER = """
import json, sys, torch
from qrnn.checkpoint import AsyncCheckpointer, CheckpointError
ckpt = AsyncCheckpointer(sys.argv[1], keep_last=2)
w = torch.empty(4_000_000)                      # 16 MB: each save takes a while
lost = []
for step in range(int(sys.argv[2])):
    w.fill_(step)
    try:
        ckpt.save({"w": w, "step": step}, step).result()
    except CheckpointError as e:
        lost.append([step, e.errno, e.operation])
ckpt.close()
print(json.dumps({"pid": __import__("os").getpid(), "lost": lost}))
"""


def test_saver_in_another_pid_namespace_loses_nothing(tmp_path):
    """A saver in its own PID namespace, under a PID that does not exist in this one (so a
    liveness check by PID calls it dead), while this process opens checkpointers in the same
    folder every few milliseconds, reads latest() and saves there too. Every one of its saves
    commits: none of its temporaries is taken for a dead process's and removed."""
    prefix = other_pid_namespace()
    saves = 30
    pid_max = int(open("/proc/sys/kernel/pid_max").read())
    start = pid_max - 1000  # the saver's PID in its namespace: start + 1
    if os.path.exists(f"/proc/{start + 1}"):
        pytest.skip("that PID is taken here")
    launch = f'echo {start} > /proc/sys/kernel/ns_last_pid && "$@"'
    saver = subprocess.Popen([*prefix, "sh", "-c", launch, "sh", sys.executable, "-c", SAVER, str(tmp_path),
                              str(saves)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rounds = 0
        while saver.poll() is None:
            evaluator = AsyncCheckpointer(tmp_path)
            latest = evaluator.latest()
            if rounds % 10 == 0:  # a writer opened anew: its first save runs the stale cleanup
                with AsyncCheckpointer(tmp_path, prefix="eval-", keep_last=1) as writer:
                    writer.save({"seen": latest or ""}, rounds).result()
            evaluator.close()
            rounds += 1
            time.sleep(0.01)
        out, err = saver.communicate(timeout=180)
    finally:
        if saver.poll() is None:
            saver.kill()
    assert saver.returncode == 0, err
    result = json.loads(out)
    assert result["pid"] == start + 1  # it ran in another PID namespace, under a PID unknown here
    assert result["lost"] == [], f"{len(result['lost'])} of {saves} saves lost: {result['lost'][:3]}"
    assert rounds > 0 and temporaries(tmp_path) == []
    assert load(tmp_path / f"ckpt-{saves - 1:012d}.pt")["step"] == saves - 1


# ---- 2. a saver that is always PID 1 -------------------------------------------------

def wait_until_gone(marker, timeout=60):
    """Wait until no process has `marker` on its command line (a killed namespace's PID 1
    dies once its current system call returns)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    alive = alive or marker.encode() in f.read()
            except OSError:
                pass
        if not alive:
            return
        time.sleep(0.05)

PID1_SAVER = """
import os, sys, torch
from qrnn.checkpoint import AsyncCheckpointer
assert os.getpid() == 1
ckpt = AsyncCheckpointer(sys.argv[1], keep_last=2)
w = torch.full((8_000_000,), float(sys.argv[2]))  # 32 MB
print("ready", flush=True)
while True:
    ckpt.save({"w": w, "run": int(sys.argv[2])}, 100).result()   # the same step every time
"""


def test_pid_1_restarts_neither_leak_nor_collide(tmp_path):
    """A container's PID 1 killed mid-save six times, then restarted: its first save of the
    same step succeeds (its temporary's name differs from every dead run's, so no EEXIST) and
    removes every temporary the dead runs left (none is leaked)."""
    prefix = other_pid_namespace()
    for run in range(6):
        child = subprocess.Popen([*prefix, sys.executable, "-c", PID1_SAVER, str(tmp_path), str(run)],
                                 stdout=subprocess.PIPE)
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(0.3 + 0.1 * run)
        child.kill()  # unshare --kill-child takes PID 1 down with it
        child.wait()
        child.stdout.close()
        wait_until_gone(str(tmp_path))
    script = """
    import os, sys, torch
    from qrnn.checkpoint import AsyncCheckpointer
    assert os.getpid() == 1
    with AsyncCheckpointer(sys.argv[1], keep_last=2) as ckpt:
        print(ckpt.save({"w": torch.full((10,), 7.0), "run": 7}, 100).result())
    """
    result = run_python(script, tmp_path, prefix=prefix)
    assert result.returncode == 0, result.stderr
    assert temporaries(tmp_path) == []
    assert load(tmp_path / "ckpt-000000000100.pt")["run"] == 7


def test_temporary_names_are_unique_per_save(tmp_path):
    """Names carry fresh randomness besides the PID: the same process saving the same step
    never reuses a name, so a predecessor with the same PID cannot collide."""
    seen = set()
    with FaultyCheckpointer(tmp_path, after_bytes=0, errno=errno.EIO) as ckpt:
        for _ in range(20):
            handle = ckpt.save({"x": torch.ones(4)}, 3)
            with pytest.raises(CheckpointError) as caught:
                handle.result()
            name = os.path.basename(caught.value.filename)
            assert _C.checkpoint_is_temporary(name) and name not in seen
            assert f".tmp-{os.getpid()}-" in name
            seen.add(name)
    assert temporaries(tmp_path) == []


# ---- 3. overlap mode composes -------------------------------------------------------

def _model_and_optimizer():
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return model, opt


def _train_step(model, opt):
    opt.zero_grad()
    model(torch.randn(4, 64)).sum().backward()
    opt.step()


def test_overlap_two_checkpointers_one_optimizer(tmp_path):
    """Two checkpointers overlap their snapshots with the same optimizer: its steps run (no
    hook is removed while torch runs the hooks, so no 'OrderedDict mutated during iteration')
    and both files hold the weights as they were at save()."""
    model, opt = _model_and_optimizer()
    a, b = AsyncCheckpointer(tmp_path / "a"), AsyncCheckpointer(tmp_path / "b")
    expected = model.weight.detach().clone()
    ha = a.save({"w": model.weight}, 1, overlap_with=opt)
    hb = b.save({"w": model.weight}, 1, overlap_with=opt)
    _train_step(model, opt)
    _train_step(model, opt)
    assert torch.equal(load(ha.result())["w"], expected) and torch.equal(load(hb.result())["w"], expected)
    a.close()
    b.close()


def test_overlap_two_saves_without_a_step_between(tmp_path):
    model, opt = _model_and_optimizer()
    with AsyncCheckpointer(tmp_path, keep_last=None, max_pending=2) as ckpt:
        first = model.weight.detach().clone()
        h1 = ckpt.save({"w": model.weight}, 1, overlap_with=opt)
        h2 = ckpt.save({"w": model.weight}, 2, overlap_with=opt)
        _train_step(model, opt)
        h3 = ckpt.save({"w": model.weight}, 3, overlap_with=opt)
        third = model.weight.detach().clone()
        _train_step(model, opt)
        assert torch.equal(load(h1.result())["w"], first) and torch.equal(load(h2.result())["w"], first)
        assert torch.equal(load(h3.result())["w"], third)


def test_overlap_with_user_hooks_in_any_order(tmp_path):
    model, opt = _model_and_optimizer()
    calls = []
    early = opt.register_step_pre_hook(lambda o, a, k: calls.append("early"))
    with AsyncCheckpointer(tmp_path, keep_last=None) as ckpt:
        expected = model.weight.detach().clone()
        handle = ckpt.save({"w": model.weight}, 1, overlap_with=opt)
        late = opt.register_step_pre_hook(lambda o, a, k: calls.append("late"))
        _train_step(model, opt)
        early.remove()
        _train_step(model, opt)  # a removed user hook, the barrier still there
        late.remove()
        handle2 = ckpt.save({"w": model.weight}, 2, overlap_with=opt)
        expected2 = model.weight.detach().clone()
        _train_step(model, opt)
        assert torch.equal(load(handle.result())["w"], expected)
        assert torch.equal(load(handle2.result())["w"], expected2)
    assert calls == ["early", "late", "late"]


# ---- 4. fork ------------------------------------------------------------------------

FORK = """
import json, os, sys, time, torch
from qrnn.checkpoint import AsyncCheckpointer
folder = sys.argv[1]
model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = AsyncCheckpointer(folder, keep_last=None)
big = torch.randn(20_000_000)                          # 80 MB: still in flight at fork
parent_save = ckpt.save({"big": big}, 1)
overlap = ckpt.save({"w": model.weight}, 2, overlap_with=opt)

def child(mode):
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if mode == "save":                         # works: fresh writer threads
                path = ckpt.save({"x": torch.arange(5)}, 10 + os.getpid() % 1000).result()
                assert torch.equal(torch.load(path)["x"], torch.arange(5))
                try:
                    parent_save.result()
                    code = 3
                except RuntimeError as e:
                    assert "parent process" in str(e)
                model(torch.randn(2, 256)).sum().backward()
                opt.step()                             # the parent's overlap barrier is not ours
            else:  # "exit": leave with the parent's save in flight, through the exit-time close()
                with open(os.path.join(folder, "in-flight-at-fork"), "w") as f:
                    f.write(str(not (parent_save._save.finished() and overlap._save.finished())))
        except BaseException as e:
            print("child failed:", repr(e), file=sys.stderr, flush=True)
            code = 2
        sys.exit(code)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"

out = {"exit": child("exit"), "save": child("save")}
opt.step()
out["parent"] = [os.path.basename(parent_save.result()), os.path.basename(overlap.result())]
ckpt.close()
print(json.dumps(out))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_forked_child_saves_and_exits_without_hanging(tmp_path):
    """A forked child saves through its own checkpointer and exits, with the parent's save in
    flight at fork() or not: neither the child's save() nor its exit-time close() hangs."""
    result = run_python(FORK, tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["save"] == 0 and out["exit"] == 0, (out, result.stderr)
    assert out["parent"] == ["ckpt-000000000001.pt", "ckpt-000000000002.pt"]
    print("a parent save in flight when the exiting child forked:", (tmp_path / "in-flight-at-fork").read_text())
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".pt")]) == 3


# ---- 6. retention by commit order -------------------------------------------------------

def test_rollback_run_keeps_its_saves(tmp_path):
    """Steps 0-19 with keep_last=4 by one process, then a run rolled back to step 5 saves 5, 6,
    7: its files are kept and latest() is its last save (retention and latest() follow commit
    order, not the step, so the abandoned run's step 19 is the one retired)."""
    script = """
    import sys, torch
    from qrnn.checkpoint import AsyncCheckpointer
    with AsyncCheckpointer(sys.argv[1], keep_last=4) as ckpt:
        for step in range(20):
            ckpt.save({"step": step, "run": "first"}, step)
    """
    result = run_python(script, tmp_path)
    assert result.returncode == 0, result.stderr
    with AsyncCheckpointer(tmp_path, keep_last=4) as ckpt:
        assert load(ckpt.latest())["step"] == 19
        for step in (5, 6, 7):
            ckpt.save({"step": step, "run": "rollback"}, step).result()
            assert load(ckpt.latest()) == {"step": step, "run": "rollback"}
        names = [os.path.basename(p) for p in ckpt.checkpoints()]
        assert names == ["ckpt-000000000019.pt", "ckpt-000000000005.pt", "ckpt-000000000006.pt",
                         "ckpt-000000000007.pt"]
        assert ckpt.latest(order="step").endswith("ckpt-000000000019.pt")
        ckpt.save({"step": 8, "run": "rollback"}, 8).result()
    reader = AsyncCheckpointer(tmp_path)  # another process's view is the same
    assert [load(p)["step"] for p in reader.checkpoints()] == [5, 6, 7, 8]
    reader.close()


# ---- 7. one transient failure costs one checkpoint ------------------------------------

def test_transient_failure_costs_one_checkpoint(tmp_path):
    """The disk fails once: only that checkpoint is lost. The next save() reports the failure
    and is still made (its handle is the error's next_handle)."""
    ckpt = FaultyCheckpointer(tmp_path, keep_last=None, after_bytes=0, errno=errno.EIO, times=1)
    ckpt.save({"step": 1}, 1)
    with pytest.raises(CheckpointError) as caught:
        ckpt.save({"step": 2}, 2)
    assert caught.value.step == 1 and caught.value.errno == errno.EIO
    assert load(caught.value.next_handle.result()) == {"step": 2}
    ckpt.save({"step": 3}, 3).result()
    ckpt.close()
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000000002.pt", "ckpt-000000000003.pt"]


def test_earlier_failure_survives_a_save_that_fails_itself(tmp_path):
    """A save() that cannot even start (an unpicklable state) does not swallow the earlier
    failure it was about to report."""
    ckpt = FaultyCheckpointer(tmp_path, after_bytes=0, errno=errno.EIO, times=1)
    ckpt.save({"step": 1}, 1)
    with pytest.raises(Exception) as caught:
        ckpt.save({"bad": lambda: None}, 2)
    assert not isinstance(caught.value, CheckpointError)
    with pytest.raises(CheckpointError) as caught:
        ckpt.wait()
    assert caught.value.step == 1
    ckpt.save({"step": 3}, 3).result()
    ckpt.close()


# ---- 8. readers beside a writer -------------------------------------------------------

WRITER_SAVES = 400  # enough commits for a reader racing them to meet every window a commit opens


def numbered_state(number: int) -> dict:
    """Save ``number``: its own values and, from one number to the next, a different size."""
    return {"number": number, "w": torch.full((1 + number % 7 * 1000,), float(number))}


def assert_whole(state: dict) -> None:
    """``state`` is one whole numbered_state, not a mix of two files."""
    number, w = state["number"], state["w"]
    assert w.numel() == 1 + number % 7 * 1000 and bool((w == number).all()), (number, w.numel())


def read_while(write, read) -> tuple:
    """Calls ``read()`` over and over on another thread while ``write()`` runs on this one;
    (reads made, the first problems met as strings)."""
    problems: list = []
    reads = 0
    done = threading.Event()

    def reader():
        nonlocal reads
        while not done.is_set():
            try:
                read()
            except Exception as error:  # noqa: BLE001 - every failure is a finding
                problems.append(f"{type(error).__name__}: {error}")
            reads += 1

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        write()
    finally:
        done.set()
        thread.join()
    return reads, problems[:5]


def test_an_evaluator_beside_a_keep_last_1_writer_always_finds_and_loads_a_checkpoint(tmp_path):
    """An evaluator polling latest() and loading what it names (plainly and with mmap) while
    the writer commits a new checkpoint and deletes the old one. A checkpoint deleted before
    the evaluator opened it is FileNotFoundError; nothing else may fail: latest() never
    returns None while a listing races a commit, and load(mmap=True) maps the file it opened
    and checked, not the name again."""
    writer = AsyncCheckpointer(tmp_path, keep_last=1, _sync=False)
    writer.save(numbered_state(0), 0).result()
    evaluator = AsyncCheckpointer(tmp_path)  # reads only: no lock, deletes nothing
    mapped = itertools.cycle([False, True])

    def evaluate():
        for _ in range(20):  # polls outnumber loads: each poll is a chance to race a commit
            path = evaluator.latest()
            assert path is not None, "latest() found no checkpoint"
        step = _C.checkpoint_parse_name(os.path.basename(path), "ckpt-", ".pt")
        try:
            state = load(path, mmap=next(mapped))
        except FileNotFoundError:
            return  # retired by the writer before this reader opened it
        assert_whole(state)
        assert state["number"] == step

    def write():
        for step in range(1, WRITER_SAVES):
            writer.save(numbered_state(step), step)
        writer.close()

    reads, problems = read_while(write, evaluate)
    evaluator.close()
    assert problems == [] and reads > 0, (reads, problems)


def test_a_checkpoint_replaced_under_its_name_loads_whole(tmp_path):
    """The same step saved over and over (each file renamed over the last, of another size)
    while a reader loads it by name, plainly and with mmap: every load returns one
    whole save: load(mmap=True) maps the very file it checked, whatever the name holds by
    then."""
    writer = AsyncCheckpointer(tmp_path, keep_last=1, _sync=False)
    path = writer.save(numbered_state(0), 1).result()
    mapped = itertools.cycle([False, True])

    def read():
        assert_whole(load(path, mmap=next(mapped)))

    def write():
        for number in range(1, WRITER_SAVES):
            writer.save(numbered_state(number), 1)
        writer.close()

    reads, problems = read_while(write, read)
    assert problems == [] and reads > 0, (reads, problems)


def test_mmap_load_where_no_open_file_has_a_name_reads_the_checked_file(tmp_path, monkeypatch):
    """Mapping by the path could map another file than the one checked: never done."""
    path = tmp_path / "model.pt"
    torch.save(numbered_state(3), path)
    monkeypatch.setattr(checkpoint_reader, "_descriptor_name", lambda file: None)
    with pytest.warns(RuntimeWarning, match="reads the checkpoint into memory"):
        assert_whole(load(path, mmap=True))
