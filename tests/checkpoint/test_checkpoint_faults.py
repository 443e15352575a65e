"""qrnn.checkpoint under failure: full disk, file-size limit, read-only or vanished folder,
an exception inside the writer thread, SIGKILL at random moments, exit without waiting,
and memory over many saves."""

import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest
import torch

from qrnn.checkpoint import AsyncCheckpointer, CheckpointError, load, verify
from qrnn.checkpoint._testing import FaultyCheckpointer

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def temporaries(folder):
    return [n for n in os.listdir(folder) if ".tmp-" in n]


def run_python(script, *args, timeout=120):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def committed_then_failing(folder, fault):
    """Commit step 1 with a healthy checkpointer; return a failing one, step 1's path and digest."""
    good = AsyncCheckpointer(folder, keep_last=3)
    first = good.save({"x": torch.randn(1000)}, 1).result()
    good.close()
    return FaultyCheckpointer(folder, keep_last=3, **fault), first, digest(first)


# ---- injected failures (always available) --------------------------------------------

@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EDQUOT])
def test_injected_write_failure_surfaces_and_keeps_previous(tmp_path, code):
    ckpt, first, before = committed_then_failing(
        tmp_path, {"after_bytes": 100_000, "errno": code})
    handle = ckpt.save({"x": torch.randn(1 << 20)}, 2)  # 4 MB: crosses the injected limit
    with pytest.raises(CheckpointError) as caught:
        handle.result()
    error = caught.value
    assert error.errno == code and error.step == 2 and error.operation == "write"
    assert os.strerror(code) in str(error) and ".tmp-" in error.filename
    assert digest(first) == before and temporaries(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == [".ckpt-writer.lock", "ckpt-000000000001.pt"]
    # Reported once through the handle: the next save goes ahead (and fails the same way).
    second = ckpt.save({"x": torch.randn(1 << 20)}, 3)
    with pytest.raises(CheckpointError):
        ckpt.wait()
    with pytest.raises(CheckpointError):
        second.result()  # a handle always reports its own failure
    ckpt.close()
    assert temporaries(tmp_path) == []


def test_error_raised_by_next_save_wait_and_close(tmp_path):
    ckpt = FaultyCheckpointer(tmp_path, after_bytes=0, errno=errno.ENOSPC)
    ckpt.save({"x": torch.randn(100)}, 1)
    with pytest.raises(CheckpointError, match="No space left") as caught:
        ckpt.save({"x": torch.randn(100)}, 2)  # waits for the slot, reports step 1, still saves step 2
    assert caught.value.step == 1 and caught.value.next_handle.step == 2
    with pytest.raises(CheckpointError, match="ckpt-000000000002"):
        caught.value.next_handle.result()      # the disk is still full
    ckpt.save({"x": torch.randn(100)}, 3)
    with pytest.raises(CheckpointError, match="ckpt-000000000003"):
        ckpt.close()
    ckpt.close()  # idempotent, error already reported
    assert os.listdir(tmp_path) == []


def test_exception_in_writer_thread(tmp_path):
    ckpt, first, before = committed_then_failing(tmp_path, {"after_bytes": 4096, "throw": True})
    ckpt.save({"x": torch.randn(1 << 18)}, 2)
    with pytest.raises(CheckpointError, match="internal error in the writer thread") as caught:
        ckpt.wait()
    assert caught.value.errno == 0
    assert digest(first) == before and temporaries(tmp_path) == []
    ckpt.close()


# ---- real failures ------------------------------------------------------------------

def test_vanished_folder_stays_vanished(tmp_path):
    """The folder is opened once: once it is deleted, saves fail with ENOENT naming it, and a
    folder made again under its name is a new folder this checkpointer never writes into
    (it writes through the folder it opened, never by looking the name up again)."""
    folder = tmp_path / "ckpt"
    ckpt = AsyncCheckpointer(folder)
    ckpt.save({"x": torch.randn(100)}, 1).result()
    shutil.rmtree(folder)
    handle = ckpt.save({"x": torch.randn(100)}, 2)
    with pytest.raises(CheckpointError) as caught:
        handle.result()
    assert caught.value.errno == errno.ENOENT and str(folder) in caught.value.filename
    folder.mkdir()
    with pytest.raises(CheckpointError) as caught:
        ckpt.save({"x": torch.randn(100)}, 3).result()
    assert caught.value.errno == errno.ENOENT and os.listdir(folder) == []
    ckpt.close()
    with AsyncCheckpointer(folder) as fresh:  # a new checkpointer opens the new folder
        assert fresh.save({"x": torch.randn(100)}, 3).result().endswith("ckpt-000000000003.pt")


def test_folder_replaced_by_a_file(tmp_path):
    folder = tmp_path / "ckpt"
    ckpt = AsyncCheckpointer(folder)
    shutil.rmtree(folder)
    folder.write_text("not a folder")
    with pytest.raises(CheckpointError) as caught:
        ckpt.save({"x": torch.randn(100)}, 1)  # its writer lock cannot be had there
        ckpt.wait()
    assert caught.value.errno == errno.ENOENT  # the folder it opened is gone
    assert folder.read_text() == "not a folder"
    ckpt.close()
    with pytest.raises(NotADirectoryError):
        AsyncCheckpointer(folder)


def test_file_size_limit_in_subprocess(tmp_path):
    """RLIMIT_FSIZE with SIGXFSZ at its default (kill): the writer gets EFBIG, the process lives."""
    script = """
    import json, resource, signal, sys, torch
    from qrnn.checkpoint import AsyncCheckpointer, CheckpointError
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # harsher than Python's default (ignored)
    ckpt = AsyncCheckpointer(sys.argv[1], keep_last=3)
    ckpt.save({"x": torch.randn(1000)}, 1).result()
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    big = ckpt.save({"x": torch.randn(1 << 20)}, 2)     # 4 MB > 1 MB
    out = {}
    try:
        ckpt.save({"x": torch.randn(1000)}, 3)          # reports step 2, is still made
    except CheckpointError as e:
        out["next_save"] = [e.errno, e.step]
        out["made"] = e.next_handle.result()
    try:
        big.result()
    except CheckpointError as e:
        out["handle"] = [e.errno, str(e)]
    out["after"] = ckpt.save({"x": torch.randn(1000)}, 4).result()  # small: fits the limit
    ckpt.close()
    print(json.dumps(out))
    """
    result = run_python(script, tmp_path)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["next_save"] == [errno.EFBIG, 2]
    assert out["handle"][0] == errno.EFBIG and "File too large" in out["handle"][1]
    assert out["made"] == str(tmp_path / "ckpt-000000000003.pt")
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000000001.pt", "ckpt-000000000003.pt", "ckpt-000000000004.pt"]
    for name in os.listdir(tmp_path):
        verify(tmp_path / name)


@pytest.fixture
def tmpfs(tmp_path):
    """A small tmpfs of our own (needs root and mount permission; skipped otherwise)."""
    if not IS_ROOT or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def make(size="1m"):
        point = tmp_path / f"mnt{len(mounted)}"
        point.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounted.append(point)
        return point

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def test_full_disk(tmpfs):
    folder = tmpfs("2m")
    ckpt = AsyncCheckpointer(folder, keep_last=3)
    first = ckpt.save({"x": torch.randn(1000)}, 1).result()
    before = digest(first)
    with pytest.raises(CheckpointError) as caught:
        ckpt.save({"x": torch.randn(1 << 20)}, 2).result()  # 4 MB on a 2 MB disk
    assert caught.value.errno == errno.ENOSPC
    assert digest(first) == before and temporaries(folder) == []
    assert ckpt.save({"x": torch.randn(1000)}, 3).result()  # space is back: fine again
    ckpt.close()


def test_full_disk_once_costs_one_checkpoint(tmpfs):
    """A full disk that clears: the save() that reports the failure is still made."""
    folder = tmpfs("3m")
    ckpt = AsyncCheckpointer(folder, keep_last=None)
    ckpt.save({"x": torch.randn(1 << 20)}, 1)  # 4 MB on a 3 MB disk
    with pytest.raises(CheckpointError) as caught:
        ckpt.save({"x": torch.randn(1000)}, 2)
    assert caught.value.errno == errno.ENOSPC and caught.value.step == 1
    assert caught.value.next_handle.result().endswith("ckpt-000000000002.pt")
    ckpt.close()
    assert sorted(os.listdir(folder)) == ["ckpt-000000000002.pt"]


def test_read_only_folder(tmp_path, tmpfs):
    folder = tmpfs("4m")
    ckpt = AsyncCheckpointer(folder)
    first = ckpt.save({"x": torch.randn(1000)}, 1).result()
    before = digest(first)
    r = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot remount read-only: {r.stderr.decode().strip()}")
    ckpt.save({"x": torch.randn(1000)}, 2)
    with pytest.raises(CheckpointError) as caught:
        ckpt.wait()
    assert caught.value.errno == errno.EROFS
    assert digest(first) == before and temporaries(folder) == []
    ckpt.close()


@pytest.mark.skipif(IS_ROOT, reason="permission bits do not stop root (the tmpfs test covers read-only)")
def test_unwritable_folder_without_root(tmp_path):
    folder = tmp_path / "ckpt"
    ckpt = AsyncCheckpointer(folder)
    os.chmod(folder, 0o555)
    try:
        ckpt.save({"x": torch.randn(100)}, 1)
        with pytest.raises(CheckpointError) as caught:
            ckpt.wait()
        assert caught.value.errno == errno.EACCES
    finally:
        os.chmod(folder, 0o755)
        ckpt.close()


# ---- crashes and exit ---------------------------------------------------------------

SAVER = """
import sys, torch
from qrnn.checkpoint import AsyncCheckpointer
ckpt = AsyncCheckpointer(sys.argv[1], keep_last=3)
w = torch.empty(2_000_000)                      # 8 MB
print("ready", flush=True)
for step in range(int(sys.argv[2]), 10**6):
    w.fill_(step)                               # each file must hold only its own step
    ckpt.save({"w": w, "step": torch.tensor(step), "meta": {"step": step}}, step)
"""


def test_sigkill_at_random_moments_leaves_only_complete_files(tmp_path):
    rng = random.Random()
    start = 0
    for _ in range(3):
        child = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path), str(start)], stdout=subprocess.PIPE)
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(rng.uniform(0.05, 0.8))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        finals = [n for n in os.listdir(tmp_path) if not n.startswith(".")]
        for name in finals:  # every final name holds a complete, consistent checkpoint
            path = tmp_path / name
            verify(path)
            state = torch.load(path, weights_only=True)
            step = int(name[len("ckpt-"):-len(".pt")])
            assert state["meta"]["step"] == step and int(state["step"]) == step
            assert bool((state["w"] == step).all())
        steps = [int(n[5:-3]) for n in finals]
        start = max(steps, default=start) + 1
    left = sorted(temporaries(tmp_path))
    ckpt = AsyncCheckpointer(tmp_path)  # readers delete nothing
    latest = ckpt.latest()
    if latest is not None:
        assert load(latest)["meta"]["step"] == max(steps)
    assert sorted(temporaries(tmp_path)) == left
    ckpt.save({"x": torch.zeros(1)}, start).result()  # a writer's first save cleans the dead runs' temporaries
    assert temporaries(tmp_path) == []
    ckpt.close()


def test_unawaited_save_finishes_at_exit(tmp_path):
    script = """
    import sys, torch
    from qrnn.checkpoint import AsyncCheckpointer
    model = torch.nn.Linear(1024, 1024)
    with torch.no_grad():
        model.weight.fill_(0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # never stepped: its first step imports a lot
    ckpt = AsyncCheckpointer(sys.argv[1])
    ckpt.save({"model": model.state_dict(), "optim": opt.state_dict()}, 7, overlap_with=opt)
    dropped = AsyncCheckpointer(sys.argv[1] + "/dropped")
    dropped.save({"x": torch.arange(10)}, 1)
    del dropped                                  # garbage collected: finishes its save too
    # exit without wait() or close()
    """
    result = run_python(script, tmp_path)
    assert result.returncode == 0, result.stderr
    state = load(tmp_path / "ckpt-000000000007.pt")
    assert bool((state["model"]["weight"] == 0.5).all()) and state["model"]["weight"].shape == (1024, 1024)
    assert state["optim"]["param_groups"][0]["lr"] == 0.1
    assert torch.equal(load(tmp_path / "dropped" / "ckpt-000000000001.pt")["x"], torch.arange(10))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_memory_flat_over_100_saves(tmp_path):
    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    state = {"w": torch.randn(1 << 20), "b": torch.randn(1000), "step": torch.tensor(0), "n": [1, 2, "x"]}
    with AsyncCheckpointer(tmp_path, keep_last=2, max_pending=2) as ckpt:
        for step in range(10):
            ckpt.save(state, step)
        ckpt.wait()
        before = rss_mb()
        for step in range(10, 110):
            state["step"] += 1
            ckpt.save(state, step)
        ckpt.wait()
        after = rss_mb()
    assert after - before < 32, f"RSS grew {after - before:.1f} MB over 100 saves of a 4 MB state"
    assert len(os.listdir(tmp_path)) == 2
    assert zipfile.ZipFile(tmp_path / "ckpt-000000000109.pt").testzip() is None


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_first_save_does_not_zero_its_staging_first(tmp_path):
    """The first save's staging image is not written before the copy (no zeroing pass over it
    on the calling thread, which would make the first save of a large state block longer than
    torch.save); the copy itself faults in only what the file needs."""
    from qrnn.checkpoint.staging import StagingSlot

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    slot = StagingSlot()
    before = rss()
    slot.ensure(256 << 20, pinned=False)
    assert slot.capacity >= 256 << 20 and slot.address % 4096 == 0
    assert rss() - before < 16 << 20, "staging memory was touched at allocation"
    state = {"w": torch.ones(16 << 20)}  # 64 MB
    with AsyncCheckpointer(tmp_path) as ckpt:
        before = rss()
        path = ckpt.save(state, 1).result()
        grown = rss() - before
    assert grown < 64e6 * 1.1 + (8 << 20), f"first save grew RSS by {grown / 1e6:.0f} MB for a 64 MB state"
    assert torch.equal(load(path)["w"], state["w"])


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads RSS from /proc")
def test_reserve_faults_staging_in_ahead(tmp_path):
    """reserve(state) puts the staging memory in place before the first save (which then only
    copies); a save racing the background fault-in still holds exactly the saved values."""
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    state = {"w": torch.arange(16 << 20, dtype=torch.float32), "step": 3}  # 64 MB
    with AsyncCheckpointer(tmp_path / "a", max_pending=2) as ckpt:
        before = rss()
        ckpt.reserve(state, wait=True)
        assert rss() - before > 2 * 60e6  # both slots in place
        before = rss()
        path = ckpt.save(state, 1).result()
        assert rss() - before < 16 << 20
        assert torch.equal(load(path)["w"], state["w"])
    with AsyncCheckpointer(tmp_path / "b") as ckpt:
        ckpt.reserve(state)  # not waited for: the save's copy runs beside the fault-in
        path = ckpt.save(state, 2).result()
        assert torch.equal(load(path)["w"], state["w"]) and load(path)["step"] == 3
        with pytest.raises(TypeError):
            ckpt.reserve(state, True)  # wait is keyword-only
