"""The corpus cache as untrusted input: a shared data folder that someone else can write to.
Whatever is found in ``.qrnn-cache`` (forged ids with recomputed checksums, links, devices,
FIFOs, edited JSON, another level's vocabulary, stale temporaries of killed builders) is
either rebuilt with one message or refused in one line: never followed, never read forever,
never trained on. Opening a cache that may block runs in a child process with a timeout."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from qrnn.train import cache as cache_module
from qrnn.train.cache import cached_corpus
from qrnn.train.data import DataError, default_text, load_corpus


def _quiet(*args, **kwargs):
    pass


@pytest.fixture
def text_file(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "corpus.txt"
    path.write_text(default_text()[:80_000], encoding="utf-8")
    return path


def _build(path, level="word"):
    corpus, info = cached_corpus(str(path), level, say=_quiet, progress=False)
    return corpus, Path(info.folder)


def _reopen(path, level="word"):
    """(corpus, messages) of a second open, which must rebuild."""
    messages = []
    corpus, info = cached_corpus(str(path), level, say=lambda m, **k: messages.append(m), progress=False)
    assert info.built_here, messages
    return corpus, messages


def _forge(folder, meta=None, vocab=None, ids=None):
    """Rewrite the cache in `folder` as an attacker who knows the format would: the given
    meta fields, vocabulary state or train ids, then every checksum and range recomputed."""
    meta_path = folder / "meta.json"
    state = json.loads(meta_path.read_text())
    if ids is not None:
        raw = np.asarray(ids, dtype="<i4").tobytes()
        (folder / "train.i32").write_bytes(raw)
        state["files"]["train"].update(tokens=len(ids), crc32=zlib.crc32(raw), min=int(min(ids)), max=int(max(ids)))
    if vocab is not None:
        data = json.dumps(vocab).encode()
        (folder / "vocab.json").write_bytes(data)
        state.update(vocab_crc32=zlib.crc32(data), vocab_bytes=len(data))
    state.update(meta or {})
    for key in [k for k, v in (meta or {}).items() if v is None]:
        del state[key]
    state["meta_crc32"] = cache_module._meta_checksum(state)
    meta_path.write_text(json.dumps(state))


def _same_as_in_memory(corpus, path, level="word"):
    want = load_corpus(str(path), level)
    assert corpus.vocab == want.vocab
    for got, expected in zip((corpus.train, corpus.valid, corpus.test), (want.train, want.valid, want.test)):
        assert torch.equal(got.long(), expected)


# 1. Token ids outside the vocabulary, with every checksum recomputed.
@pytest.mark.parametrize("bad", ["too large", "negative"])
def test_forged_ids_outside_the_vocabulary_are_rebuilt(text_file, bad):
    corpus, folder = _build(text_file)
    ids = corpus.train.long().tolist()
    ids[len(ids) // 2] = len(corpus.vocab) if bad == "too large" else -3
    _forge(folder, ids=ids)
    rebuilt, messages = _reopen(text_file)
    assert any(f"{folder} cannot be used (train.i32 holds token ids" in m and "outside the vocabulary" in m
               for m in messages), messages
    _same_as_in_memory(rebuilt, text_file)


def test_recorded_range_must_match_the_ids(text_file):
    corpus, folder = _build(text_file)
    ids = corpus.train.long().tolist()
    ids[7] = len(corpus.vocab) + 5
    _forge(folder, ids=ids, meta=None)
    state = json.loads((folder / "meta.json").read_text())
    state["files"]["train"]["max"] = len(corpus.vocab) - 1  # a range that claims to be in bounds
    _forge(folder, meta={"files": state["files"]})
    _, messages = _reopen(text_file)
    assert any("outside the vocabulary" in m for m in messages), messages


def test_qrnn_train_with_a_forged_cache_trains_on_the_real_ids(text_file, tmp_path):
    """The run that used to finish with rc 0 leaving forged targets out of the adaptive
    softmax's loss: in a real process, the forged cache is rebuilt first."""
    corpus, folder = _build(text_file)
    ids = corpus.train.long().tolist()
    ids[len(ids) // 3: len(ids) // 3 + 50] = [len(corpus.vocab) + 100] * 50
    _forge(folder, ids=ids)
    run = subprocess.run(
        [sys.executable, "-m", "qrnn.train", "--data", str(text_file), "--level", "word", "--softmax", "adaptive",
         "--layers", "1", "--hidden", "16", "--emsize", "8", "--batch-size", "4", "--bptt", "8", "--max-steps", "2",
         "--precision", "fp32", "--no-progress", "--sample-length", "0", "--checkpoint-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr
    assert "outside the vocabulary" in run.stdout and "rebuilding it" in run.stdout, run.stdout
    rebuilt, _ = cached_corpus(str(text_file), "word", say=_quiet, progress=False)
    _same_as_in_memory(rebuilt, text_file)


# 2. Entries that are not regular files: never followed, never read, never waited on.
_OPEN_IN_CHILD = ("import sys; from qrnn.train.cache import cached_corpus; "
                  "c, info = cached_corpus(sys.argv[1], 'word', progress=False); print('built', info.built_here)")


def _open_in_child(path):
    run = subprocess.run([sys.executable, "-c", _OPEN_IN_CHILD, str(path)], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr
    return run.stdout


@pytest.mark.parametrize("entry, replacement", [
    ("valid.i32", "link to /dev/zero"),
    ("train.i32", "fifo"),
    ("vocab.json", "link to /dev/zero"),
    ("meta.json", "link to /dev/zero"),
    ("meta.json", "fifo"),
    ("meta.json", "huge"),
    ("test.i32", "link to a copy"),
])
def test_entries_that_are_not_regular_files_are_never_read(text_file, entry, replacement):
    _, folder = _build(text_file)
    if entry == "valid.i32":  # meta says 0 tokens: a link to /dev/zero would be read forever
        _forge(folder, meta={"files": {**json.loads((folder / "meta.json").read_text())["files"],
                                       "valid": {"tokens": 0, "crc32": 0, "min": 0, "max": 0}}})
    target = folder / entry
    if replacement == "link to a copy":
        copy = folder.parent / "elsewhere.i32"
        copy.write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(copy)
    else:
        target.unlink()
        if replacement == "fifo":
            os.mkfifo(target)
        elif replacement == "huge":  # a regular file far larger than any meta.json
            with open(target, "wb") as fh:
                fh.truncate(4 << 30)
        else:
            target.symlink_to("/dev/zero")
    out = _open_in_child(text_file)
    assert out.startswith("corpus cache: ") and "cannot be used" in out and "built True" in out, out
    reason = {"fifo": "is not a regular file", "huge": "is larger than a cache writes it"}.get(
        replacement, "is a symbolic link")
    assert f"({entry} {reason}" in out, out


# 3. Edited JSON: rebuilt with one message, never a traceback.
def _vocab_state(folder):
    return json.loads((folder / "vocab.json").read_text())


@pytest.mark.parametrize("edit", ["list token", "first token", "duplicate word", "no builder", "string fingerprint",
                                  "meta as a list", "meta edited, checksum kept", "vocab as a number"])
def test_edited_json_is_rebuilt_with_one_message(text_file, edit):
    _, folder = _build(text_file)
    vocab = _vocab_state(folder)
    if edit == "list token":
        _forge(folder, vocab={**vocab, "tokens": vocab["tokens"][:5] + [["a"]] + vocab["tokens"][6:]})
    elif edit == "first token":
        _forge(folder, vocab={**vocab, "tokens": ["the"] + vocab["tokens"][1:]})
    elif edit == "duplicate word":
        _forge(folder, vocab={**vocab, "tokens": vocab["tokens"][:5] + [vocab["tokens"][1]] + vocab["tokens"][6:]})
    elif edit == "no builder":
        _forge(folder, meta={"builder": None})
    elif edit == "string fingerprint":
        _forge(folder, meta={"fingerprint": "0"})
    elif edit == "meta as a list":
        (folder / "meta.json").write_text("[1, 2]")
    elif edit == "meta edited, checksum kept":
        state = json.loads((folder / "meta.json").read_text())
        state["files"]["test"]["tokens"] -= 1
        (folder / "meta.json").write_text(json.dumps(state))
    else:
        _forge(folder, vocab=7)
    rebuilt, messages = _reopen(text_file)
    assert len([m for m in messages if "cannot be used" in m]) == 1, messages
    _same_as_in_memory(rebuilt, text_file)


# 4. Another level's vocabulary under this level's key.
def test_a_char_vocabulary_under_a_word_key_is_rebuilt(text_file):
    _, word_folder = _build(text_file, "word")
    _, char_folder = _build(text_file, "char")
    for entry in word_folder.iterdir():
        entry.unlink()
    for entry in char_folder.iterdir():
        (word_folder / entry.name).write_bytes(entry.read_bytes())
    _forge(word_folder, meta={"level": "word"})
    corpus, messages = _reopen(text_file, "word")
    assert any("vocab.json is a char-level vocabulary, not word" in m for m in messages), messages
    assert corpus.vocab.level == "word"
    _same_as_in_memory(corpus, text_file)


# 5. A same-size edit with the modification time put back.
def _unsampled_offset(size):
    """A byte offset of a file of `size` bytes that no sampled CRC block covers."""
    starts = sorted({int(i * max(size - cache_module._FINGERPRINT_BYTES, 0) / (cache_module._FINGERPRINT_SAMPLES - 1))
                     for i in range(cache_module._FINGERPRINT_SAMPLES)})
    for start, following in zip(starts, starts[1:]):
        if following - start > cache_module._FINGERPRINT_BYTES + 2:
            return start + cache_module._FINGERPRINT_BYTES + 1
    raise AssertionError("the file is too small to have an unsampled byte")


def _edit_in_place_keeping_mtime(path, offset, byte):
    info = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset)
        assert fh.read(1) != byte
        fh.seek(offset)
        fh.write(byte)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert path.stat().st_mtime_ns == info.st_mtime_ns and path.stat().st_size == info.st_size


@pytest.fixture
def large_text_file(tmp_path):
    path = tmp_path / "data" / "large.txt"
    path.parent.mkdir()
    line = "the quick brown fox jumps over the lazy dog\n"
    path.write_text(line * ((6 << 20) // len(line)), encoding="utf-8")
    return path


def test_a_same_size_edit_with_its_mtime_restored_is_retokenized(large_text_file):
    before, _ = _build(large_text_file, "char")
    offset = _unsampled_offset(large_text_file.stat().st_size)
    _edit_in_place_keeping_mtime(large_text_file, offset, b"Z")
    after, messages = _reopen(large_text_file, "char")
    assert not torch.equal(before.train, after.train) or not torch.equal(before.valid, after.valid)
    _same_as_in_memory(after, large_text_file, "char")


def test_resume_after_a_hidden_edit_is_refused(large_text_file, tmp_path):
    """The resume guard in a real process: the checkpoint's training ids differ from the edited
    file's, which the cache now tokenizes anew."""
    args = [sys.executable, "-m", "qrnn.train", "--data", str(large_text_file), "--level", "char", "--layers", "1",
            "--hidden", "8", "--emsize", "8", "--batch-size", "2", "--bptt", "8", "--precision", "fp32",
            "--no-progress", "--sample-length", "0", "--checkpoint-dir", str(tmp_path / "run")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.run(args + ["--max-steps", "2"], capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stderr
    _edit_in_place_keeping_mtime(large_text_file, _unsampled_offset(large_text_file.stat().st_size) // 2 * 2, b"Q")
    resumed = subprocess.run(args + ["--max-steps", "4", "--resume"], capture_output=True, text=True, timeout=600,
                             env=env)
    assert resumed.returncode == 2, (resumed.stdout, resumed.stderr)
    assert "the training data differs from the checkpoint's" in resumed.stderr
    assert "Traceback" not in resumed.stderr and resumed.stderr.count("\n") == 1, resumed.stderr


# 6. Temporaries of builders killed with -9.
def test_a_killed_build_leaves_nothing_once_the_next_build_ran(tmp_path):
    path = tmp_path / "data" / "big.txt"
    path.parent.mkdir()
    words = " ".join(f"w{i}" for i in range(3000))
    path.write_text((words + "\n") * 1500, encoding="utf-8")  # ~20 MB: a build of seconds
    child = subprocess.Popen([sys.executable, "-c", _OPEN_IN_CHILD, str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1"))
    root = path.parent / ".qrnn-cache"
    deadline = time.monotonic() + 300
    while not (root.is_dir() and any(".tmp-" in p.name for p in root.iterdir())):
        assert child.poll() is None and time.monotonic() < deadline, "the build never started"
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    assert any(".tmp-" in p.name for p in root.iterdir())  # what kill -9 leaves
    out = _open_in_child(path)
    assert "built True" in out
    assert not [p.name for p in root.iterdir() if ".tmp-" in p.name]


def test_only_temporaries_of_dead_builders_are_removed(text_file):
    root = text_file.parent / ".qrnn-cache"
    root.mkdir()
    dead = root / "other-word-0123.tmp-999999-00000000"  # its key's lock is free
    dead.mkdir()
    (dead / "train.raw").write_bytes(b"x" * 1000)
    (root / "other-word-0123.lock").touch()
    orphan = root / "gone-word-4567.tmp-999998-00000000"  # no lock file at all
    orphan.mkdir()
    alive = root / "busy-word-89ab.tmp-999997-00000000"
    alive.mkdir()
    with open(root / "busy-word-89ab.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a builder at work
        _build(text_file)
    assert not dead.exists() and not orphan.exists() and alive.exists()


# 7. Links inside the cache.
def test_a_cache_root_that_is_a_link_is_refused(text_file, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (text_file.parent / ".qrnn-cache").symlink_to(elsewhere)
    with pytest.raises(DataError, match=r"\.qrnn-cache is a symbolic link or a file, which qrnn-train does not "
                                        r"follow: remove it"):
        cached_corpus(str(text_file), "word", say=_quiet, progress=False)
    assert list(elsewhere.iterdir()) == []


def test_a_key_folder_that_links_to_a_valid_cache_is_replaced(text_file, tmp_path):
    corpus, folder = _build(text_file)
    other = tmp_path / "other.txt"
    other.write_text(default_text()[100_000:180_000], encoding="utf-8")
    _, other_folder = _build(other)  # a validly checksummed cache of another text
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()
    folder.symlink_to(other_folder)
    rebuilt, messages = _reopen(text_file)
    assert any("it is a symbolic link or a file, not a folder" in m for m in messages), messages
    assert folder.is_dir() and not folder.is_symlink() and other_folder.is_dir()
    _same_as_in_memory(rebuilt, text_file)


def test_a_lock_that_is_a_link_is_refused(text_file, tmp_path):
    _, folder = _build(text_file)
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()
    lock = folder.with_name(folder.name + ".lock")
    lock.unlink()
    os.mkfifo(tmp_path / "fifo")
    lock.symlink_to(tmp_path / "fifo")
    with pytest.raises(DataError, match="corpus cache lock .* it is a symbolic link"):
        cached_corpus(str(text_file), "word", say=_quiet, progress=False)


# 8. A refused --data file leaves nothing behind and says nothing first.
@pytest.mark.parametrize("content", [b"", b"\x1f\x8b\x08\x00" + bytes(range(256)) * 40,
                                     "word " * 30_000 + "\n" + "caf\xe9\n"])
def test_a_refused_data_file_creates_nothing(tmp_path, content):
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "corpus.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("latin-1"))
    messages = []
    with pytest.raises(DataError, match="is empty|is not UTF-8 text"):
        cached_corpus(str(path), "word", say=lambda m, **k: messages.append(m), progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["corpus.txt"]
    # Refused at its first bytes: nothing said. A problem past them is found while tokenizing.
    assert messages == [] or len(content) > cache_module._SNIFF_BYTES, messages
