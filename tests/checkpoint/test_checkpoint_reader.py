"""qrnn.checkpoint.CheckpointFolder: a checkpoint folder read without a writer. It lists and
loads what writers committed (never their temporaries), starts no thread, takes no lock, so
neither it nor a writer ever waits for the other, and names a bad argument."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from qrnn import _C
from qrnn.checkpoint import AsyncCheckpointer, CheckpointError, CheckpointFolder


def committed(folder, steps):
    """Saves of `steps`, in this (commit) order, each holding its step."""
    with AsyncCheckpointer(folder, keep_last=None) as writer:
        for step in steps:
            writer.save({"step": step, "x": torch.full((3,), float(step))}, step).result()


def test_lists_and_loads_what_was_committed(tmp_path, monkeypatch):
    committed(tmp_path / "run", [3, 1, 2])
    monkeypatch.chdir(tmp_path)
    reader = CheckpointFolder("run")
    run = str(tmp_path / "run")
    names = [os.path.join(run, f"ckpt-{s:012d}.pt") for s in (3, 1, 2)]
    assert reader.checkpoints() == names  # commit order, absolute paths
    assert reader.checkpoints(order="step") == sorted(names)
    assert reader.steps() == [3, 1, 2] and reader.steps(order="step") == [1, 2, 3]
    assert reader.latest() == names[-1] and reader.latest(order="step") == names[0]
    assert reader.load()["step"] == 2
    assert reader.load(1)["step"] == 1
    assert torch.equal(reader.load(3, map_location="cpu", mmap=True)["x"], torch.full((3,), 3.0))
    with AsyncCheckpointer(run) as writer:  # the writer lists through the same rules
        assert writer.checkpoints() == reader.checkpoints() and writer.latest() == reader.latest()
        assert writer.latest(order="step") == reader.latest(order="step")
    monkeypatch.chdir(tmp_path / "run")
    assert reader.latest() == names[-1]  # opened once: a chdir changes nothing


def test_other_prefix_and_suffix(tmp_path):
    committed(tmp_path, [5])
    folder = _C.CheckpointFolder(str(tmp_path))
    folder.write_file(_C.checkpoint_file_name("eval-", 7, ".bin"), b"x")
    assert CheckpointFolder(tmp_path, prefix="eval-", suffix=".bin").steps() == [7]
    assert CheckpointFolder(tmp_path).steps() == [5]
    assert CheckpointFolder(tmp_path, prefix="other-").latest() is None


def test_an_empty_folder(tmp_path):
    reader = CheckpointFolder(tmp_path)
    assert reader.checkpoints() == [] and reader.steps() == [] and reader.latest() is None
    with pytest.raises(FileNotFoundError, match="has no checkpoint"):
        reader.load()
    with pytest.raises(FileNotFoundError):
        reader.load(4)


def test_temporaries_and_other_files_are_neither_listed_nor_deleted(tmp_path):
    committed(tmp_path, [1, 2])
    folder = _C.CheckpointFolder(str(tmp_path))
    live_fd, live = folder.create_temporary("ckpt-000000000009.pt")  # a save in progress: locked
    os.write(live_fd, b"partial")
    dead = ".ckpt-000000000008.pt.tmp-123-0123456789abcdef"  # its writer is gone
    (tmp_path / dead).write_bytes(b"partial")
    (tmp_path / "ckpt-000000000007.pt").symlink_to(tmp_path / "ckpt-000000000001.pt")
    (tmp_path / "ckpt-000000000006.pt").mkdir()
    (tmp_path / "ckpt-0000000x0005.pt").write_bytes(b"not a step")
    before = sorted(os.listdir(tmp_path))
    reader = CheckpointFolder(tmp_path)
    assert reader.steps() == [1, 2] and reader.latest(order="step").endswith("ckpt-000000000002.pt")
    assert reader.load()["step"] == 2
    assert sorted(os.listdir(tmp_path)) == before
    os.close(live_fd)


def test_starts_no_thread(tmp_path):
    """Counted by Python (threading) and by the kernel (/proc/self/task: C++ threads too), in
    a fresh interpreter where nothing else starts or ends threads; an AsyncCheckpointer, by
    contrast, starts its writer's threads."""
    committed(tmp_path, [1, 2])
    script = """
        import os, sys, threading
        import torch
        from qrnn.checkpoint import AsyncCheckpointer, CheckpointFolder, load
        folder = sys.argv[1]

        def threads():
            tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
            return threading.active_count(), tasks

        load(os.path.join(folder, "ckpt-000000000001.pt"))  # torch's own first-use set-up
        before = threads()
        reader = CheckpointFolder(folder)
        reader.checkpoints(); reader.checkpoints(order="step"); reader.steps(); reader.latest()
        reader.load(); reader.load(1, mmap=True)
        print(before == threads(), before, threads())
        with AsyncCheckpointer(folder) as writer:
            print(threads()[1] is None or threads()[1] >= before[1] + 2, writer.latest() == reader.latest())
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(tmp_path)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    reader_line, writer_line = result.stdout.splitlines()
    assert reader_line.startswith("True"), reader_line
    assert writer_line == "True True", writer_line


def test_takes_no_lock_so_neither_waits_for_a_writer(tmp_path):
    committed(tmp_path, [1])
    reader = CheckpointFolder(tmp_path)
    assert reader.latest() is not None and not any("lock" in name for name in os.listdir(tmp_path))
    with AsyncCheckpointer(tmp_path) as writer:  # the reader is open and has listed: the lock is free
        writer.lock()
        writer.save({"step": 2}, 2).result()
        assert reader.steps() == [1, 2] and reader.load()["step"] == 2  # the writer holds the lock
        with pytest.raises(CheckpointError, match="already has a writer"):
            AsyncCheckpointer(tmp_path).lock()  # the lock is real: a second writer is refused
        assert CheckpointFolder(tmp_path).steps() == [1, 2]  # a new reader is not
    with AsyncCheckpointer(tmp_path) as writer:
        writer.lock()  # released by the first writer; the reader never held it
        writer.save({"step": 3}, 3).result()
    assert reader.steps() == [1, 2, 3]


@pytest.mark.parametrize("call, error, name", [
    (lambda p: CheckpointFolder(123), TypeError, "directory"),
    (lambda p: CheckpointFolder(os.fsencode(p)), TypeError, "directory"),
    (lambda p: CheckpointFolder(p, prefix=3), TypeError, "prefix"),
    (lambda p: CheckpointFolder(p, prefix=""), ValueError, "prefix"),
    (lambda p: CheckpointFolder(p, prefix=".hidden-"), ValueError, "prefix"),
    (lambda p: CheckpointFolder(p, prefix="a/b-"), ValueError, "prefix"),
    (lambda p: CheckpointFolder(p, suffix=None), TypeError, "suffix"),
    (lambda p: CheckpointFolder(p, suffix="/x.pt"), ValueError, "suffix"),
    (lambda p: CheckpointFolder(p, "ckpt-"), TypeError, "positional"),
    (lambda p: CheckpointFolder(p).checkpoints(order="newest"), ValueError, "order"),
    (lambda p: CheckpointFolder(p).latest(order=None), ValueError, "order"),
    (lambda p: CheckpointFolder(p).steps(order="time"), ValueError, "order"),
    (lambda p: CheckpointFolder(p).load(-1), ValueError, "step"),
    (lambda p: CheckpointFolder(p).load("1"), TypeError, "step"),
    (lambda p: CheckpointFolder(p).load(True), TypeError, "step"),
])
def test_bad_arguments_are_named(tmp_path, call, error, name):
    with pytest.raises(error, match=name):
        call(tmp_path)


def test_a_folder_that_cannot_be_opened(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        CheckpointFolder(tmp_path / "missing")
    assert not (tmp_path / "missing").exists()  # a reader creates nothing
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        CheckpointFolder(tmp_path / "file")
