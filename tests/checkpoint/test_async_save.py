"""qrnn.checkpoint.async_save: torch.save's file, in the background, crash-safe, one writer
per process, failures reported like AsyncCheckpointer's."""

import errno
import hashlib
import io
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import qrnn.checkpoint as checkpoint
from qrnn.checkpoint import CheckpointError, async_save, wait_all
from qrnn.checkpoint._testing import faulty_async_save
from qrnn.checkpoint.saver import FOLDERS_KEPT, saver


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def temporaries(folder):
    return [n for n in os.listdir(folder) if ".tmp-" in n]


def assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def state():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16))
    base = torch.arange(24, dtype=torch.float64)
    return {"model": model.state_dict(), "epoch": 3, "name": "run", "ints": torch.arange(5),
            "half": torch.randn(4, 4).half(), "mask": torch.rand(7) > 0.5, "view": base[4:10], "base": base,
            "list": [torch.ones(2), (1.5, None)]}


@pytest.mark.parametrize("kind", [str, pathlib.Path])
def test_loads_with_plain_torch_load_as_torch_save_writes(tmp_path, kind):
    obj = state()
    handle = async_save(obj, kind(tmp_path / "a.pt"))
    assert handle.result() == str(tmp_path / "a.pt") and handle.step is None and handle.wait()
    torch.save(obj, tmp_path / "reference.pt")
    loaded = torch.load(tmp_path / "a.pt", weights_only=True)
    assert_same(obj, loaded)
    assert_same(torch.load(tmp_path / "reference.pt", weights_only=True), loaded)
    assert loaded["view"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    assert checkpoint.verify(str(tmp_path / "a.pt")) is None
    assert temporaries(tmp_path) == []


def test_relative_path_is_the_folder_at_call_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    handle = async_save({"x": torch.arange(3)}, "rel.pt")
    monkeypatch.chdir("/")
    assert handle.result() == str(tmp_path / "rel.pt")
    assert torch.equal(torch.load(tmp_path / "rel.pt", weights_only=True)["x"], torch.arange(3))


def test_file_object_is_a_clear_type_error(tmp_path):
    with pytest.raises(TypeError, match="use torch.save"):
        async_save({"x": torch.ones(1)}, io.BytesIO())
    with open(tmp_path / "f.pt", "wb") as file, pytest.raises(TypeError, match="BufferedWriter"):
        async_save({"x": torch.ones(1)}, file)


@pytest.mark.parametrize("kwargs", [{"pickle_protocol": 4}, {"pickle_module": object()},
                                    {"_use_new_zipfile_serialization": False}, {"_disable_byteorder_record": True}])
def test_torch_save_options_it_cannot_honour_are_refused(tmp_path, kwargs):
    with pytest.raises(ValueError):
        async_save({"x": torch.ones(1)}, tmp_path / "a.pt", **kwargs)
    assert not (tmp_path / "a.pt").exists()


def test_missing_folder_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError) as caught:
        async_save({"x": torch.ones(1)}, tmp_path / "missing" / "a.pt")
    assert caught.value.errno == errno.ENOENT


def test_snapshot_taken_when_it_returns(tmp_path):
    weight = torch.randn(1 << 20)
    expected = weight.clone()
    counter = torch.zeros((), dtype=torch.int64)
    handle = async_save({"w": weight, "step": counter}, tmp_path / "snap.pt")
    weight.add_(1.0)   # training goes on at once
    counter += 5
    handle.result()
    loaded = torch.load(tmp_path / "snap.pt", weights_only=True)
    assert torch.equal(loaded["w"], expected) and int(loaded["step"]) == 0


def test_later_save_to_the_same_path_wins(tmp_path):
    path = tmp_path / "same.pt"
    handles = []
    for i, n in enumerate([1 << 22, 10, 1 << 20, 1 << 21, 3]):  # big ones first: slower writes
        handles.append(async_save({"i": i, "x": torch.full((n,), float(i))}, path))
    wait_all()
    assert all(h.done() for h in handles)
    loaded = torch.load(path, weights_only=True)
    assert loaded["i"] == 4 and torch.equal(loaded["x"], torch.full((3,), 4.0))
    assert temporaries(tmp_path) == []


def _threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_one_writer_per_process(tmp_path):
    async_save({"x": torch.ones(10)}, tmp_path / "first.pt").result()
    writer, threads = saver(), _threads()
    for i in range(20):
        async_save({"x": torch.full((1000,), float(i))}, tmp_path / f"f{i}.pt")
    wait_all()
    assert saver() is writer and _threads() == threads  # no threads per call
    assert torch.equal(torch.load(tmp_path / "f19.pt", weights_only=True)["x"], torch.full((1000,), 19.0))


def test_failed_replace_keeps_the_old_file(tmp_path):
    path = tmp_path / "model.pt"
    async_save({"x": torch.zeros(10)}, path).result()
    before = digest(path)
    with faulty_async_save(after_bytes=100_000, errno=errno.ENOSPC):
        handle = async_save({"x": torch.randn(1 << 20)}, path)  # 4 MB: crosses the injected limit
        with pytest.raises(CheckpointError) as caught:
            handle.result()
        assert caught.value.errno == errno.ENOSPC and caught.value.step is None
        assert ".tmp-" in caught.value.filename
    assert digest(path) == before and temporaries(tmp_path) == []
    assert torch.equal(torch.load(path, weights_only=True)["x"], torch.zeros(10))


def test_failure_reported_by_the_next_save_and_by_wait_all(tmp_path):
    with faulty_async_save(after_bytes=0, errno=errno.EIO, times=1):
        assert async_save({"x": torch.ones(100)}, tmp_path / "lost.pt").wait()  # failed, nobody told
        with pytest.raises(CheckpointError, match="lost.pt") as caught:
            async_save({"x": torch.ones(100)}, tmp_path / "kept.pt")  # reports the first, still saves
        assert caught.value.next_handle.result() == str(tmp_path / "kept.pt")
        wait_all()  # reported once: nothing left to raise
        async_save({"x": torch.ones(100)}, tmp_path / "ok.pt")
    with faulty_async_save(after_bytes=0, errno=errno.EIO):
        async_save({"x": torch.ones(100)}, tmp_path / "again.pt")
        with pytest.raises(CheckpointError, match="again.pt"):
            wait_all()
        wait_all()
    assert sorted(os.listdir(tmp_path)) == ["kept.pt", "ok.pt"]


def test_unawaited_saves_finish_at_exit(tmp_path):
    script = """
    import sys, torch
    from qrnn.checkpoint import async_save
    weight = torch.full((1 << 22,), 0.5)
    async_save({"w": weight}, sys.argv[1] + "/exit.pt")
    async_save({"w": weight[:10]}, sys.argv[1] + "/small.pt")
    # exit without wait_all()
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(tmp_path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert bool((torch.load(tmp_path / "exit.pt", weights_only=True)["w"] == 0.5).all())
    assert torch.load(tmp_path / "small.pt", weights_only=True)["w"].shape == (10,)
    assert temporaries(tmp_path) == []


def test_failure_at_exit_is_reported(tmp_path):
    script = """
    import errno, sys, torch
    from qrnn.checkpoint import async_save
    from qrnn.checkpoint._testing import FaultyFileSaver
    from qrnn.checkpoint.saver import use_saver
    use_saver(FaultyFileSaver(after_bytes=0, errno=errno.ENOSPC))
    async_save({"w": torch.ones(10)}, sys.argv[1] + "/full.pt")
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script), str(tmp_path)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "a save failed before exit" in result.stderr and "full.pt" in result.stderr
    assert os.listdir(tmp_path) == []


def run_in_child(child) -> None:
    """Run `child()` in a forked child, which never returns into pytest: it must return True."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if child() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_saves_with_its_own_writer(tmp_path):
    parent = async_save({"x": torch.ones(1 << 20)}, tmp_path / "parent.pt")

    def child() -> bool:
        try:
            parent.wait()
        except RuntimeError:  # the parent's save: its outcome is known only there
            async_save({"x": torch.arange(4)}, tmp_path / "child.pt").result()
            return True
        return False

    run_in_child(child)
    parent.result()
    assert torch.equal(torch.load(tmp_path / "child.pt", weights_only=True)["x"], torch.arange(4))
    assert torch.load(tmp_path / "parent.pt", weights_only=True)["x"].shape == (1 << 20,)


def test_saves_into_one_folder_reuse_its_opened_folder(tmp_path):
    async_save({"x": torch.ones(3)}, tmp_path / "a.pt").result()
    opened = saver()._folders[str(tmp_path)]
    async_save({"x": torch.ones(4)}, tmp_path / "b.pt").result()
    async_save({"x": torch.ones(5)}, tmp_path / "a.pt").result()
    assert saver()._folders[str(tmp_path)] is opened
    assert torch.load(tmp_path / "a.pt", weights_only=True)["x"].shape == (5,)


@pytest.mark.parametrize("how", ["deleted", "renamed", "linked"])
def test_a_folder_replaced_under_its_name_gets_the_next_file(tmp_path, how):
    """Each save goes to the folder its path names when it is called: one deleted and made
    again, renamed away (its old files stay there) or swapped for a link is opened anew."""
    run = tmp_path / "run"
    run.mkdir()
    async_save({"x": torch.zeros(2)}, run / "state.pt").result()
    if how == "deleted":
        shutil.rmtree(run)
        run.mkdir()
    elif how == "renamed":
        run.rename(tmp_path / "old")
        run.mkdir()
    else:
        run.rename(tmp_path / "old")
        (tmp_path / "elsewhere").mkdir()
        run.symlink_to(tmp_path / "elsewhere")
    async_save({"x": torch.ones(2)}, run / "state.pt").result()
    assert torch.equal(torch.load(run / "state.pt", weights_only=True)["x"], torch.ones(2))
    if how != "deleted":
        assert torch.equal(torch.load(tmp_path / "old" / "state.pt", weights_only=True)["x"], torch.zeros(2))


def test_opened_folders_kept_are_bounded(tmp_path):
    for k in range(FOLDERS_KEPT + 3):
        (tmp_path / str(k)).mkdir()
        async_save({"k": k}, tmp_path / str(k) / "state.pt")
    wait_all()
    kept = saver()._folders
    assert len(kept) == FOLDERS_KEPT and str(tmp_path / str(FOLDERS_KEPT + 2)) in kept
    assert str(tmp_path / "0") not in kept  # the least recently used went first


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_opens_its_own_folders(tmp_path):
    async_save({"x": torch.ones(1)}, tmp_path / "parent.pt").result()
    assert str(tmp_path) in saver()._folders

    def child() -> bool:
        if saver()._folders:  # the parent's open folders are not the child's
            return False
        async_save({"x": torch.arange(3)}, tmp_path / "child.pt").result()
        return True

    run_in_child(child)
    assert torch.equal(torch.load(tmp_path / "child.pt", weights_only=True)["x"], torch.arange(3))
    async_save({"x": torch.zeros(1)}, tmp_path / "parent.pt").result()  # the parent's folder still serves
