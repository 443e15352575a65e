"""The tokenized corpus cache: a text corpus is tokenized once, streamed with bounded memory,
into token-id files that every later start, every rank and every restart maps.

A cache is a folder named by a key over the data files' identity (real path, size,
modification time, a sampled content fingerprint), the token level and the format version.
It holds ``train.i32``, ``valid.i32``, ``test.i32`` (little-endian int32 token ids),
``vocab.json`` and ``meta.json`` (token counts, each file's CRC-32, the training ids'
fingerprint, who built it, when, in how long), written in a temporary folder renamed into
place. Reading checks everything before trusting it: a partial or damaged cache (a killed
build, a flipped byte) is rebuilt, never used. The ids are memory-mapped copy-on-write, so
their pages are shared through the page cache: a rank's private memory for data stays
small.

One process builds while the others wait: an exclusive ``flock`` on ``<key>.lock`` beside
the cache (every rank of a host shares it). The cache lives in ``.qrnn-cache`` beside the
data, or, where that folder cannot be written, under ``$QRNN_CACHE_DIR`` (default
``~/.cache/torch-qrnn``), in ``corpora/``.
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import socket
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from .data import EOS, LEVELS, SPLITS, UNK, Corpus, DataError, Vocabulary, decode_file_text, line_cuts, split_files

__all__ = ["CACHE_VERSION", "CacheInfo", "cached_corpus", "cache_root", "ids_fingerprint", "data_identity",
           "check_data_identity"]

CACHE_VERSION = 1
BLOCK_BYTES = 4 << 20  # text read and tokenized per block: bounds the build's memory
_FINGERPRINT_SAMPLES = 64
_FINGERPRINT_BYTES = 64 << 10


@dataclass
class CacheInfo:
    """Where the corpus came from: the cache folder and whether this process built it."""

    folder: str
    built_here: bool
    builder: str      # who built it: "host pid N (rank R)"
    build_seconds: float

    def describe(self) -> str:
        how = "built here" if self.built_here else f"built by {self.builder}"
        return f"{self.folder} ({how} in {self.build_seconds:.1f} s)"


def cache_root(data_folder: Path) -> Path:
    """``.qrnn-cache`` beside the data if that folder can be written, else
    ``$QRNN_CACHE_DIR/corpora`` (default ``~/.cache/torch-qrnn/corpora``)."""
    beside = data_folder / ".qrnn-cache"
    if os.access(data_folder, os.W_OK):
        try:  # access() says yes to root everywhere: try it
            beside.mkdir(exist_ok=True)
            probe = beside / f".probe-{os.getpid()}"
            probe.touch()
            probe.unlink()
            return beside
        except OSError:
            pass
    base = os.environ.get("QRNN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torch-qrnn")
    return Path(base) / "corpora"


def _sampled_crcs(path: Path, size: int) -> list:
    """CRC-32s of sampled blocks of a file of `size` bytes: its start, its end and 64 evenly
    spaced blocks (a changed file changes them without a read of all of it)."""
    crcs = []
    with open(path, "rb") as fh:
        for offset in sorted({int(i * max(size - _FINGERPRINT_BYTES, 0) / (_FINGERPRINT_SAMPLES - 1))
                              for i in range(_FINGERPRINT_SAMPLES)}):
            fh.seek(offset)
            crcs.append(zlib.crc32(fh.read(_FINGERPRINT_BYTES)))
    return crcs


def _file_identity(path: Path) -> list:
    """Real path, size, modification time and sampled CRC-32s: the cache's key."""
    stat = path.stat()
    return [str(path.resolve()), stat.st_size, stat.st_mtime_ns, _sampled_crcs(path, stat.st_size)]


def data_identity(path: str) -> dict:
    """What a checkpoint records of ``--data path`` so that a later resume may trust the same
    path only if it still holds the same text: each split file's size and sampled CRC-32s."""
    files, _ = split_files(path)
    return {split: {"size": file.stat().st_size, "crcs": _sampled_crcs(file, file.stat().st_size)}
            for split, file in files.items()}


def check_data_identity(path: str, recorded) -> None:
    """DataError unless ``--data path`` is what `recorded` (:func:`data_identity`) describes:
    regular files of the recorded sizes (compared before a byte is read), then the same
    sampled CRC-32s. Guards a data path that comes from a checkpoint, not from the user."""
    if not isinstance(recorded, dict) or set(recorded) != set(SPLITS):
        raise DataError("the checkpoint does not record its data files")
    files, _ = split_files(path)
    for split, file in files.items():
        want = recorded[split]
        size = file.stat().st_size
        if not isinstance(want, dict) or want.get("size") != size:
            raise DataError(f"{file} is not the file the checkpoint was trained on (its size differs)")
    for split, file in files.items():
        if recorded[split].get("crcs") != _sampled_crcs(file, file.stat().st_size):
            raise DataError(f"{file} is not the file the checkpoint was trained on (its content differs)")


def ids_fingerprint(ids: np.ndarray) -> int:
    """CRC-32 of the ids as int64 (the fingerprint checkpoints record), computed in blocks."""
    crc = 0
    for start in range(0, len(ids), 1 << 20):
        crc = zlib.crc32(np.ascontiguousarray(ids[start: start + (1 << 20)], dtype="<i8").tobytes(), crc)
    return crc


def _text_blocks(path: Path, start: int, stop: int, progress) -> Iterator[str]:
    """The text of bytes [start, stop) of `path` (UTF-8 without NUL bytes, else a DataError
    at the first block that is not: :func:`decode_file_text`), universal newlines, in blocks
    ending at a line end."""
    with open(path, "rb") as fh:
        fh.seek(start)
        left, carry, offset = stop - start, b"", start  # offset: the file offset of carry
        while left > 0 or carry:
            data = fh.read(min(BLOCK_BYTES, left)) if left > 0 else b""
            left -= len(data)
            progress(len(data))
            data = carry + data
            cut = data.rfind(b"\n") + 1 if left > 0 else len(data)
            if cut == 0 and left > 0:  # a line longer than a block: keep reading
                carry = data
                continue
            block, carry = data[:cut], data[cut:]
            if block:
                # A block ends at a newline byte, which is never inside a UTF-8 character:
                # only the last block may end in a character cut short.
                yield decode_file_text(block, path, offset, at_end=left == 0 and not carry)
            offset += cut


def _split_ranges(files: dict) -> dict:
    """(path, start byte, stop byte) of each split: whole files, or one file cut 90/5/5 at
    line ends (as ``split_text`` cuts a text)."""
    if len(set(files.values())) == len(SPLITS):
        return {split: (files[split], 0, files[split].stat().st_size) for split in SPLITS}
    path = files["train"]
    size = path.stat().st_size
    with open(path, "rb") as fh:
        cuts = line_cuts(size, lambda offset: _newline_at(fh, offset))
    return {"train": (path, 0, cuts[0]), "valid": (path, cuts[0], cuts[1]), "test": (path, cuts[1], size)}


def _newline_at(fh, offset: int) -> int:
    fh.seek(offset)
    while True:
        chunk = fh.read(1 << 20)
        if not chunk:
            return -1
        found = chunk.find(b"\n")
        if found >= 0:
            return offset + found
        offset += len(chunk)


def _word_ids(words: dict, tokens: list) -> np.ndarray:
    """Provisional ids of `tokens`: each word's order of first appearance, new words added
    to `words`. New words are stored as fresh copies made once the block's strings are
    freed: a kept string of a block would otherwise hold on to the memory of its block."""
    ids = np.fromiter(map(words.get, tokens, itertools.repeat(-1)), dtype=np.int64, count=len(tokens))
    unknown = np.flatnonzero(ids < 0)
    if len(unknown):
        new = dict.fromkeys(tokens[i] for i in unknown)
        first = len(words)
        local = {word: first + i for i, word in enumerate(new)}
        ids[unknown] = np.fromiter(map(local.__getitem__, (tokens[i] for i in unknown)), dtype=np.int64,
                                   count=len(unknown))
        packed = "\n".join(new)  # one large string: not in the small-object pools
        del new, local
        tokens.clear()
        for i, word in enumerate(packed.split("\n")):
            words[word] = first + i
    return ids


def _build(folder: Path, ranges: dict, level: str, name: str, progress: bool) -> dict:
    """Tokenize the splits into `folder`: one pass over the text, provisional ids written as
    they come (first-appearance word ids, or code points for characters), then remapped to
    the vocabulary's ids in bounded blocks."""
    from tqdm.auto import tqdm

    total = sum(stop - start for _, start, stop in ranges.values())
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"tokenizing {name}", leave=False,
               disable=not progress, dynamic_ncols=True)
    words: dict = {}
    counts = np.zeros(0, dtype=np.int64)
    codes_seen: set = set()
    has_text = {}
    with bar:
        for split, (path, start, stop) in ranges.items():
            has_text[split] = False
            with open(folder / f"{split}.raw", "wb") as out:
                for text in _text_blocks(path, start, stop, bar.update):
                    has_text[split] = has_text[split] or bool(text.strip())
                    if level == "char":
                        ids = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
                        if split == "train":
                            codes_seen.update(np.unique(ids).tolist())
                    else:
                        ids = _word_ids(words, text.replace("\n", f" {EOS} ").split())
                        if split == "train":
                            if len(words) > len(counts):
                                counts = np.concatenate([counts, np.zeros(len(words) - len(counts), np.int64)])
                            counts += np.bincount(ids, minlength=len(counts))
                        ids = ids.astype("<u4")
                    out.write(ids.tobytes())
    for split in SPLITS:
        if not has_text[split]:
            raise DataError(f"--data {name}: the {split} split is empty")
    # The vocabulary, as Vocabulary.build makes it, and each provisional id's final id.
    if level == "char":
        codes = np.array(sorted(codes_seen), dtype=np.uint32)
        vocab = Vocabulary(level, [UNK] + [chr(c) for c in codes.tolist()])

        def final(raw: np.ndarray) -> np.ndarray:
            pos = np.searchsorted(codes, raw)
            found = pos < len(codes)
            found[found] = codes[pos[found]] == raw[found]
            return np.where(found, pos + 1, 0)
    else:
        by_id = list(words)
        seen = collections.Counter({by_id[i]: int(c) for i, c in enumerate(counts) if c})
        seen.pop(UNK, None)
        ordered = sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))
        vocab = Vocabulary(level, [UNK] + [word for word, _ in ordered])
        table = np.zeros(len(words), dtype=np.int32)  # words never in training (and <unk>): 0
        index = {word: i for i, word in enumerate(vocab.tokens)}
        for word, provisional in words.items():
            table[provisional] = index.get(word, 0)

        def final(raw: np.ndarray) -> np.ndarray:
            return table[raw]
    meta: dict = {"version": CACHE_VERSION, "level": level, "files": {}}
    for split in SPLITS:  # read in blocks, not mapped: the build's memory stays its own
        crc = fingerprint = 0
        with open(folder / f"{split}.raw", "rb") as src, open(folder / f"{split}.i32", "wb") as out:
            while len(raw := np.fromfile(src, dtype="<u4", count=1 << 22)):
                block = final(raw).astype("<i4")
                crc = zlib.crc32(block.tobytes(), crc)
                if split == "train":  # ids_fingerprint, block by block
                    fingerprint = zlib.crc32(block.astype("<i8").tobytes(), fingerprint)
                out.write(block.tobytes())
        os.unlink(folder / f"{split}.raw")
        meta["files"][split] = {"tokens": os.path.getsize(folder / f"{split}.i32") // 4, "crc32": crc}
        if split == "train":
            meta["fingerprint"] = fingerprint
    vocab_bytes = json.dumps(vocab.state_dict()).encode()
    (folder / "vocab.json").write_bytes(vocab_bytes)
    meta["vocab_crc32"] = zlib.crc32(vocab_bytes)
    return meta


def _check(folder: Path, level: str) -> Optional[str]:
    """None if the cache in `folder` is complete and intact, else what is wrong."""
    try:
        meta = json.loads((folder / "meta.json").read_text())
        if meta.get("version") != CACHE_VERSION or meta.get("level") != level:
            return "another version or level"
        if zlib.crc32((folder / "vocab.json").read_bytes()) != meta["vocab_crc32"]:
            return "vocab.json does not match its checksum"
        for split in SPLITS:
            path, want = folder / f"{split}.i32", meta["files"][split]
            if os.path.getsize(path) != 4 * want["tokens"]:
                return f"{path.name} has the wrong size"
            crc = 0
            with open(path, "rb") as fh:
                while block := fh.read(8 << 20):
                    crc = zlib.crc32(block, crc)
            if crc != want["crc32"]:
                return f"{path.name} does not match its checksum"
    except FileNotFoundError:
        return "incomplete"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"unreadable ({type(err).__name__}: {err})"
    return None


def _open(folder: Path, name: str) -> Corpus:
    meta = json.loads((folder / "meta.json").read_text())
    vocab = Vocabulary.from_state_dict(json.loads((folder / "vocab.json").read_text()))
    ids = []
    for split in SPLITS:
        if meta["files"][split]["tokens"]:
            # Copy-on-write: writable for torch (no warning), shared pages until written (never).
            ids.append(torch.from_numpy(np.memmap(folder / f"{split}.i32", dtype="<i4", mode="c")))
        else:
            ids.append(torch.zeros(0, dtype=torch.int32))
    return Corpus(name, vocab, ids[0], ids[1], ids[2], fingerprint=int(meta["fingerprint"]))


def cached_corpus(path: str, level: str, say: Callable = print, progress: bool = True) -> tuple:
    """(Corpus with memory-mapped int32 ids, CacheInfo) for ``--data path`` (a folder with
    the three splits, or one text file), tokenized once per data version; `say` tells what
    is happening, `progress` shows tqdm's bar while tokenizing."""
    if level not in LEVELS:
        raise DataError(f"--level must be one of {', '.join(LEVELS)}, got {level!r}")
    files, name = split_files(path)
    ranges = _split_ranges(files)
    identity = [CACHE_VERSION, level] + [_file_identity(p) for p in dict.fromkeys(files.values())]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:24]
    root = cache_root(next(iter(files.values())).parent)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(f"cannot create the corpus cache folder {root}: {err.strerror or err}; set "
                        "QRNN_CACHE_DIR to a writable folder") from None
    folder = root / f"{name}-{level}-{key}"
    problem = _check(folder, level) if folder.exists() else "absent"
    built_here = False
    if problem is not None:
        with open(root / f"{folder.name}.lock", "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"corpus cache: waiting for the process building {folder}", flush=True)
                fcntl.flock(lock, fcntl.LOCK_EX)
            problem = _check(folder, level) if folder.exists() else "absent"
            if problem is not None:  # this process builds it
                if problem != "absent":
                    say(f"corpus cache: {folder} is damaged ({problem}): rebuilding it", flush=True)
                say(f"corpus cache: tokenizing {name} once into {folder}", flush=True)
                _build_into(folder, ranges, level, name, progress)
                built_here = True
    meta = json.loads((folder / "meta.json").read_text())
    corpus = _open(folder, name)
    return corpus, CacheInfo(str(folder), built_here, meta["builder"], meta["seconds"])


def _build_into(folder: Path, ranges: dict, level: str, name: str, progress: bool) -> None:
    start = time.perf_counter()
    work = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        meta = _build(work, ranges, level, name, progress)
        rank = os.environ.get("RANK")
        meta["builder"] = f"{socket.gethostname()} pid {os.getpid()}" + (f" (rank {rank})" if rank else "")
        meta["seconds"] = time.perf_counter() - start
        meta["built"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        (work / "meta.json").write_text(json.dumps(meta))
        for entry in work.iterdir():
            with open(entry, "rb") as fh:
                os.fsync(fh.fileno())
        shutil.rmtree(folder, ignore_errors=True)  # a damaged one
        os.rename(work, folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
