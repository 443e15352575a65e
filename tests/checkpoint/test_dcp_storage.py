"""qrnn.checkpoint.dcp in one process: the files DCP's own reader loads, DCP's files our
reader loads, values at the moment of the call, step folders (latest, keep_last, overwrite),
the commit order and fsyncs seen by strace, memory over 50 saves, and the refusal of
damaged or hostile folders (one line, nothing loaded, no hang)."""

import io
import os
import pickle
import re
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed")

if dist.is_available():
    import torch.distributed.checkpoint as dcp

    from qrnn.checkpoint import CorruptCheckpointError, UnsafeCheckpointError
    from qrnn.checkpoint import dcp as qdcp


@pytest.fixture(autouse=True)
def _quiet_single_process_dcp():
    with warnings.catch_warnings():  # DCP's note that it runs without a process group
        warnings.filterwarnings("ignore", "torch.distributed is (disabled|unavailable)", UserWarning)
        yield


def sample_state() -> dict:
    return {
        "f32": torch.randn(5, 7),
        "bf16": torch.randn(3, 4).to(torch.bfloat16),
        "i64": torch.arange(11),
        "flags": torch.rand(6) > 0.5,
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3),
        "strided": torch.randn(6, 4).t(),  # not contiguous
        "view": torch.randn(100)[10:30],   # a slice of a larger storage
        "extra": {"step": 7, "names": ["a", "b"], "lr": 0.25},
    }


def empty_like_state(state: dict) -> dict:
    out = {k: torch.full_like(v, 0) if isinstance(v, torch.Tensor) else None for k, v in state.items()}
    out["extra"] = {"step": None, "names": None, "lr": None}
    return out


def assert_state_equal(got: dict, want: dict) -> None:
    for name, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
        else:
            assert got[name] == value, name


def test_dcp_own_reader_loads_our_files_and_ours_loads_dcps(tmp_path):
    state = sample_state()
    ours = qdcp.save(state, checkpoint_id=tmp_path / "ours")
    assert sorted(os.listdir(ours)) == [".metadata", "__0_0.distcp"]
    loaded = empty_like_state(state)
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(ours))  # DCP's own reader
    assert_state_equal(loaded, state)

    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "theirs"))
    loaded = empty_like_state(state)
    qdcp.load(loaded, checkpoint_id=tmp_path / "theirs")
    assert_state_equal(loaded, state)


def test_dcp_save_with_our_writer(tmp_path):
    """The writer meets DCP's StorageWriter interface: DCP's own save drives it."""
    state = sample_state()
    dcp.save(state, storage_writer=qdcp.QRNNStorageWriter(tmp_path / "ckpt"))
    loaded = empty_like_state(state)
    dcp.load(loaded, checkpoint_id=tmp_path / "ckpt")
    assert_state_equal(loaded, state)


def test_every_item_is_a_torch_save_archive_that_plain_torch_load_reads(tmp_path):
    import zipfile
    state = sample_state()
    folder = qdcp.save(state, checkpoint_id=tmp_path / "ckpt")
    meta = qdcp.QRNNStorageReader(folder).read_metadata()
    data = open(os.path.join(folder, "__0_0.distcp"), "rb").read()
    for index, info in meta.storage_data.items():
        piece = data[info.offset:info.offset + info.length]
        if isinstance(state.get(index.fqn), torch.Tensor):
            assert zipfile.ZipFile(io.BytesIO(piece)).testzip() is None  # CRCs too
            assert torch.equal(torch.load(io.BytesIO(piece), weights_only=True), state[index.fqn].contiguous())


def test_async_save_holds_the_values_at_the_call(tmp_path):
    state = sample_state()
    state["step"] = torch.tensor(3)  # a CPU scalar as optimizers keep it
    want = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    future = qdcp.async_save(state, checkpoint_id=tmp_path / "ckpt")
    for value in state.values():
        if isinstance(value, torch.Tensor) and value.numel() and value.dtype != torch.bool:
            value.add_(1000)  # in place, right after the call
    future.result(timeout=60)
    loaded = empty_like_state(want)
    loaded["step"] = torch.tensor(0)
    qdcp.load(loaded, checkpoint_id=tmp_path / "ckpt")
    assert_state_equal(loaded, want)


def test_step_folders_latest_keep_last_and_dead_saves(tmp_path):
    root = tmp_path / "run"
    assert qdcp.latest(root) is None
    for step in (1, 2, 3):
        qdcp.save({"x": torch.full((4,), float(step))}, checkpoint_id=qdcp.step_folder(root, step), keep_last=2)
    assert sorted(os.listdir(root)) == ["step-000000000002", "step-000000000003"]
    # A save that died on the way: files, no .metadata. Never latest; removed by the next commit.
    dead = qdcp.step_folder(root, 4)
    os.makedirs(dead)
    shutil.copy(os.path.join(qdcp.step_folder(root, 3), "__0_0.distcp"), dead)
    assert qdcp.latest(root) == qdcp.step_folder(root, 3)
    qdcp.save({"x": torch.full((4,), 5.0)}, checkpoint_id=qdcp.step_folder(root, 5), keep_last=2)
    assert sorted(os.listdir(root)) == ["step-000000000003", "step-000000000005"]
    assert qdcp.checkpoints(root) == [qdcp.step_folder(root, 3), qdcp.step_folder(root, 5)]
    # Saving a committed step again replaces it.
    qdcp.save({"x": torch.full((4,), 9.0)}, checkpoint_id=qdcp.step_folder(root, 5))
    loaded = {"x": torch.zeros(4)}
    qdcp.load(loaded, checkpoint_id=qdcp.latest(root))
    assert torch.equal(loaded["x"], torch.full((4,), 9.0))


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to see the fsyncs")
def test_commit_order_and_fsyncs(tmp_path):
    """The rank's file is fsynced, renamed and its folder fsynced before .metadata is created;
    .metadata is fsynced, renamed, and the folder fsynced after that rename."""
    folder = tmp_path / "step-000000000001"
    script = textwrap.dedent(f"""
        import torch
        from qrnn.checkpoint import dcp
        dcp.save({{"x": torch.ones(1000), "n": 3}}, checkpoint_id={str(folder)!r})
    """)
    trace = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat,rename,renameat,renameat2,fsync,fdatasync",
                            sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    if trace.returncode != 0 and "ptrace" in trace.stderr:
        pytest.skip(f"strace cannot trace here: {trace.stderr.strip()[:200]}")
    assert trace.returncode == 0, trace.stderr[-3000:]
    lines = [re.sub(r"^\[pid\s+\d+\] ", "", line) for line in trace.stderr.splitlines()]

    def commit_of(final: str) -> int:
        """The line where `final` is renamed into place, after checking its temporary was
        fsynced before and its folder after."""
        temporary = rf'"\.{re.escape(final)}\.tmp-[^"]+"'
        created = [i for i, line in enumerate(lines) if re.match(rf"openat\(\d+, {temporary}.*O_CREAT.*= \d+", line)]
        assert len(created) == 1, f"no temporary of {final}"
        fd = lines[created[0]].rsplit("= ", 1)[1]
        renamed = [i for i, line in enumerate(lines)
                   if re.match(rf'renameat2?\((\d+), {temporary}, \1, "{re.escape(final)}".*= 0', line)]
        assert len(renamed) == 1, f"{final} was not renamed into place"
        assert any(re.match(rf"fsync\({fd}\)\s+= 0", line)
                   for line in lines[created[0]:renamed[0]]), f"{final} was not fsynced before its rename"
        folder_fd = re.match(r"renameat2?\((\d+),", lines[renamed[0]]).group(1)
        assert any(re.match(rf"fsync\({folder_fd}\)\s+= 0", line) for line in lines[renamed[0]:]), \
            f"the folder was not fsynced after {final}'s rename"
        return renamed[0]

    data = commit_of("__0_0.distcp")
    metadata = commit_of(".metadata")
    first_metadata_line = next(i for i, line in enumerate(lines) if ".metadata.tmp-" in line)
    folder_sync = next(i for i in range(data, len(lines)) if re.match(r"fsync\(\d+\)\s+= 0", lines[i]))
    assert folder_sync < first_metadata_line < metadata, ".metadata was started before the rank's file was durable"


def test_memory_stays_flat_over_50_async_saves(tmp_path):
    """The staging image is allocated once and reused: RSS after save 50 is where it was after
    save 10 (within a quarter of the state, far below a leak of one copy per save)."""
    state = {"w": torch.randn(1 << 20), "b": torch.randn(1 << 18)}  # 5 MiB
    state_bytes = sum(v.numel() * v.element_size() for v in state.values())

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc/self/statm")
    marks = {}
    for i in range(1, 51):
        qdcp.async_save(state, checkpoint_id=qdcp.step_folder(tmp_path, i), keep_last=2)
        state["w"].add_(1)
        if i in (10, 50):
            qdcp.wait()
            marks[i] = rss()
    qdcp.wait()
    assert marks[50] - marks[10] < state_bytes // 4, (marks, state_bytes)
    assert len(qdcp.checkpoints(tmp_path)) == 2


# ---- damaged and hostile folders --------------------------------------------------------

def saved_folder(tmp_path) -> str:
    return qdcp.save({"a": torch.arange(8.0), "b": torch.ones(3), "n": 5}, checkpoint_id=tmp_path / "ckpt")


def rewrite_metadata(folder: str, change) -> None:
    path = os.path.join(folder, ".metadata")
    with open(path, "rb") as f:
        meta = pickle.load(f)
    change(meta)
    with open(path, "wb") as f:
        pickle.dump(meta, f)


def set_info(meta, fqn: str, **fields) -> None:
    import dataclasses
    for index, info in list(meta.storage_data.items()):
        if index.fqn == fqn:
            meta.storage_data[index] = dataclasses.replace(info, **fields)


def refused(folder: str, error_type=None) -> str:
    """Loading raises `error_type` (CorruptCheckpointError) with a one-line message and leaves
    the target untouched."""
    error_type = error_type or CorruptCheckpointError
    target = {"a": torch.full((8,), -1.0), "b": torch.full((3,), -1.0), "n": None}
    with pytest.raises(error_type) as caught:
        qdcp.load(target, checkpoint_id=folder)
    message = str(caught.value)
    assert "\n" not in message, message
    assert torch.equal(target["a"], torch.full((8,), -1.0)) and torch.equal(target["b"], torch.full((3,), -1.0))
    assert target["n"] is None
    return message


def test_missing_shard_file(tmp_path):
    folder = saved_folder(tmp_path)
    os.unlink(os.path.join(folder, "__0_0.distcp"))
    assert "shard file '__0_0.distcp' is missing" in refused(folder)


def test_truncated_metadata(tmp_path):
    folder = saved_folder(tmp_path)
    path = os.path.join(folder, ".metadata")
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    assert "truncated or not a DCP metadata pickle" in refused(folder)


def test_missing_metadata(tmp_path):
    folder = saved_folder(tmp_path)
    os.unlink(os.path.join(folder, ".metadata"))
    assert "no committed checkpoint" in refused(folder)


@pytest.mark.parametrize("name", ["../outside.distcp", "/etc/passwd", "..", "sub/__0_0.distcp"])
def test_metadata_naming_a_path_outside_the_folder(tmp_path, name):
    folder = saved_folder(tmp_path)
    rewrite_metadata(folder, lambda meta: set_info(meta, "b", relative_path=name))
    assert "names a file outside the folder" in refused(folder)


def test_metadata_claiming_more_bytes_than_the_file_holds(tmp_path):
    folder = saved_folder(tmp_path)
    size = os.path.getsize(os.path.join(folder, "__0_0.distcp"))
    rewrite_metadata(folder, lambda meta: set_info(meta, "b", length=size + 1))
    assert f"which holds {size}" in refused(folder)


def test_metadata_pickle_with_code_runs_nothing(tmp_path):
    folder = saved_folder(tmp_path)
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    with open(os.path.join(folder, ".metadata"), "wb") as f:
        pickle.dump(Evil(), f)
    message = refused(folder, UnsafeCheckpointError)
    assert "system" in message and not marker.exists()


def point_at_code(folder, key: str, marker) -> None:
    """Append to rank 0's file a torch.save pickle that would run `touch marker`, and point
    `key`'s item at it."""
    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    buffer = io.BytesIO()
    torch.save(Evil(), buffer)
    evil = buffer.getvalue()
    with open(os.path.join(folder, "__0_0.distcp"), "ab") as f:
        offset = f.tell()
        f.write(evil)
    rewrite_metadata(folder, lambda meta: set_info(meta, key, offset=offset, length=len(evil)))


def test_item_pickle_with_code_runs_nothing(tmp_path):
    """A shard item whose torch.save pickle calls code: refused by the weights-only unpickler,
    before any item of the folder is copied into the target."""
    folder, marker = saved_folder(tmp_path), tmp_path / "ran"
    point_at_code(folder, "a", marker)
    with pytest.raises(UnsafeCheckpointError) as caught:
        qdcp.load({"a": torch.zeros(8), "b": torch.zeros(3), "n": None}, checkpoint_id=folder)
    assert "\n" not in str(caught.value) and "system" in str(caught.value) and not marker.exists()


def test_damaged_archive_inside_a_shard_file(tmp_path):
    folder = saved_folder(tmp_path)
    meta = qdcp.QRNNStorageReader(folder).read_metadata()
    info = next(i for k, i in meta.storage_data.items() if k.fqn == "b")
    path = os.path.join(folder, "__0_0.distcp")
    data = bytearray(open(path, "rb").read())
    end = info.offset + info.length
    data[end - 60:end] = bytes(60)  # its end records
    open(path, "wb").write(bytes(data))
    assert "is damaged" in refused(folder)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the pinned staging path)")
def test_gpu_shards_are_staged_through_pinned_memory(tmp_path):
    state = {"w": torch.randn(1000, 300, device="cuda"), "h": torch.randn(77, device="cuda").half(), "n": 1}
    want = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    future = qdcp.async_save(state, checkpoint_id=tmp_path / "gpu")
    state["w"].add_(1)
    future.result(timeout=60)
    loaded = {"w": torch.zeros(1000, 300), "h": torch.zeros(77).half(), "n": None}
    dcp.load(loaded, checkpoint_id=tmp_path / "gpu")
    assert_state_equal(loaded, want)


def test_a_changed_structure_is_planned_again(tmp_path):
    """Saves of the same structure reuse the plan; a new key, shape or dtype makes a new one."""
    states = [
        {"a": torch.arange(4.0), "n": 1},
        {"a": torch.arange(4.0) + 1, "n": 2},                   # same structure: cached plan
        {"a": torch.arange(6.0), "n": 3},                       # another shape
        {"a": torch.arange(6.0), "b": torch.ones(2), "n": 4},   # another key
        {"a": torch.arange(6, dtype=torch.int64), "b": torch.ones(2), "n": 5},  # another dtype
    ]
    for i, state in enumerate(states):
        folder = qdcp.save(state, checkpoint_id=qdcp.step_folder(tmp_path, i))
        loaded = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in state.items()}
        dcp.load(loaded, checkpoint_id=folder)
        assert_state_equal(loaded, state)


def test_byte_item_pickle_with_code_runs_nothing(tmp_path):
    """DCP's own planner unpickles byte items (non-tensor values) with weights_only=False; the
    reader refuses one that holds code before the planner sees it."""
    folder, marker = saved_folder(tmp_path), tmp_path / "ran"
    point_at_code(folder, "n", marker)
    message = refused(folder, UnsafeCheckpointError)
    assert "system" in message and not marker.exists()


def test_load_all_reads_a_whole_folder_without_a_template(tmp_path):
    state = sample_state()
    folder = qdcp.save(state, checkpoint_id=tmp_path / "ckpt")
    loaded = qdcp.load_all(folder)
    assert loaded.keys() == state.keys()
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(loaded[name], value), name
    assert loaded["extra"] == state["extra"]
    os.unlink(os.path.join(folder, "__0_0.distcp"))
    with pytest.raises(CorruptCheckpointError, match="is missing"):
        qdcp.load_all(folder)
