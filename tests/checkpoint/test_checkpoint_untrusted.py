"""qrnn.checkpoint.load, qrnn-train --resume and qrnn-generate on files nobody vouches for:
compressed records, sizes larger than the file, names leaving the archive, foreign files
with the right format key, pickles that call code. Each is refused before anything is
unpickled or allocated (code: before anything runs), with a CorruptCheckpointError, or one
line and exit code 2 from the commands."""

import io
import os
import pickle
import shlex
import struct
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

from qrnn.checkpoint import AsyncCheckpointer, CorruptCheckpointError, UnsafeCheckpointError, load, verify
from qrnn.checkpoint.reader import refused_global
from qrnn.train.cli import main as train_main
from qrnn.train.generate import generate_main

GIB = 2**30


def tensor_archive(path, payload: bytes, *, compression=zipfile.ZIP_STORED, name="archive/data/0", numel=None):
    """A zip shaped like torch.save's: data.pkl referencing one float32 storage `name`."""
    numel = len(payload) // 4 if numel is None else numel

    class Storage:  # pickles as torch.save's persistent id of a FloatStorage
        pass

    class Pickler(pickle.Pickler):  # a method: Python 3.13 refuses persistent_id set on an instance
        def persistent_id(self, obj):
            if isinstance(obj, Storage):
                return ("storage", torch.FloatStorage, name.rsplit("/", 1)[-1], "cpu", numel)
            return None

    buffer = io.BytesIO()
    pickler = Pickler(buffer, protocol=2)
    rebuild = torch._utils._rebuild_tensor_v2
    pickler.dump({"w": _Reduce(rebuild, (Storage(), 0, (numel,), (1,), False, {}))})
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("archive/data.pkl", buffer.getvalue())
        z.writestr("archive/byteorder", b"little")
        z.writestr(name, payload)
        z.writestr("archive/version", b"3\n")
    return path


class _Reduce:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def lie_about_sizes(path, record: str, size: int):
    """Rewrite the central directory entry of `record` to claim `size` bytes (stored)."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + name_len] == record.encode():
            struct.pack_into("<II", data, at + 20, size, size)
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))


def test_a_plain_archive_of_the_same_shape_loads(tmp_path):
    """The crafted archives below differ from this loadable one only in what is hostile."""
    path = tensor_archive(tmp_path / "ok.pt", torch.arange(8.0).numpy().tobytes())
    assert torch.equal(load(path)["w"], torch.arange(8.0))


def test_compressed_record_is_refused_before_inflating(tmp_path):
    """A compressed record (under 1 MB on disk, 64 MB inflated) is refused by load() and
    verify() before anything is inflated: checkpoints are stored, never compressed."""
    path = tensor_archive(tmp_path / "bomb.pt", bytes(64 << 20), compression=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 1 << 20
    for check in (load, verify):
        with pytest.raises(CorruptCheckpointError, match="compression"):
            check(path)


@pytest.mark.parametrize("claimed", [int(3.75 * GIB), 2**32 - 2])
def test_sizes_beyond_the_file_are_refused(tmp_path, claimed):
    """A small file whose headers claim a record of gigabytes is refused before anything is
    allocated for it: sizes must fit in the file."""
    path = tensor_archive(tmp_path / "liar.pt", bytes(64))
    lie_about_sizes(path, "archive/data/0", claimed)
    assert path.stat().st_size < 4096
    for check in (load, verify):
        with pytest.raises(CorruptCheckpointError):
            check(path)


@pytest.mark.parametrize("name", ["archive/../data/0", "archive/data/../../0", "/archive/data/0"])
def test_names_leaving_the_archive_are_refused(tmp_path, name):
    """Record names containing '..' or starting with '/' are refused by load() and verify()."""
    path = tensor_archive(tmp_path / "dots.pt", bytes(64), name=name)
    for check in (load, verify):
        with pytest.raises(CorruptCheckpointError):
            check(path)


def test_torch_save_files_and_our_own_still_load(tmp_path):
    torch.save({"a": torch.ones(3), "b": [1, 2]}, tmp_path / "plain.pt")
    assert load(tmp_path / "plain.pt")["b"] == [1, 2]
    assert torch.equal(load(tmp_path / "plain.pt", mmap=True)["a"], torch.ones(3))
    with AsyncCheckpointer(tmp_path / "c") as ckpt:
        path = ckpt.save({"a": torch.ones(3)}, 1).result()
    assert torch.equal(load(path)["a"], torch.ones(3))
    (tmp_path / "text.pt").write_text("not a zip at all")
    with pytest.raises(CorruptCheckpointError, match="not a zip|zip archive|end of central"):
        load(tmp_path / "text.pt")


def code_archive(path, marker):
    """A torch.save file whose unpickling would run ``touch marker`` (through os.system)."""
    torch.save({"w": torch.ones(2), "run": _Reduce(os.system, (f"touch {shlex.quote(str(marker))}",))}, path)
    return path


SYSTEM = f"{os.system.__module__}.system"  # posix.system where os.system comes from posix


@pytest.mark.parametrize("mmap", [False, True])
def test_a_pickle_calling_code_is_refused_in_one_line(tmp_path, mmap):
    """A pickle that would call code is refused in one line naming the global, without torch's
    advice to load with weights_only=False; the code never runs."""
    marker = tmp_path / "ran"
    path = code_archive(tmp_path / "code.pt", marker)
    with pytest.raises(UnsafeCheckpointError) as caught:
        load(path, mmap=mmap)
    message = str(caught.value)
    assert message == (f"refused: {path} contains code ({SYSTEM}); qrnn loads checkpoints with "
                       "weights_only=True"), message
    assert caught.value.global_name == SYSTEM and caught.value.path == str(path)
    assert isinstance(caught.value.__cause__, pickle.UnpicklingError)  # torch's own words, for debugging
    assert isinstance(caught.value, (CorruptCheckpointError, pickle.UnpicklingError))
    assert not marker.exists()


def test_a_pickle_refused_for_another_reason_says_so_in_one_line(tmp_path):
    """A persistent id torch does not accept names no global: the generic wording."""
    path = tmp_path / "odd.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02X\x03\x00\x00\x00abcQ.")  # BINPERSID of a str
        z.writestr("archive/byteorder", b"little")
        z.writestr("archive/version", b"3\n")
    with pytest.raises(UnsafeCheckpointError) as caught:
        load(path)
    assert str(caught.value) == (f"refused: {path} contains a pickled object outside the allowed types; qrnn "
                                 "loads checkpoints with weights_only=True")
    assert caught.value.global_name is None


@pytest.mark.parametrize("message, name", [
    ("Weights only load failed. ... WeightsUnpickler error: Unsupported global: GLOBAL posix.system was not an "
     "allowed global by default. Please use `torch.serialization.add_safe_globals([posix.system])`", "posix.system"),
    ("Weights only load failed. ...\n\nTrying to load unsupported GLOBAL sys.modules whose module sys is blocked.",
     "sys.modules"),
    ("Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely succeed\n"
     "Unsupported class nt.system", "nt.system"),
    ("Weights only load failed. persistent_load id must be tuple or int, but got <class 'str'>", None),
    ("GLOBAL " + "a" * 500, None),
])
def test_the_refused_global_is_read_from_each_torch_wording(message, name):
    """torch 2.4 to 2.13 word the refusal differently (and older ones said "Unsupported class")."""
    assert refused_global(message) == name


# ---- the commands: one line, exit code 2 ----------------------------------------------

def one_line_error(capsys, message):
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("state", [{"format": "qrnn-lm/1"}, {"format": "qrnn-lm/1", "settings": {}, "vocab": {},
                                                               "data": {}, "model_config": {}}])
def test_foreign_file_with_the_format_key_is_one_line(tmp_path, capsys, state):
    """A file with qrnn-train's format key but not its contents: --resume says so in one line,
    exit code 2, no traceback."""
    run = tmp_path / "run"
    run.mkdir()
    torch.save(state, run / "ckpt-000000000001.pt")
    assert train_main(["--resume", "--checkpoint-dir", str(run), "--no-progress"]) == 2
    one_line_error(capsys, "is not a complete qrnn-train checkpoint")
    assert generate_main(["--checkpoint", str(run / "ckpt-000000000001.pt")]) == 2
    one_line_error(capsys, "is not a complete qrnn-train checkpoint")


def test_hostile_file_is_one_line_for_both_commands(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    tensor_archive(run / "ckpt-000000000001.pt", bytes(1 << 20), compression=zipfile.ZIP_DEFLATED)
    assert train_main(["--resume", "--checkpoint-dir", str(run), "--no-progress"]) == 2
    one_line_error(capsys, "is damaged")
    assert generate_main(["--checkpoint", str(run)]) == 2
    one_line_error(capsys, "is damaged")


def test_code_in_a_checkpoint_is_one_line_for_both_commands(tmp_path, capsys):
    run, marker = tmp_path / "run", tmp_path / "ran"
    run.mkdir()
    path = code_archive(run / "ckpt-000000000001.pt", marker)
    assert train_main(["--resume", "--checkpoint-dir", str(run), "--no-progress"]) == 2
    assert "False" not in one_line_error(capsys, f"contains code ({SYSTEM})")  # no weights_only=False advice
    assert generate_main(["--checkpoint", str(path)]) == 2
    assert "False" not in one_line_error(capsys, f"contains code ({SYSTEM})")
    assert not marker.exists()


HOLDER = """
import sys
from qrnn.checkpoint import AsyncCheckpointer
ckpt = AsyncCheckpointer(sys.argv[1])
ckpt.write_file("notes.txt", b"mine")   # takes the folder's writer lock
print("ready", flush=True)
sys.stdin.readline()
"""


def test_checkpoint_error_while_training_is_one_line_exit_2(tmp_path, capsys):
    """A run folder another writer holds ends qrnn-train at start-up (its writer lock is
    taken before any work) with one line naming the holder and exit code 2, as for every
    error qrnn-train reports."""
    run = tmp_path / "run"
    data = tmp_path / "text.txt"
    data.write_text("hello world, a tiny corpus. " * 100)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), str(run)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        code = train_main(["--data", str(data), "--checkpoint-dir", str(run), "--epochs", "1", "--max-steps", "2",
                           "--layers", "1", "--hidden", "8", "--emsize", "8", "--batch-size", "2", "--bptt", "8",
                           "--sample-length", "0", "--no-progress", "--device", "cpu"])
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert code == 2
    err = capsys.readouterr().err
    assert f"{run} is in use by pid {holder.pid} on host" in err and "Traceback" not in err, err
    assert err.count("\n") == 1, err
