"""qrnn.checkpoint in shared folders and under limits: planted links, a folder swapped or a
chdir after it was opened, private files, two writers on one folder, a folder fsync the file
system refuses, the range of steps, and a staging image that memory limits forbid."""

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from cgroups import memory_cgroup
from qrnn import _C
from qrnn.checkpoint import AsyncCheckpointer, CheckpointError, async_save, load
from qrnn.checkpoint._testing import FaultyCheckpointer, faulty_async_save


def files(folder):
    return sorted(os.listdir(folder))


def run_python(script, *args, timeout=180, preexec_fn=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=preexec_fn)


# ---- 1. nothing redirected ------------------------------------------------------------

@pytest.mark.parametrize("name", ["metrics.jsonl", "loss.png", "best.pt", "best.pt.tmp", "ckpt-000000000002.pt"])
def test_links_planted_in_the_folder_are_replaced_never_followed(tmp_path, name):
    """A link planted under any name the run writes (metrics.jsonl, loss.png, best.pt, a
    checkpoint) is replaced, never followed, and best.pt.tmp, a name the writer never uses, is
    left alone: the link's target is never written."""
    run, target = tmp_path / "run", tmp_path / "precious"
    run.mkdir()
    target.write_bytes(b"precious")
    (run / name).symlink_to(target)
    with AsyncCheckpointer(run) as ckpt:
        ckpt.save({"x": torch.ones(3)}, 1).result()
        if name.startswith("ckpt-"):
            ckpt.save({"x": torch.ones(3)}, 2).result()
        elif name == "best.pt":
            ckpt.publish(1, name)
        elif name == "best.pt.tmp":  # a plausible fixed temporary name: promotion uses hidden, unique ones
            ckpt.publish(1, "best.pt")
        else:
            ckpt.write_file(name, b"new")
    assert target.read_bytes() == b"precious"
    if name != "best.pt.tmp":
        assert not (run / name).is_symlink()
    assert {p.name for p in run.iterdir() if ".tmp-" in p.name} == set()


def test_publish_links_the_committed_file_and_rejects_what_is_not_its(tmp_path):
    with AsyncCheckpointer(tmp_path, keep_last=1) as ckpt:
        first = ckpt.save({"x": torch.ones(3)}, 1).result()
        assert ckpt.publish(first, "best.pt") == str(tmp_path / "best.pt")
        assert os.stat(tmp_path / "best.pt").st_ino == os.stat(first).st_ino  # a hard link, no copy
        ckpt.save({"x": torch.zeros(3)}, 2).result()  # retention deletes step 1; best.pt stays
        assert torch.equal(load(tmp_path / "best.pt")["x"], torch.ones(3))
        for bad in ["ckpt-000000000003.pt", ".ckpt-000000000003.pt.tmp-1-0123456789abcdef", "../x", "", "a/b"]:
            with pytest.raises(ValueError, match="name"):
                ckpt.write_file(bad, b"")
        with pytest.raises(ValueError, match="not a file of"):
            ckpt.publish(tmp_path.parent / "elsewhere.pt", "best.pt")
        with pytest.raises(CheckpointError, match="ckpt-000000000001.pt"):
            ckpt.publish(1, "best.pt")  # deleted by retention


def test_folder_swapped_for_a_link_after_opening_redirects_nothing(tmp_path):
    """The folder renamed and a link to another folder put under its name after opening:
    saves and retention stay in the opened folder and delete nothing of the other."""
    run, other = tmp_path / "run", tmp_path / "other"
    other.mkdir()
    for step in (100, 101):
        torch.save({"other": step}, other / f"ckpt-{step:012d}.pt")
    with AsyncCheckpointer(run, keep_last=1) as ckpt:
        ckpt.save({"x": torch.ones(3)}, 1).result()
        run.rename(tmp_path / "moved")
        run.symlink_to(other, target_is_directory=True)
        ckpt.save({"x": torch.ones(3)}, 2).result()
        ckpt.save({"x": torch.ones(3)}, 3).result()
        assert [os.path.basename(p) for p in ckpt.checkpoints()] == ["ckpt-000000000003.pt"]
    assert files(other) == ["ckpt-000000000100.pt", "ckpt-000000000101.pt"]
    assert files(tmp_path / "moved") == ["ckpt-000000000003.pt"]


def test_chdir_after_opening_a_relative_folder(tmp_path, monkeypatch):
    """A relative folder is resolved once, when opened: after a chdir, saves, files and
    latest() still use that folder, not one under the new working folder."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    with AsyncCheckpointer("run", keep_last=2) as ckpt:
        ckpt.save({"x": torch.ones(3)}, 1).result()
        os.chdir(tmp_path / "b")
        path = ckpt.save({"x": torch.ones(3)}, 2).result()
        assert path == str(tmp_path / "a" / "run" / "ckpt-000000000002.pt")
        ckpt.write_file("metrics.jsonl", b"{}\n")
        assert ckpt.latest() == path
    assert files(tmp_path / "a" / "run") == ["ckpt-000000000001.pt", "ckpt-000000000002.pt", "metrics.jsonl"]
    assert files(tmp_path / "b") == []


def test_new_folders_and_their_parents_are_made(tmp_path):
    with AsyncCheckpointer(tmp_path / "a" / "b" / "c") as ckpt:
        ckpt.save({"x": 1}, 0).result()
    assert files(tmp_path / "a" / "b" / "c") == ["ckpt-000000000000.pt"]


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to see the fsyncs")
def test_parents_of_new_folders_are_fsynced(tmp_path):
    """Each folder the checkpointer creates is made durable by an fsync of its parent, so a
    crash cannot lose the folder with the checkpoints in it."""
    new = tmp_path / "a" / "b" / "c"
    script = f"from qrnn.checkpoint import AsyncCheckpointer; AsyncCheckpointer({str(new)!r}).close()"
    trace = subprocess.run(["strace", "-f", "-qq", "-e", "trace=mkdir,mkdirat,open,openat,fsync", sys.executable, "-c",
                            script], capture_output=True, text=True, timeout=120)
    if trace.returncode != 0 and "ptrace" in trace.stderr:
        pytest.skip(f"strace cannot trace here: {trace.stderr.strip()[:200]}")
    assert trace.returncode == 0, trace.stderr[-2000:]
    made = re.findall(r'mkdir(?:at\(AT_FDCWD, |\()"([^"]+)", [0-7]+\)\s+= 0', trace.stderr)
    assert made == [str(tmp_path / "a"), str(tmp_path / "a" / "b"), str(new)], made
    for folder in made:
        parent = re.escape(os.path.dirname(folder))
        opened = re.search(rf'open(?:at\(AT_FDCWD, |\()"{parent}", [^)]*O_DIRECTORY[^)]*\)\s+= (\d+)'
                           rf'(?s:.*?)fsync\(\1\)\s+= 0', trace.stderr.split(f'"{folder}"', 1)[1])
        assert opened, f"the parent of {folder} was not fsynced after it was made"


def test_private_files_are_0600_and_default_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with AsyncCheckpointer(tmp_path / "private", private=True) as ckpt:
            ckpt.save({"x": 1}, 1).result()
            ckpt.write_file("metrics.jsonl", b"{}")
        with AsyncCheckpointer(tmp_path / "shared") as ckpt:
            ckpt.save({"x": 1}, 1).result()
            ckpt.write_file("metrics.jsonl", b"{}")
    finally:
        os.umask(old)
    for name in ("ckpt-000000000001.pt", "metrics.jsonl"):
        assert stat.S_IMODE(os.stat(tmp_path / "private" / name).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "shared" / name).st_mode) == 0o644


# ---- 4. sharing: one writer per folder and prefix -------------------------------------

WRITER = """
import sys, time, torch
from qrnn.checkpoint import AsyncCheckpointer
ckpt = AsyncCheckpointer(sys.argv[1], keep_last=2)
ckpt.save({"x": torch.ones(3)}, 1).result()
print("ready", flush=True)
sys.stdin.readline()
ckpt.close()
"""


def test_a_second_writer_gets_an_error_naming_the_holder(tmp_path):
    """One writer per folder and prefix: a second one's save fails with EBUSY naming the
    holder's pid, so two writers never delete each other's newest checkpoints or overwrite
    equal steps; readers take no lock."""
    holder = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        reader = AsyncCheckpointer(tmp_path)  # readers take no lock
        assert reader.latest().endswith("ckpt-000000000001.pt")
        with pytest.raises(CheckpointError) as caught:
            reader.save({"x": torch.zeros(3)}, 1)
        assert caught.value.errno == errno.EBUSY and f"pid {holder.pid}" in str(caught.value)
        with pytest.raises(CheckpointError, match="already has a writer"):
            reader.write_file("metrics.jsonl", b"")
        with AsyncCheckpointer(tmp_path, prefix="eval-") as other:  # another prefix: another writer
            other.save({"x": 1}, 1).result()
        reader.close()
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    assert torch.equal(load(tmp_path / "ckpt-000000000001.pt")["x"], torch.ones(3))  # never overwritten
    with AsyncCheckpointer(tmp_path) as next_writer:  # the lock went with its holder
        next_writer.save({"x": torch.zeros(3)}, 2).result()
    assert ".ckpt-writer.lock" not in files(tmp_path)


def test_the_lock_is_per_checkpointer_within_a_process_too(tmp_path):
    with AsyncCheckpointer(tmp_path) as first:
        first.save({"x": 1}, 1).result()
        with pytest.raises(CheckpointError, match=f"pid {os.getpid()}"):
            AsyncCheckpointer(tmp_path).save({"x": 1}, 2)
    with AsyncCheckpointer(tmp_path) as second:
        second.save({"x": 1}, 2).result()


def test_lock_takes_the_writer_lock_before_any_write(tmp_path):
    """lock() takes the folder's writer lock at once, so that a program refuses a second
    writer at start-up rather than at its first save; close() lets it go."""
    with AsyncCheckpointer(tmp_path) as first:
        first.lock()
        first.lock()  # idempotent
        with AsyncCheckpointer(tmp_path) as other, pytest.raises(CheckpointError) as caught:
            other.lock()
        assert caught.value.errno == errno.EBUSY and caught.value.operation == "lock"
        assert f"pid {os.getpid()}" in str(caught.value)
        first.save({"x": 1}, 1).result()
    with AsyncCheckpointer(tmp_path) as second:
        second.lock()


# ---- 4. durability: a folder the file system cannot fsync ------------------------------

def checkpoint_warnings(caught) -> list:
    return [str(w.message) for w in caught if str(w.message).startswith("qrnn.checkpoint:")]


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EROFS, errno.EOPNOTSUPP])
def test_refused_folder_fsync_keeps_last_and_warns_once(tmp_path, code):
    """Network and FUSE file systems refuse to fsync a folder. Each file is still fsynced
    before its rename, keep_last still bounds the disk, and one warning says a crash may lose
    the latest rename; EOPNOTSUPP is treated like the others and fails no save."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with FaultyCheckpointer(tmp_path, keep_last=2, folder_sync_errno=code) as ckpt:
            for step in range(6):
                ckpt.save({"x": step}, step).result()
    assert files(tmp_path) == ["ckpt-000000000004.pt", "ckpt-000000000005.pt"]
    notes = checkpoint_warnings(caught)
    assert len(notes) == 1 and "cannot be fsynced" in notes[0] and "crash" in notes[0], notes
    assert os.strerror(code) in notes[0] and str(tmp_path) in notes[0]


def test_refused_folder_fsync_warns_async_save_once(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with faulty_async_save(folder_sync_errno=errno.EINVAL):
            for number in range(4):
                async_save({"x": number}, tmp_path / "model.pt").result()
    assert load(tmp_path / "model.pt") == {"x": 3}
    notes = checkpoint_warnings(caught)
    assert len(notes) == 1 and "cannot be fsynced" in notes[0], notes


# ---- 4. steps -----------------------------------------------------------------------

@pytest.mark.parametrize("step, error", [(True, TypeError), (False, TypeError), (2**63, ValueError),
                                         (2**64, ValueError), (2**64 - 6, ValueError), (-1, ValueError),
                                         (1.0, TypeError)])
def test_steps_out_of_range_are_named(tmp_path, step, error):
    """A step that is a bool or not an int (TypeError), or outside 0..2**63-1 (ValueError), is
    refused with an error naming ``step`` by save() and publish(), and nothing is written."""
    with AsyncCheckpointer(tmp_path) as ckpt:
        with pytest.raises(error, match="step"):
            ckpt.save({"x": 1}, step)
        with pytest.raises(error, match="step"):
            ckpt.publish(step, "best.pt")
    assert files(tmp_path) == []


def test_the_largest_step_is_listed_and_deleted(tmp_path):
    with AsyncCheckpointer(tmp_path, keep_last=1) as ckpt:
        top = ckpt.save({"x": 1}, 2**63 - 1).result()
        assert ckpt.latest() == top and _C.checkpoint_parse_name(os.path.basename(top), "ckpt-", ".pt") == 2**63 - 1
        ckpt.save({"x": 2}, 0).result()
    assert files(tmp_path) == ["ckpt-000000000000.pt"]
    assert _C.checkpoint_parse_name("ckpt-18446744073709551615.pt", "ckpt-", ".pt") == 2**64 - 1
    assert _C.checkpoint_parse_name("ckpt-18446744073709551616.pt", "ckpt-", ".pt") is None


# ---- 3. memory ------------------------------------------------------------------------

LIMITED_SAVER = """
import json, resource, sys, warnings, torch
from qrnn.checkpoint import AsyncCheckpointer, load
w = torch.arange(float(sys.argv[2]) * 2**20 / 4)          # MiB of float32
ckpt = AsyncCheckpointer(sys.argv[1], keep_last=1)
ckpt.save({"w": w[:10].clone(), "n": 0}, 0).result()       # small: fits any limit
if sys.argv[3] == "as":                                    # address space for w once more, not twice
    size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size + w.nbytes // 2, resource.RLIM_INFINITY))
else:  # our memory cgroup: room for 0.6x w beyond what it holds now that is not page cache
    for line in open("/proc/self/cgroup").read().splitlines():
        _, controllers, path = line.split(":", 2)
        v1 = "memory" in controllers.split(",")
        if v1 or (controllers == "" and sys.argv[3] == "cgroup2"):
            break
    folder = ("/sys/fs/cgroup/memory" if v1 else "/sys/fs/cgroup") + path
    usage = int(open(folder + ("/memory.usage_in_bytes" if v1 else "/memory.current")).read())
    stat = dict(line.split() for line in open(folder + "/memory.stat"))
    cache = int(stat["total_inactive_file" if v1 else "inactive_file"])
    with open(folder + ("/memory.limit_in_bytes" if v1 else "/memory.max"), "w") as f:
        f.write(str(usage - cache + int(w.nbytes * 0.6)))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    path = ckpt.save({"w": w, "n": 1}, 1).result()
    ckpt.close()
print("saved", file=sys.stderr, flush=True)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
state = load(path, mmap=True)  # no second copy in memory
print(json.dumps({"equal": bool(torch.equal(state["w"], w)), "n": state["n"],
                  "warnings": [str(x.message) for x in caught]}))
"""


def check_limited_save(result):
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["equal"] and out["n"] == 1
    assert any("written from the live tensors" in w for w in out["warnings"]), out["warnings"]
    return out


def test_save_under_an_address_space_limit_falls_back(tmp_path):
    """RLIMIT_AS with room for the state but not for its staging image: save() warns that the
    image could not be allocated and writes from the live tensors instead."""
    out = check_limited_save(run_python(LIMITED_SAVER, tmp_path, 200, "as"))
    assert any("could not be allocated" in w for w in out["warnings"])
    assert files(tmp_path) == ["ckpt-000000000001.pt"]


def test_save_in_a_memory_cgroup_falls_back_instead_of_being_killed(tmp_path):
    """A cgroup where the process holds a 300 MB state but not a second copy: a staging image
    would fit the address space but its pages not the cgroup, so save() checks the cgroup's
    room first and writes from the live tensors rather than being OOM-killed."""
    procs, cleanup, version = memory_cgroup(4 * 2**30)  # the saver lowers it to the state, not twice
    try:
        def join():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        result = run_python(LIMITED_SAVER, tmp_path, 300, version, preexec_fn=join)
        assert result.returncode != -9, f"OOM-killed: {result.stderr[-2000:]}"  # "saved" there: after save()
        check_limited_save(result)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)  # its page cache is charged to the cgroup
        cleanup()
