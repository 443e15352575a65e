"""The tokenized corpus cache: the same ids and vocabulary as tokenizing in memory, a hit
that maps instead of tokenizing, a rebuild when the data changes, a damaged or partial cache
rebuilt and never trusted, a data folder that cannot be written, two processes that build
once, and qrnn-train reading through it."""

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from qrnn.train import cache as cache_module
from qrnn.train.cache import cache_root, cached_corpus
from qrnn.train.cli import main as train_main
from qrnn.train.data import BPTTBatches, default_text, load_corpus


def _quiet(*args, **kwargs):
    pass


def _same(a, b):
    assert a.vocab == b.vocab
    for x, y in zip((a.train, a.valid, a.test), (b.train, b.valid, b.test)):
        assert torch.equal(x.long(), y.long())


@pytest.fixture
def text_file(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "corpus.txt"
    # Characters of several UTF-8 lengths in the first half only, and Windows line ends: the
    # 90/5/5 cut counts bytes whether the file is streamed or read whole.
    text = default_text()[:120_000]
    text = text[:60_000].replace("e", "é").replace("a", "𝔞") + text[60_000:]
    text = text.replace("\n", "\r\n")
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.mark.parametrize("level", ["char", "word"])
def test_same_ids_and_vocabulary_as_in_memory(text_file, level, monkeypatch):
    monkeypatch.setattr(cache_module, "BLOCK_BYTES", 4096)  # many blocks, lines cut across them
    corpus, info = cached_corpus(str(text_file), level, say=_quiet, progress=False)
    assert info.built_here
    in_memory = load_corpus(str(text_file), level)
    _same(corpus, in_memory)
    assert corpus.train.dtype == torch.int32
    assert corpus.fingerprint == zlib.crc32(in_memory.train.numpy().tobytes())  # what checkpoints record
    # A folder of three files, with Windows line ends in one of them.
    folder = text_file.parent / "splits"
    folder.mkdir()
    text = default_text()[:60_000]
    for name, part in zip(("train", "valid", "test"), (text[:40_000], text[40_000:50_000], text[50_000:])):
        (folder / f"{name}.txt").write_bytes(part.replace("\n", "\r\n" if name == "valid" else "\n").encode())
    corpus, _ = cached_corpus(str(folder), level, say=_quiet, progress=False)
    _same(corpus, load_corpus(str(folder), level))


def test_a_hit_maps_the_cache(text_file):
    first, info = cached_corpus(str(text_file), "word", say=_quiet, progress=False)
    messages = []
    second, again = cached_corpus(str(text_file), "word", say=messages.append, progress=False)
    assert info.built_here and not again.built_here and again.folder == info.folder and messages == []
    _same(first, second)
    assert again.describe().startswith(f"{info.folder} (built by ")
    assert isinstance(second.train.numpy().base, np.memmap) or second.train.numpy().base is not None
    assert second.fingerprint == first.fingerprint


def test_changed_data_rebuilds(text_file):
    _, info = cached_corpus(str(text_file), "word", say=_quiet, progress=False)
    text_file.write_text(default_text()[:120_000].replace("the", "a"), encoding="utf-8")
    corpus, again = cached_corpus(str(text_file), "word", say=_quiet, progress=False)
    assert again.built_here and again.folder != info.folder
    _same(corpus, load_corpus(str(text_file), "word"))


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "no meta", "bad meta", "vocab"])
def test_a_damaged_cache_is_rebuilt_never_trusted(text_file, damage):
    want, info = cached_corpus(str(text_file), "word", say=_quiet, progress=False)
    want = load_corpus(str(text_file), "word")
    folder = Path(info.folder)
    ids = folder / "train.i32"
    if damage == "flip a byte":
        data = bytearray(ids.read_bytes())
        data[len(data) // 2] ^= 0x10
        ids.write_bytes(bytes(data))
    elif damage == "truncate":
        ids.write_bytes(ids.read_bytes()[:-4])
    elif damage == "no meta":
        (folder / "meta.json").unlink()  # a build killed before its last file
    elif damage == "bad meta":
        (folder / "meta.json").write_text("{")
    else:
        (folder / "vocab.json").write_text(json.dumps({"level": "word", "tokens": ["<unk>", "x"]}))
    messages = []
    corpus, again = cached_corpus(str(text_file), "word", say=lambda m, **k: messages.append(m), progress=False)
    assert again.built_here
    assert any(m.startswith(f"corpus cache: {folder} cannot be used (") and m.endswith("): rebuilding it")
               for m in messages), messages
    _same(corpus, want)


def test_an_unwritable_data_folder_puts_the_cache_in_the_cache_dir(text_file, tmp_path, monkeypatch):
    monkeypatch.setenv("QRNN_CACHE_DIR", str(tmp_path / "cache"))
    # /proc cannot take a folder, even for root.
    assert cache_root(Path("/proc")) == tmp_path / "cache" / "corpora"
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == text_file.parent
                        else real_access(path, mode))
    corpus, info = cached_corpus(str(text_file), "word", say=_quiet, progress=False)
    assert info.folder.startswith(str(tmp_path / "cache" / "corpora"))
    assert not (text_file.parent / ".qrnn-cache").exists()
    monkeypatch.delenv("QRNN_CACHE_DIR")
    assert cache_root(Path("/proc")) == Path.home() / ".cache" / "torch-qrnn" / "corpora"


def test_two_processes_build_once(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text(default_text() * 3, encoding="utf-8")
    code = ("import sys; from qrnn.train.cache import cached_corpus; "
            "c, info = cached_corpus(sys.argv[1], 'word', say=lambda *a, **k: None, progress=False); "
            "print(info.built_here, c.fingerprint, info.builder)")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300)[0].split(maxsplit=2) for p in procs]
    assert sorted(out[0] for out in outputs) == ["False", "True"]  # one built, one mapped
    assert outputs[0][1] == outputs[1][1]  # the same ids
    assert outputs[0][2] == outputs[1][2]  # each names the one builder


def test_batches_over_mapped_ids_equal_batches_over_a_tensor(text_file):
    corpus, _ = cached_corpus(str(text_file), "word", say=_quiet, progress=False)
    for rank in range(2):
        mapped = BPTTBatches(corpus.train, 8, 10, rank, 2)
        plain = BPTTBatches(corpus.train.long().clone(), 8, 10, rank, 2)
        assert len(mapped) == len(plain)
        for i in (0, len(plain) // 2, len(plain) - 1):
            for a, b in zip(mapped[i], plain[i]):
                assert a.dtype == torch.int64 and torch.equal(a, b)


def test_qrnn_train_reads_through_the_cache_and_resumes(text_file, tmp_path, capsys):
    args = ["--data", str(text_file), "--level", "word", "--layers", "2", "--hidden", "16", "--emsize", "8",
            "--batch-size", "4", "--bptt", "8", "--precision", "fp32", "--no-progress", "--sample-length", "0",
            "--checkpoint-dir", str(tmp_path / "run")]
    assert train_main(args + ["--max-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "corpus cache: tokenizing corpus once into" in out and "(built here in" in out
    assert train_main(args + ["--max-steps", "6", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "tokenizing" not in out and "corpus cache: " in out and "(built by " in out
