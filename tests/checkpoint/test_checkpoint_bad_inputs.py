"""Bad-input sweep of qrnn.checkpoint: bad arguments, unpicklable or special states, vanished
folders and damaged files. Each call must raise a TypeError or ValueError naming the
argument, or propagate the values correctly; never crash or hang.
"""

import pickle
import warnings

import pytest
import torch

from conftest import run_python
from qrnn.checkpoint import AsyncCheckpointer, CheckpointError, CorruptCheckpointError
from qrnn.checkpoint import load as ckpt_load
from qrnn.checkpoint import verify as ckpt_verify


@pytest.mark.parametrize("kwargs, error, match", [
    ({"directory": 123}, TypeError, "PathLike"),
    ({"directory": None}, TypeError, "PathLike"),
    ({"keep_last": 0}, ValueError, "keep_last"),
    ({"keep_last": -2}, ValueError, "keep_last"),
    ({"keep_last": 1.5}, ValueError, "keep_last"),
    ({"keep_last": "3"}, ValueError, "keep_last"),
    ({"max_pending": 0}, ValueError, "max_pending"),
    ({"max_pending": "2"}, ValueError, "max_pending"),
    ({"copy_threads": 0}, ValueError, "copy_threads"),
    ({"copy_threads": 2.0}, ValueError, "copy_threads"),
    ({"prefix": ""}, ValueError, "prefix"),
    ({"prefix": "a/b"}, ValueError, "prefix"),
    ({"prefix": ".hidden"}, ValueError, "prefix"),
    ({"prefix": "a\0b"}, ValueError, "prefix"),
    ({"prefix": 5}, TypeError, "prefix"),
], ids=lambda v: repr(v)[:40])
def test_checkpointer_bad_arguments(tmp_path, kwargs, error, match):
    kwargs = {"directory": tmp_path, **kwargs}
    with pytest.raises(error, match=match):
        AsyncCheckpointer(**kwargs)


def test_checkpointer_directory_is_a_file(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(OSError):  # FileExistsError / NotADirectoryError: the OS says what is wrong
        AsyncCheckpointer(tmp_path / "file")


@pytest.mark.parametrize("step, error", [(-1, ValueError), (1.5, TypeError), ("1", TypeError), (None, TypeError),
                                         (torch.tensor(1.0), TypeError)], ids=repr)
def test_save_bad_step(tmp_path, step, error):
    with AsyncCheckpointer(tmp_path) as ckpt:
        with pytest.raises(error):
            ckpt.save({"a": torch.ones(2)}, step)
        assert ckpt.save({"a": torch.ones(2)}, 1).result()  # still usable


@pytest.mark.parametrize("overlap", [5, "adam", [torch.optim.SGD([torch.zeros(1, requires_grad=True)]), 3]],
                         ids=["int", "str", "list-with-int"])
def test_save_bad_overlap_with(tmp_path, overlap):
    with AsyncCheckpointer(tmp_path) as ckpt:
        with pytest.raises(TypeError):
            ckpt.save({"a": torch.ones(2)}, 1, overlap_with=overlap)


def test_save_unpicklable_state_leaves_checkpointer_usable(tmp_path):
    with AsyncCheckpointer(tmp_path) as ckpt:
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            ckpt.save({"f": lambda: 1}, 1)
        with pytest.raises(ValueError, match="different dtypes"):
            base = torch.randn(4)
            ckpt.save({"a": base, "b": base.view(torch.int32)}, 2)
        path = ckpt.save({"a": torch.ones(2)}, 3).result()
    assert torch.equal(ckpt_load(path)["a"], torch.ones(2))


def test_save_special_values_and_kinds_round_trip(tmp_path):
    """NaN/Inf bit patterns, empty and 0-d tensors, meta, sparse, conj/neg views, quantized,
    a bare tensor as the whole state and a self-referencing dict: saved as torch.save would."""
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45])
    complex_view = torch.randn(3, dtype=torch.complex64)
    with warnings.catch_warnings():  # newer torch warns that quantization is deprecated
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8)
    state = {"special": special, "empty": torch.empty(0, 3), "scalar": torch.tensor(2.5),
             "meta": torch.empty(3, device="meta"), "sparse": torch.rand(3, 3).to_sparse(),
             "conj": complex_view.conj(), "neg": torch.randn(3, dtype=torch.complex64).conj().imag,
             "quantized": quantized}
    recursive = {"name": "loop"}
    recursive["self"] = recursive
    with AsyncCheckpointer(tmp_path, keep_last=None) as ckpt:
        path = ckpt.save(state, 1).result()
        bare = ckpt.save(torch.arange(5), 2).result()
        loop = ckpt.save(recursive, 3).result()
    loaded = ckpt_load(path, weights_only=False)
    assert torch.equal(loaded["special"].view(torch.int32), special.view(torch.int32))
    assert loaded["empty"].shape == (0, 3) and loaded["scalar"].item() == 2.5
    assert loaded["meta"].device.type == "meta" and loaded["meta"].shape == (3,)
    assert torch.equal(loaded["sparse"].to_dense(), state["sparse"].to_dense())
    assert torch.equal(loaded["conj"].resolve_conj(), state["conj"].resolve_conj())
    assert torch.equal(loaded["neg"].resolve_neg(), state["neg"].resolve_neg())
    assert torch.equal(loaded["quantized"].int_repr(), quantized.int_repr())
    assert torch.equal(ckpt_load(bare), torch.arange(5))
    again = ckpt_load(loop)
    assert again["self"] is again
    for p in (path, bare, loop):
        assert ckpt_verify(p) is None


def test_save_after_close_and_double_close(tmp_path):
    ckpt = AsyncCheckpointer(tmp_path)
    ckpt.close()
    ckpt.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        ckpt.save({}, 1)


def test_save_into_vanished_directory_reports_error(tmp_path):
    import shutil
    folder = tmp_path / "gone"
    ckpt = AsyncCheckpointer(folder)
    shutil.rmtree(folder)
    with pytest.raises(CheckpointError) as caught:
        ckpt.save({"a": torch.ones(3)}, 1).result()
    assert caught.value.errno != 0
    ckpt.close()


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, b"PK\x03\x04" + b"\0" * 60],
                         ids=["empty", "garbage", "zip-magic"])
def test_verify_and_load_reject_damaged_files(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError):
        ckpt_verify(path)
    with pytest.raises(Exception) as caught:  # torch.load's own error, never a crash
        ckpt_load(path)
    assert not isinstance(caught.value, SystemError)


@pytest.mark.parametrize("bad, error", [(5, TypeError), (None, TypeError)], ids=repr)
@pytest.mark.parametrize("fn", [ckpt_verify, ckpt_load], ids=["verify", "load"])
def test_verify_and_load_bad_path_types(fn, bad, error):
    with pytest.raises(error):
        fn(bad)


@pytest.mark.parametrize("fn", [ckpt_verify, ckpt_load], ids=["verify", "load"])
def test_verify_and_load_missing_or_directory(tmp_path, fn):
    with pytest.raises(FileNotFoundError):
        fn(tmp_path / "missing.pt")
    with pytest.raises(IsADirectoryError):
        fn(tmp_path)


def test_checkpointer_out_of_threads_raises_not_aborts():
    """A writer that cannot start its threads raises; it must not std::terminate the process."""
    proc = run_python("""
        import resource, tempfile, qrnn.checkpoint as c
        # Thread stacks come out of the address space: cap it so that thread 100-odd fails.
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        import os
        used = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30), hard))
        try:
            c.AsyncCheckpointer(tempfile.mkdtemp(), copy_threads=1000)
            print("made")  # the OS had room after all: fine too
        except (RuntimeError, MemoryError, OSError) as e:
            print("raised", type(e).__name__)
    """, timeout=60)
    assert proc.returncode == 0 and ("raised" in proc.stdout or "made" in proc.stdout), proc.stderr[-2000:]
