"""The tokenized corpus cache: a text corpus is tokenized once, streamed with bounded memory,
into token-id files that every later start, every rank and every restart maps.

A cache is a folder named by a key over the data files' identity (real path, size,
modification time, a sampled content fingerprint), the token level and the format version.
It holds ``train.i32``, ``valid.i32``, ``test.i32`` (little-endian int32 token ids),
``vocab.json`` and ``meta.json`` (token counts, each file's CRC-32, the training ids'
fingerprint, each split's id range, who built it, when, in how long, and its own
checksum), written in a temporary folder renamed into place. Reading checks everything
before trusting it, as input that anyone who can write beside the data may have made: each
entry is opened relative to the folder's descriptor, following no link, and must be a
regular file; the JSON is checked field by field; every id is checked against the
vocabulary on the very pages that are then used. A partial, damaged or crafted cache is
rebuilt, never used. The ids are memory-mapped copy-on-write, so
their pages are shared through the page cache: a rank's private memory for data stays
small.

One process builds while the others wait: an exclusive ``flock`` on ``<key>.lock`` beside
the cache (every rank of a host shares it). The cache lives in ``.qrnn-cache`` beside the
data, or, where that folder cannot be written, under ``$QRNN_CACHE_DIR`` (default
``~/.cache/torch-qrnn``), in ``corpora/``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import socket
import stat
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from .data import LEVELS, SPLITS, Corpus, DataError, Tokenizer, Vocabulary, decode_file_text, line_cuts, split_files

__all__ = ["CACHE_VERSION", "CacheInfo", "cached_corpus", "cache_root", "ids_fingerprint", "data_identity",
           "check_data_identity"]

CACHE_VERSION = 2  # 2: meta.json checksummed, with each split's id range
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
    if beside.is_symlink():  # refused by the caller, never written through
        return beside
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
    """Real path, device and inode, size, modification and change times, sampled CRC-32s: the
    cache's key. The change time is the kernel's (no program can set it back, as ``touch -d``
    sets the modification time), so an edit that keeps the size and restores the modification
    time still makes a new key; so does a file replaced by another (its inode)."""
    info = path.stat()
    return [str(path.resolve()), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns,
            _sampled_crcs(path, info.st_size)]


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


def _build(folder: Path, ranges: dict, level: str, name: str, progress: bool) -> dict:
    """Tokenize the splits into `folder`: one pass over the text, provisional ids (each
    token's order of first appearance: :class:`~qrnn.train.data.Tokenizer`) written as they
    come, then remapped to the vocabulary's ids in bounded blocks."""
    from tqdm.auto import tqdm

    total = sum(stop - start for _, start, stop in ranges.values())
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"tokenizing {name}", leave=False,
               disable=not progress, dynamic_ncols=True)
    tokenizer = Tokenizer(level)
    has_text = {}
    with bar:
        for split, (path, start, stop) in ranges.items():
            has_text[split] = False
            with open(folder / f"{split}.raw", "wb") as out:
                for text in _text_blocks(path, start, stop, bar.update):
                    has_text[split] = has_text[split] or bool(text.strip())
                    out.write(tokenizer.ids(text, count=split == "train").data)
    for split in SPLITS:
        if not has_text[split]:
            raise DataError(f"--data {name}: the {split} split is empty")
    # The vocabulary, as Vocabulary.build makes it, and each provisional id's final id.
    vocab, table = tokenizer.vocabulary()

    def final(raw: np.ndarray) -> np.ndarray:
        return table[raw]
    meta: dict = {"version": CACHE_VERSION, "level": level, "files": {}}
    for split in SPLITS:  # read in blocks, not mapped: the build's memory stays its own
        crc = fingerprint = 0
        low, high = 2**31, -1
        with open(folder / f"{split}.raw", "rb") as src, open(folder / f"{split}.i32", "wb") as out:
            while len(raw := np.fromfile(src, dtype="<u4", count=1 << 22)):
                block = final(raw).astype("<i4")
                low, high = min(low, int(block.min())), max(high, int(block.max()))
                crc = zlib.crc32(block.tobytes(), crc)
                if split == "train":  # ids_fingerprint, block by block
                    fingerprint = zlib.crc32(block.astype("<i8").tobytes(), fingerprint)
                out.write(block.tobytes())
        os.unlink(folder / f"{split}.raw")
        # The ids' range, checked against the vocabulary whenever the cache is opened.
        meta["files"][split] = {"tokens": os.path.getsize(folder / f"{split}.i32") // 4, "crc32": crc,
                                "min": low if high >= 0 else 0, "max": max(high, 0)}
        if split == "train":
            meta["fingerprint"] = fingerprint
    vocab_bytes = json.dumps(vocab.state_dict()).encode()
    (folder / "vocab.json").write_bytes(vocab_bytes)
    meta["vocab_crc32"] = zlib.crc32(vocab_bytes)
    meta["vocab_bytes"] = len(vocab_bytes)
    return meta


class _Unusable(Exception):
    """What makes a cache folder unusable (its message), found while opening it."""


# meta.json is a few hundred bytes; vocab.json is bounded by its recorded size and this cap.
_META_MAX_BYTES = 1 << 20
_VOCAB_MAX_BYTES = 1 << 30
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never blocks


def _open_dir(path: Path, dir_fd: Optional[int] = None) -> int:
    """A descriptor of the folder `path` that is not a symbolic link (O_NOFOLLOW)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _open_entry(dir_fd: int, name: str) -> int:
    """A descriptor of the regular file `name` in the folder `dir_fd`: a symbolic link, a
    device or a FIFO in its place makes the cache unusable (never read, never followed)."""
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _Unusable(f"{name} is a symbolic link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _Unusable(f"{name} is not a regular file")
    return fd


def _read_entry(dir_fd: int, name: str, limit: int) -> bytes:
    fd = _open_entry(dir_fd, name)
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fd).st_size > limit:
            raise _Unusable(f"{name} is larger than a cache writes it ({limit:,} bytes at most)")
        return fh.read(limit + 1)[:limit]


def _is_int(value, low: int = -(2**63), high: int = 2**63 - 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _meta_checksum(meta: dict) -> int:
    """CRC-32 of meta.json's fields but its own checksum, in a canonical form."""
    return zlib.crc32(json.dumps({k: v for k, v in meta.items() if k != "meta_crc32"}, sort_keys=True).encode())


def _parse_meta(data: bytes, level: str) -> dict:
    """meta.json's fields, each of the type the builder writes, else _Unusable."""
    try:
        meta = json.loads(data)
    except ValueError:
        raise _Unusable("meta.json is not JSON") from None
    if not isinstance(meta, dict):
        raise _Unusable("meta.json is not an object")
    if meta.get("version") != CACHE_VERSION:
        raise _Unusable(f"cache format {meta.get('version')!r:.20}, this version reads {CACHE_VERSION}")
    if meta.get("meta_crc32") != _meta_checksum(meta):
        raise _Unusable("meta.json does not match its checksum")
    fields: dict = {"level": str, "builder": str, "built": str, "seconds": (int, float), "files": dict}
    wrong = [key for key, kind in fields.items() if not isinstance(meta.get(key), kind)]
    wrong += [key for key in ("fingerprint", "vocab_crc32", "vocab_bytes") if not _is_int(meta.get(key), 0)]
    for split in SPLITS:
        entry = meta["files"].get(split) if isinstance(meta.get("files"), dict) else None
        if not isinstance(entry, dict) or not all(_is_int(entry.get(k)) for k in ("tokens", "crc32", "min", "max")) \
                or entry["tokens"] < 0:
            wrong.append(f"files.{split}")
    if wrong:
        raise _Unusable(f"meta.json's {', '.join(wrong)} missing or damaged")
    if meta["level"] != level:
        raise _Unusable(f"meta.json says level {meta['level']!r:.20}, not {level!r}")
    return meta


def _parse_vocab(data: bytes, meta: dict, level: str) -> Vocabulary:
    if len(data) != meta["vocab_bytes"] or zlib.crc32(data) != meta["vocab_crc32"]:
        raise _Unusable("vocab.json does not match its checksum")
    try:
        state = json.loads(data)
        vocab = Vocabulary.from_state_dict(state)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise _Unusable(f"vocab.json is damaged ({str(err)[:200]})") from None
    if vocab.level != level:  # a char vocabulary under a word-level key, or the reverse
        raise _Unusable(f"vocab.json is a {vocab.level}-level vocabulary, not {level}")
    return vocab


def _map_ids(dir_fd: int, split: str, want: dict, vocab_size: int) -> torch.Tensor:
    """The split's ids, memory-mapped copy-on-write, once the mapped bytes match their size,
    CRC-32 and the vocabulary's range (checked on the mapping itself: what is checked is what
    is used)."""
    name = f"{split}.i32"
    fd = _open_entry(dir_fd, name)
    try:
        if os.fstat(fd).st_size != 4 * want["tokens"]:
            raise _Unusable(f"{name} has the wrong size")
        if want["tokens"] == 0:
            return torch.zeros(0, dtype=torch.int32)
        with os.fdopen(os.dup(fd), "rb") as fh:  # np.memmap maps a duplicate: ours is closed below
            ids = np.memmap(fh, dtype="<i4", mode="c")
    finally:
        os.close(fd)
    crc, low, high = 0, vocab_size, -1
    for start in range(0, len(ids), 1 << 21):
        block = ids[start: start + (1 << 21)]
        crc = zlib.crc32(block.data, crc)
        low, high = min(low, int(block.min())), max(high, int(block.max()))
    if crc != want["crc32"]:
        raise _Unusable(f"{name} does not match its checksum")
    if (low, high) != (want["min"], want["max"]) or low < 0 or high >= vocab_size:
        raise _Unusable(f"{name} holds token ids {low}..{high}, outside the vocabulary's 0..{vocab_size - 1}")
    # Copy-on-write: writable for torch (no warning), shared pages until written (never).
    return torch.from_numpy(ids)


def _open_cache(root_fd: int, folder: Path, name: str, level: str):
    """(Corpus, meta) of the cache `folder` (a name in the folder `root_fd`) if it is complete,
    intact and consistent with `level`, else what is wrong with it (a str). Every entry is
    opened relative to the folder's descriptor, following no link, so that the files checked
    are the files used."""
    try:
        dir_fd = _open_dir(Path(folder.name), dir_fd=root_fd)
    except FileNotFoundError:
        return "absent"
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            return "it is a symbolic link or a file, not a folder"
        return f"unreadable ({err.strerror or err})"
    try:
        meta = _parse_meta(_read_entry(dir_fd, "meta.json", _META_MAX_BYTES), level)
        vocab = _parse_vocab(_read_entry(dir_fd, "vocab.json", min(meta["vocab_bytes"], _VOCAB_MAX_BYTES)),
                             meta, level)
        ids = [_map_ids(dir_fd, split, meta["files"][split], len(vocab)) for split in SPLITS]
    except FileNotFoundError:
        return "incomplete"
    except _Unusable as problem:
        return str(problem)
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    finally:
        os.close(dir_fd)
    return Corpus(name, vocab, ids[0], ids[1], ids[2], fingerprint=meta["fingerprint"]), meta


def _check_text_files(files: dict, path: str) -> None:
    """What can be told of the data files before anything is created or said: each is not
    empty and starts as UTF-8 text (a compressed or binary file is refused at its first
    bytes; a problem further in is found by the build, which then leaves nothing behind)."""
    single = len(set(files.values())) == 1
    for file in dict.fromkeys(files.values()):
        size = file.stat().st_size
        if size == 0:
            raise DataError(f"--data {path}: {'file' if single else file.name} is empty")
        with open(file, "rb") as fh:
            head = fh.read(_SNIFF_BYTES)
        if len(head) < size:  # end the sample at a line end, never inside a character
            head = head[: head.rfind(b"\n") + 1]
        decode_file_text(head, file, 0, at_end=len(head) == size)


_SNIFF_BYTES = 64 << 10


def cached_corpus(path: str, level: str, say: Callable = print, progress: bool = True) -> tuple:
    """(Corpus with memory-mapped int32 ids, CacheInfo) for ``--data path`` (a folder with
    the three splits, or one text file), tokenized once per data version; `say` tells what
    is happening, `progress` shows tqdm's bar while tokenizing."""
    if level not in LEVELS:
        raise DataError(f"--level must be one of {', '.join(LEVELS)}, got {level!r}")
    files, name = split_files(path)
    _check_text_files(files, path)
    ranges = _split_ranges(files)
    identity = [CACHE_VERSION, level] + [_file_identity(p) for p in dict.fromkeys(files.values())]
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:24]
    root = cache_root(next(iter(files.values())).parent)
    root_fd = _open_root(root)
    try:
        folder = root / f"{name}-{level}-{key}"
        opened = _open_cache(root_fd, folder, name, level)
        built_here = False
        if isinstance(opened, str):
            with _build_lock(root_fd, root, folder, say):
                opened = _open_cache(root_fd, folder, name, level)
                if isinstance(opened, str):  # this process builds it
                    if opened != "absent":
                        say(f"corpus cache: {folder} cannot be used ({opened}): rebuilding it", flush=True)
                    say(f"corpus cache: tokenizing {name} once into {folder}", flush=True)
                    _build_into(root_fd, folder, ranges, level, name, progress)
                    built_here = True
                    opened = _open_cache(root_fd, folder, name, level)
                    if isinstance(opened, str):
                        raise DataError(f"the corpus cache {folder} does not read back after its build "
                                        f"({opened}): is another program writing to {root}?")
    finally:
        os.close(root_fd)
    corpus, meta = opened
    return corpus, CacheInfo(str(folder), built_here, meta["builder"], meta["seconds"])


def _open_root(root: Path) -> int:
    """A descriptor of the cache root, created if needed: a symbolic link there is refused
    (whoever can write beside the data must not choose where the cache is read)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        return _open_dir(root)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            raise DataError(f"the corpus cache folder {root} is a symbolic link or a file, which qrnn-train does "
                            "not follow: remove it (the cache is then made there anew)") from None
        raise DataError(f"cannot create the corpus cache folder {root}: {err.strerror or err}; set "
                        "QRNN_CACHE_DIR to a writable folder") from None


@contextlib.contextmanager
def _build_lock(root_fd: int, root: Path, folder: Path, say: Callable) -> Iterator[None]:
    """The exclusive flock on ``<key>.lock`` (a regular file, never a link) for building
    `folder`. A build that fails on the data (not text, an empty split) takes the lock file
    away again, and the cache root if it is left empty: a refused file leaves nothing."""
    lock_name = f"{folder.name}.lock"
    try:
        fd = os.open(lock_name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644,
                     dir_fd=root_fd)
    except OSError as err:
        raise DataError(f"cannot open the corpus cache lock {root / lock_name}: "
                        f"{'it is a symbolic link' if err.errno == errno.ELOOP else err.strerror or err}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataError(f"the corpus cache lock {root / lock_name} is not a regular file: remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"corpus cache: waiting for the process building {folder}", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        except DataError:
            with contextlib.suppress(OSError):
                os.unlink(lock_name, dir_fd=root_fd)
                os.rmdir(root)  # only if empty: another cache lives there
            raise
    finally:
        os.close(fd)


def _remove_entry(root_fd: int, root: Path, name: str) -> None:
    """Remove the entry `name` of the cache root, a folder or anything else, following no link
    (rmtree itself refuses a link and follows none inside)."""
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mode):
            shutil.rmtree(root / name)
        else:
            os.unlink(name, dir_fd=root_fd)
    except FileNotFoundError:
        pass


def _remove_stale_temporaries(root_fd: int, root: Path, own: str) -> None:
    """Temporaries of builds whose builder is gone (killed with -9, or a host that died): our
    own key's (we hold its lock), and any other whose key's lock is free."""
    for entry in os.listdir(root_fd):
        key, tmp, _ = entry.partition(".tmp-")
        if not tmp:
            continue
        if key == own:
            _remove_entry(root_fd, root, entry)
            continue
        try:
            fd = os.open(f"{key}.lock", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root_fd)
        except FileNotFoundError:  # a builder always holds its lock: none, no builder
            _remove_entry(root_fd, root, entry)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its builder is still at work
            continue
        else:
            _remove_entry(root_fd, root, entry)
        finally:
            os.close(fd)


def _build_into(root_fd: int, folder: Path, ranges: dict, level: str, name: str, progress: bool) -> None:
    """Build the cache `folder` in a fresh temporary beside it, then rename it into place
    (under the key's lock)."""
    start = time.perf_counter()
    _remove_stale_temporaries(root_fd, folder.parent, folder.name)
    work = folder.with_name(f"{folder.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    work.mkdir()  # a new name: fails rather than reuse anything already there
    try:
        meta = _build(work, ranges, level, name, progress)
        rank = os.environ.get("RANK")
        meta["builder"] = f"{socket.gethostname()} pid {os.getpid()}" + (f" (rank {rank})" if rank else "")
        meta["seconds"] = time.perf_counter() - start
        meta["built"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        meta["meta_crc32"] = _meta_checksum(meta)
        (work / "meta.json").write_text(json.dumps(meta))
        for entry in work.iterdir():
            with open(entry, "rb") as fh:
                os.fsync(fh.fileno())
        _remove_entry(root_fd, folder.parent, folder.name)  # a damaged one, or whatever took its name
        os.rename(work.name, folder.name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        os.fsync(root_fd)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
