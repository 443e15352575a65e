"""qrnn.checkpoint: format (plain torch.load, mmap, zipfile, byte layout of torch.save),
round trips in every dtype, snapshot semantics, rotation, verify(), the C++ tensor writer."""

import collections
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from conftest import weights_only_reads
from qrnn import _C
from qrnn.checkpoint import AsyncCheckpointer, CorruptCheckpointError, load, verify

ALL_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2,
]


# torch 2.4 neither saves uint16/32/64 nor reads them back with weights_only=True (later
# versions do both). Test the dtypes this torch can read back.
ALL_DTYPES = [dt for dt in ALL_DTYPES if weights_only_reads(dt)]


def random_tensor(shape, dtype):
    """Fresh random values of any dtype (never zeros)."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    bits = torch.randint(0, 256, (int(torch.Size(shape).numel()) * dtype.itemsize,), dtype=torch.uint8)
    return bits.view(dtype).reshape(shape)


def bits(t):
    """Exact comparison key for any dtype (NaN-safe, float8-safe)."""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1).to(torch.uint8)


def assert_same(a, b, where="state"):
    assert type(a) is type(b) or (isinstance(a, dict) and isinstance(b, dict)), f"{where}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), where
        assert a.storage_offset() == b.storage_offset() and a.requires_grad == b.requires_grad, where
        assert torch.equal(bits(a), bits(b)), f"{where}: values differ"
    elif isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def nested_state():
    base = torch.randn(6, 5)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.LayerNorm(7))
    return {
        "tensors": {str(dt).replace("torch.", ""): random_tensor((3, 4), dt) for dt in ALL_DTYPES},
        "views": {"base": base, "transposed": base.t(), "row": base[2], "column": base[:, 1], "slice": base[1:4, ::2]},
        "scalar": torch.tensor(3.5), "empty": torch.zeros(0, 3), "big": torch.randn(300_000),
        "parameter": torch.nn.Parameter(torch.randn(2, 2)),
        "model": model.state_dict(),
        "list": [1, 2.5, -7, 2**40, "text", None, True, (torch.ones(2, dtype=torch.int64), "x")],
        "tuple": (None, 0.1, {"deep": [torch.arange(4)]}),
        "unicode ключ": "значение", 7: "int key",
    }


def test_round_trip_every_dtype_nested(tmp_path):
    state = nested_state()
    with AsyncCheckpointer(tmp_path, keep_last=None) as ckpt:
        path = ckpt.save(state, step=1).result()
    loaded = load(path)
    assert_same(state, loaded)
    views = loaded["views"]
    base_ptr = views["base"].untyped_storage().data_ptr()
    for name in ("transposed", "row", "column", "slice"):  # views still share one storage
        assert views[name].untyped_storage().data_ptr() == base_ptr, name
    assert isinstance(loaded["parameter"], torch.nn.Parameter)
    assert isinstance(loaded["model"], collections.OrderedDict)
    assert loaded["model"]._metadata == state["model"]._metadata
    assert zipfile.ZipFile(path).testzip() is None
    verify(path)


def test_plain_torch_load_without_qrnn(tmp_path):
    """weights_only and mmap loads (with torch computing offsets itself) in a fresh process."""
    state = nested_state()
    with AsyncCheckpointer(tmp_path) as ckpt:
        path = ckpt.save(state, step=3).result()
    script = r"""
import json, os, sys, torch
try:
    from torch.utils.serialization import config
    config.load.calculate_storage_offsets = True  # offsets from torch's own layout rules
except ImportError:  # older torch: no such option
    pass
results = {}
for name, kwargs in {"plain": {}, "mmap": {"mmap": True}}.items():
    s = torch.load(sys.argv[1], weights_only=True, **kwargs)
    t = s["tensors"]
    results[name] = {k: v.contiguous().view(-1).view(torch.uint8).tolist() for k, v in t.items()}
    results[name]["list"] = repr(s["list"])
assert "qrnn" not in sys.modules
print(json.dumps(results))
"""
    env = dict(os.environ, TORCH_SERIALIZATION_DEBUG="1")  # torch asserts its computed offsets
    out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)
    expected = {k: v.contiguous().view(-1).view(torch.uint8).tolist() for k, v in state["tensors"].items()}
    for mode in ("plain", "mmap"):
        assert results[mode].pop("list") == repr(state["list"])
        assert results[mode] == expected, mode


def test_same_bytes_as_torch_save(tmp_path):
    """Given torch.save's own pickle and storages, the file is torch.save's byte for byte
    (except the serialization id, an opaque hash)."""
    state = {"w": torch.randn(33, 17), "b": torch.arange(5), "h": torch.randn(3, dtype=torch.float16)[1:],
             "e": torch.zeros(0), "n": [1, "two"]}
    theirs = tmp_path / "theirs" / "ckpt.pt"
    ours = tmp_path / "ours" / "ckpt.pt"
    theirs.parent.mkdir()
    ours.parent.mkdir()
    torch.save(state, theirs)
    archive = zipfile.ZipFile(theirs)
    pickle_bytes = archive.read("ckpt/data.pkl")
    payloads = [archive.read(f"ckpt/data/{i}") for i in range(4)]
    keep = [torch.frombuffer(bytearray(p), dtype=torch.uint8) if p else torch.zeros(0, dtype=torch.uint8)
            for p in payloads]
    writer = _C.CheckpointWriter()
    status = writer.submit(str(ours), pickle_bytes, [(t.data_ptr(), t.numel()) for t in keep])
    status.wait()
    assert status.ok(), status.error()
    writer.close()
    a, b = theirs.read_bytes(), ours.read_bytes()
    infos_a = {i.filename: i for i in zipfile.ZipFile(theirs).infolist()}
    infos_b = {i.filename: i for i in zipfile.ZipFile(ours).infolist()}
    if set(infos_a) < set(infos_b):  # e.g. torch 2.4 writes no .format_version/.storage_alignment
        pytest.skip(f"this torch {torch.__version__} writes an older layout: "
                    f"no {sorted(set(infos_b) - set(infos_a))}")
    assert len(a) == len(b)
    assert list(infos_a) == list(infos_b)
    sid = infos_a["ckpt/.data/serialization_id"]
    for name, info in infos_a.items():
        assert (info.header_offset, info.file_size, info.flag_bits, info.compress_type) == (
            infos_b[name].header_offset, infos_b[name].file_size, infos_b[name].flag_bits, infos_b[name].compress_type)
        if name != sid.filename:
            assert info.CRC == infos_b[name].CRC, name
    assert a[:sid.header_offset] == b[:sid.header_offset]


def test_snapshot_semantics_cpu_after_in_place_changes(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 256))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 256)).sum().backward()
    opt.step()
    with AsyncCheckpointer(tmp_path, keep_last=None) as ckpt:
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        expected = {"model": {k: v.clone() for k, v in state["model"].items()},
                    "optim": {p: {k: v.clone() for k, v in s.items()} for p, s in state["optim"]["state"].items()}}
        handle = ckpt.save(state, step=1)
        with torch.no_grad():  # change every saved tensor at once, CPU step counters included
            for p in model.parameters():
                p.add_(1.0)
        for s in opt.state.values():
            s["step"] += 5
            s["exp_avg"].mul_(-3)
        loaded = load(handle.result())
    assert_same(expected["model"], dict(loaded["model"]))
    for p, s in expected["optim"].items():
        assert_same(s, loaded["optim"]["state"][p], f"optim[{p}]")


def test_snapshot_overlap_mode_waits_only_in_optimizer_step(tmp_path):
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 512)
    model(x).sum().backward()
    opt.step()
    with AsyncCheckpointer(tmp_path, keep_last=None) as ckpt:
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        before = {k: v.clone() for k, v in model.state_dict().items()}
        step_before = opt.state[model.weight]["step"].clone()
        handle = ckpt.save(state, step=1, overlap_with=opt)
        opt.zero_grad()
        model(x).sum().backward()   # forward/backward overlap the staging copy
        opt.step()                  # the pre-step hook waits for the snapshot first
        assert handle._save.barrier_done  # the barrier waited for this snapshot
        opt.step()
        loaded = load(handle.result())
    assert_same(before, dict(loaded["model"]))
    assert torch.equal(loaded["optim"]["state"][0]["step"], step_before)


@pytest.mark.cuda
@pytest.mark.parametrize("overlap", [False, True])
def test_snapshot_semantics_cuda(tmp_path, overlap):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 64)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 1024, device="cuda")
    model(x).sum().backward()
    opt.step()
    with AsyncCheckpointer(tmp_path, keep_last=None) as ckpt:
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "cpu": torch.randn(100)}
        expected = {k: v.clone() for k, v in model.state_dict().items()}
        expected_avg = {i: s["exp_avg"].clone() for i, s in enumerate(opt.state.values())}
        handle = ckpt.save(state, step=1, overlap_with=opt if overlap else None)
        if overlap:
            model(x).sum().backward()
            opt.step()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(-2)
            for s in opt.state.values():
                s["exp_avg"].add_(1)
        loaded = load(handle.result())
    assert loaded["model"]["0.weight"].device.type == "cuda"  # restored where it was, as torch.save does
    assert_same(expected, dict(loaded["model"]))
    for i, avg in expected_avg.items():
        assert torch.equal(loaded["optim"]["state"][i]["exp_avg"], avg)


def test_keep_last_rotation_and_latest(tmp_path):
    state = {"x": torch.randn(100)}
    with AsyncCheckpointer(tmp_path, keep_last=2) as ckpt:
        assert ckpt.latest() is None
        for step in range(6):
            ckpt.save(state, step)
        ckpt.wait()
        names = sorted(os.listdir(tmp_path))  # while it writes, the writer lock is there too
        assert names == [".ckpt-writer.lock", "ckpt-000000000004.pt", "ckpt-000000000005.pt"]
        assert ckpt.latest() == str(tmp_path / "ckpt-000000000005.pt")
        # Rotation follows the commit order: a lower step committed last is the newest.
        ckpt.save(state, 1).result()
        assert sorted(os.listdir(tmp_path)) == [".ckpt-writer.lock", "ckpt-000000000001.pt", "ckpt-000000000005.pt"]
        assert ckpt.checkpoints() == [str(tmp_path / "ckpt-000000000005.pt"), str(tmp_path / "ckpt-000000000001.pt")]
        assert ckpt.latest() == str(tmp_path / "ckpt-000000000001.pt")
        assert ckpt.latest(order="step") == str(tmp_path / "ckpt-000000000005.pt")
        assert ckpt.checkpoints(order="step")[0].endswith("ckpt-000000000001.pt")
        with pytest.raises(ValueError, match="order"):
            ckpt.latest(order="newest")
    with AsyncCheckpointer(tmp_path / "all", keep_last=None) as ckpt:
        for step in (9, 10, 11, 100):
            ckpt.save(state, step)
        ckpt.wait()
        assert len(ckpt.checkpoints()) == 4
        assert ckpt.latest().endswith("ckpt-000000000100.pt")  # numeric order, zero padded names


@pytest.mark.parametrize("record", ["data.pkl", "data/0", "data/1", "byteorder"])
def test_verify_names_the_damaged_record(tmp_path, record):
    with AsyncCheckpointer(tmp_path) as ckpt:
        path = ckpt.save({"a": torch.randn(1000), "b": torch.randn(50)}, 1).result()
    verify(path)
    info = zipfile.ZipFile(path).getinfo(f"ckpt-000000000001/{record}")
    raw = bytearray(open(path, "rb").read())
    name_len, extra_len = int.from_bytes(raw[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(raw[info.header_offset + 28:info.header_offset + 30], "little")
    payload = info.header_offset + 30 + name_len + extra_len
    raw[payload + info.file_size // 2] ^= 0x10
    open(path, "wb").write(raw)
    with pytest.raises(CorruptCheckpointError, match=f"record 'ckpt-000000000001/{record}'") as caught:
        verify(path)
    assert caught.value.record == f"ckpt-000000000001/{record}"
    assert zipfile.ZipFile(path).testzip() == f"ckpt-000000000001/{record}"


def test_verify_rejects_truncated_file(tmp_path):
    with AsyncCheckpointer(tmp_path) as ckpt:
        path = ckpt.save({"a": torch.randn(1000)}, 1).result()
    raw = open(path, "rb").read()
    open(path, "wb").write(raw[:len(raw) // 2])
    with pytest.raises(CorruptCheckpointError, match="archive") as caught:
        verify(path)
    assert caught.value.record is None


def test_cpp_tensor_dict_writer(tmp_path):
    """The C++ helper builds the pickle itself: views, strides, offsets, every legacy dtype."""
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.complex128,
              torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]
    base = torch.randn(5, 7)
    tensors = {str(dt): random_tensor((4, 3), dt) for dt in dtypes}
    tensors.update({"base": base, "t": base.t(), "row": base[3], "cols": base[:, 2:5], "empty": torch.zeros(0, 4),
                    "scalar": torch.tensor(-1.25, dtype=torch.float64)})
    specs = []
    for name, t in tensors.items():
        storage = t.untyped_storage()
        specs.append((name, dtypes.index(t.dtype), list(t.shape), list(t.stride()), storage.data_ptr(),
                      t.storage_offset(), storage.nbytes(), False))
    writer = _C.CheckpointWriter()
    path = str(tmp_path / "from_cpp.pt")
    status = writer.write_tensors(path, specs)
    status.wait()
    writer.close()
    assert status.ok(), status.error()
    for kwargs in ({}, {"mmap": True}):
        loaded = torch.load(path, weights_only=True, **kwargs)
        assert list(loaded) == list(tensors)
        for name, t in tensors.items():
            assert_same(t, loaded[name], name)
    assert zipfile.ZipFile(path).testzip() is None
    with pytest.raises(ValueError, match="tensor 'x'"):
        _C.CheckpointWriter().write_tensors(str(tmp_path / "bad.pt"), [("x", 0, [4], [1], 0, 0, 16, False)])


def test_crc32_matches_zlib():
    import zlib
    for n in (0, 1, 15, 16, 63, 64, 255, 256, 257, 1000, 4096 + 3, 100_003):
        data = os.urandom(n)
        assert _C.checkpoint_crc32(data) == zlib.crc32(data), n
        assert _C.checkpoint_crc32(data[n // 3:], _C.checkpoint_crc32(data[:n // 3])) == zlib.crc32(data), n


def test_block_false_skips_when_full(tmp_path):
    class Busy:  # stands in for a save that is still being written
        sequence = -1

        @staticmethod
        def finished():
            return False

    with AsyncCheckpointer(tmp_path, max_pending=1) as ckpt:
        ckpt._slots[0].save = Busy()
        assert ckpt.save({"x": torch.ones(3)}, 1, block=False) is None
        ckpt._slots[0].save = None
        assert ckpt.save({"x": torch.ones(3)}, 1, block=False).result().endswith("ckpt-000000000001.pt")


def test_cpp_queue_is_bounded():
    """A save whose bytes are not there yet (gate closed) holds its slot: try_submit refuses."""
    writer = _C.CheckpointWriter(max_pending=1, sync=False)
    gate = _C.CheckpointGate()
    image = torch.zeros(1 << 16, dtype=torch.uint8)
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        first = writer.submit(os.path.join(folder, "a.pt"), b"\x80\x02}.", [(0, 16)], staging=image.data_ptr(),
                              staging_capacity=image.numel(), gate=gate)
        assert writer.submit(os.path.join(folder, "b.pt"), b"\x80\x02}.", [], block=False) is None
        assert not first.done()
        gate.open()
        assert first.wait(30) and first.ok()
        second = writer.submit(os.path.join(folder, "b.pt"), b"\x80\x02}.", [], block=False)
        second.wait()
        assert second.ok()
        writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit("x.pt", b"", [])


def test_a_plan_is_laid_out_once_and_used_up_by_its_submit(tmp_path):
    """submit(plan) writes the file submit(path, ...) writes, by the plan's layout (a record
    staged by the caller at its planned offset included); a submit refused for a full queue
    leaves the plan usable, a queued one uses it up."""
    data, sources = b"\x80\x02}.", [(0, 16)]
    path = str(tmp_path / "a.pt")
    writer = _C.CheckpointWriter(max_pending=1, sync=False)
    direct = writer.submit(path, data, [])
    assert direct.wait(30) and direct.ok()
    expected = open(path, "rb").read()
    planned = _C.checkpoint_plan(path, data, [])
    assert planned.path == path and planned.file_size == len(expected)
    status = writer.submit(planned)
    assert status.wait(30) and status.ok()
    assert open(path, "rb").read() == expected
    with pytest.raises(RuntimeError, match="submitted already"):
        writer.submit(planned)
    with pytest.raises(RuntimeError, match="submitted already"):
        assert planned.staging_size

    gated = _C.checkpoint_plan(str(tmp_path / "b.pt"), data, sources)
    offset, size = gated.record_offsets[0], gated.file_size
    image = torch.zeros(gated.staging_size, dtype=torch.uint8)
    image[offset:offset + 16] = torch.arange(16, dtype=torch.uint8)
    gate = _C.CheckpointGate()
    first = writer.submit(gated, staging=image.data_ptr(), staging_capacity=image.numel(), gate=gate)
    waiting = _C.checkpoint_plan(path, data, [])
    assert writer.submit(waiting, block=False) is None  # the gated save holds the only slot
    assert waiting.file_size == len(expected)  # still planned
    gate.open()
    assert first.wait(30) and first.ok()
    second = writer.submit(waiting, block=False)
    assert second.wait(30) and second.ok()
    writer.close()
    written = (tmp_path / "b.pt").read_bytes()
    assert len(written) == size and written[offset:offset + 16] == bytes(range(16))
    assert open(path, "rb").read() == expected


def test_misuse_raises_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="keep_last"):
        AsyncCheckpointer(tmp_path, keep_last=0)
    with pytest.raises(ValueError, match="max_pending"):
        AsyncCheckpointer(tmp_path, max_pending=0)
    ckpt = AsyncCheckpointer(tmp_path)
    with pytest.raises(ValueError, match="step"):
        ckpt.save({}, -1)
    with pytest.raises(TypeError, match="overlap_with"):
        ckpt.save({}, 1, overlap_with="adam")
    base = torch.randn(4)
    with pytest.raises(ValueError, match="different dtypes"):
        ckpt.save({"a": base, "b": base.view(torch.int32)}, 1)
    ckpt.save({"fine": base}, 2).result()  # a refused save leaves the checkpointer usable
    ckpt.close()
    with pytest.raises(RuntimeError, match="closed"):
        ckpt.save({}, 1)


@pytest.mark.skipif(os.environ.get("QRNN_TEST_LARGE") != "1",
                    reason="writes a 4.3 GB file; set QRNN_TEST_LARGE=1 to run")
def test_zip64_record_beyond_4_gib(tmp_path):
    """A >4 GiB payload (ZIP64 sizes) followed by a record whose header lies beyond 4 GiB
    (ZIP64 offset): torch.load, mmap with computed offsets, zipfile and verify() agree."""
    import mmap

    from qrnn.checkpoint.pickler import StorageRef, pickle_state

    big, small = (1 << 32) + 4096 + 7, 100

    class Stored:
        def __init__(self, key, n):
            self.key, self.n = key, n

        def __reduce__(self):
            ref = StorageRef(("storage", torch.ByteStorage, self.key, "cpu", self.n))
            return torch._utils._rebuild_tensor_v2, (ref, 0, (self.n,), (1,), False, collections.OrderedDict())

    data, _ = pickle_state({"big": Stored("0", big), "small": Stored("1", small)})
    writer = _C.CheckpointWriter()
    path = str(tmp_path / "large.pt")
    sources = [(0, big), (0, small)]  # the bytes are put into the staging image directly
    plan = _C.checkpoint_plan(path, data, sources)
    offsets, staging_size, file_size = plan.record_offsets, plan.staging_size, plan.file_size
    assert offsets[1] > 2**32
    image = mmap.mmap(-1, staging_size)  # untouched pages read as zeros
    image[offsets[1]:offsets[1] + small] = bytes(range(small))
    import ctypes
    address = ctypes.addressof(ctypes.c_char.from_buffer(image))
    status = writer.submit(plan, staging=address, staging_capacity=staging_size)
    status.wait()
    writer.close()
    assert status.ok(), status.error()
    assert os.path.getsize(path) == file_size
    script = r"""
import sys, torch
from torch.utils.serialization import config
config.load.calculate_storage_offsets = True
s = torch.load(sys.argv[1], mmap=True, weights_only=True)
assert s["big"].shape == (%d,) and int(s["big"][-1]) == 0 and int(s["big"][12345]) == 0
assert s["small"].tolist() == list(range(%d))
print("ok")
""" % (big, small)
    env = dict(os.environ, TORCH_SERIALIZATION_DEBUG="1")
    out = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, env=env, timeout=600)
    assert out.stdout.strip() == "ok", out.stderr
    infos = zipfile.ZipFile(path).infolist()
    assert infos[4].file_size == big and infos[5].header_offset > 2**32
    verify(path)


def flip_outcomes(path, state, verify_fn, masks=lambda offset: (0xFF, 1 << offset % 8)):
    """Damage every byte of the file in turn (by default: all its bits, then one bit):
    counts of flips verify() catches, that load the identical state, that load wrong values
    silently, that torch.load rejects after verify() passed, and that made verify() raise
    something other than CorruptCheckpointError."""
    raw = open(path, "rb").read()
    damaged = os.path.join(os.path.dirname(path), "damaged.pt")
    outcome = collections.Counter()
    for offset in range(len(raw)):
        for mask in masks(offset):
            copy = bytearray(raw)
            copy[offset] ^= mask
            with open(damaged, "wb") as f:
                f.write(copy)
            try:
                verify_fn(damaged)
            except CorruptCheckpointError:
                outcome["caught"] += 1
                continue
            except Exception:  # noqa: BLE001 - what we count
                outcome["other exception"] += 1
                continue
            try:
                loaded = torch.load(damaged, weights_only=True)
            except Exception:  # noqa: BLE001
                outcome["passed verify, torch.load rejects"] += 1
                continue
            try:
                assert_same(state, loaded)
                outcome["identical"] += 1
            except AssertionError:
                outcome["passed verify, wrong values"] += 1
    return outcome


def test_verify_catches_every_flip_that_matters(tmp_path):
    """Each damaged byte anywhere in a small checkpoint is caught by verify() or leaves a
    file that loads exactly the saved state: no flip, a central-directory attribute bit
    included, passes verify() and then loads wrong bytes or fails to load."""
    state = {"w": torch.arange(6, dtype=torch.float32), "ids": torch.tensor([3, 1, 2]), "step": 7}
    with AsyncCheckpointer(tmp_path / "c", keep_last=None) as ckpt:
        path = ckpt.save(state, 1).result()
    verify(path)
    outcome = flip_outcomes(path, state, verify)
    assert set(outcome) <= {"caught", "identical"}, dict(outcome)
    assert outcome["caught"] > outcome["identical"]
    torch.save(state, tmp_path / "plain.pt")  # torch.save's own files pass
    verify(tmp_path / "plain.pt")
    with open(tmp_path / "plain.pt", "ab") as f:  # trailing bytes are damage too
        f.write(b"\0")
    with pytest.raises(CorruptCheckpointError, match="archive"):
        verify(tmp_path / "plain.pt")
