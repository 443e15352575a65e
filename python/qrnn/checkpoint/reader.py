"""Reading checkpoints: :func:`load` (torch.load with safe defaults) and :func:`verify`, which
checks every byte of the zip structure the C++ writer lays out (its record signatures, sizes
and flags come from qrnn._C)."""

from __future__ import annotations

import mmap
import os
import pickle
import re
import struct
import warnings
from typing import IO, Optional, Union

import torch

from .. import _C
from .errors import CorruptCheckpointError, UnsafeCheckpointError

_ZIP: dict = _C.checkpoint_zip_format
_U32, _U16 = _ZIP["zip32_limit"], 0xFFFF
# Data descriptor and UTF-8 names: any other flag (encryption...) is not a checkpoint.
_ALLOWED_FLAGS = _ZIP["allowed_flags"]
_END_SIZE, _LOCATOR_SIZE, _END64_SIZE = _ZIP["end_size"], _ZIP["zip64_locator_size"], _ZIP["zip64_end_size"]
_CENTRAL_SIZE, _LOCAL_SIZE = _ZIP["central_header_size"], _ZIP["local_header_size"]

# How torch's weights-only unpickler names the global it refused: "GLOBAL posix.system was not
# an allowed global" (2.4+), "unsupported GLOBAL sys.modules whose module sys is blocked"
# (2.5+), "Unsupported class posix.system" (before 2.4).
_REFUSED_GLOBAL = re.compile(r"\bGLOBAL ([A-Za-z_][\w.]*)|\bUnsupported class ([A-Za-z_][\w.]*)")
_LONGEST_GLOBAL = 200  # longer is a crafted name, not a module's: the generic wording says enough


def load(path: Union[str, os.PathLike], map_location=None, *, weights_only: bool = True, mmap: bool = False):
    """Load a checkpoint (any zip-format torch.save file) with the safe default
    ``weights_only=True``. Safe on untrusted files: before anything is unpickled, the
    archive's structure is checked (the cheap part of :func:`verify`: the central directory
    against the file size, stored records only, every declared size and offset within the
    file, no ``..`` in record names), so no file makes it allocate much more than the data
    it holds; a file that fails raises :class:`CorruptCheckpointError`. CRCs are not
    checked here (:func:`verify` reads every byte). A pickle that needs more than
    ``weights_only=True`` allows (code such as ``os.system``) raises
    :class:`UnsafeCheckpointError`, one line naming what it refers to; nothing in it runs.

    The file checked is the file loaded, also with ``mmap=True`` and while a writer renames
    another file over ``path``: torch maps it through its open descriptor's name
    (``/proc/self/fd``, or ``/dev/fd``). Where the system has neither, ``mmap=True`` warns
    and reads the checked file into memory as ``mmap=False`` does.

    Args:
        path: the checkpoint file.
        map_location (Any): as for ``torch.load`` (where tensors go; None: where they were
            saved).
        weights_only: as for ``torch.load``; keep True for files you did not write.
        mmap: map the tensors' storages from the file instead of reading them.

    Returns:
        obj (Any): the saved object, as ``torch.load`` returns it.

    Raises:
        CorruptCheckpointError: the archive's structure is damaged or not a zip-format
            checkpoint.
        UnsafeCheckpointError: (with ``weights_only=True``) the pickle needs more than the
            allowed types.
        OSError: the file cannot be opened (FileNotFoundError for a missing one).
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        _check_file(path, file, check_crc=False)
        source: Union[str, IO[bytes]] = file
        if mmap:
            mapped = _descriptor_name(file)
            if mapped is not None:
                source = mapped
            else:
                mmap = False
                warnings.warn("qrnn.checkpoint.load: this system names no open file (no /proc/self/fd or /dev/fd), "
                              "so mmap=True reads the checkpoint into memory: mapping it by its path could map "
                              "another file than the one checked", RuntimeWarning, stacklevel=2)
        file.seek(0)
        try:
            return torch.load(source, map_location=map_location, weights_only=weights_only, mmap=mmap)
        # torch 2.4 asserts what later versions raise as UnpicklingError (a persistent id
        # that is not a tuple).
        except (pickle.UnpicklingError, AssertionError) as error:
            if not weights_only:
                raise
            raise UnsafeCheckpointError(path, refused_global(_messages(error))) from error


def refused_global(message: str) -> Optional[str]:
    """The global (``module.name``) that torch's weights-only unpickler refused, as its error
    message names it in any torch version since 2.0; None when it names none."""
    found = _REFUSED_GLOBAL.search(message)
    if found is None:
        return None
    name = found.group(1) or found.group(2)
    return name if len(name) <= _LONGEST_GLOBAL else None


def _messages(error: BaseException) -> str:
    """The messages of ``error`` and of the errors it was raised from or during: torch
    rewords the unpickler's message and raises it ``from None``, keeping it as the context."""
    seen: list = []
    current: Optional[BaseException] = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return "\n".join(str(e) for e in seen)


def _descriptor_name(file: IO[bytes]) -> Optional[str]:
    """A path that opens the very file ``file`` has open, whatever its own path names by now:
    the descriptor's entry in /proc/self/fd (Linux) or /dev/fd (macOS, the BSDs), checked to
    lead to that file; None where there is none."""
    descriptor = file.fileno()
    opened = os.fstat(descriptor)
    for folder in ("/proc/self/fd", "/dev/fd"):
        name = f"{folder}/{descriptor}"
        try:
            named = os.stat(name)
        except OSError:
            continue
        if (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino):
            return name
    return None


def verify(path: Union[str, os.PathLike]) -> None:
    """Check the whole archive at ``path`` (a str or os.PathLike; every byte is read):
    every central-directory field against its local header, data descriptor and the data
    (names, offsets, sizes, flags, method, CRC-32, which torch.load never checks), the end
    records, and that the records tile the file. A file it accepts loads as written.

    Returns:
        None when the file is intact.

    Raises:
        CorruptCheckpointError: naming the first damaged record (never another exception
            for a damaged file).
        OSError: the file cannot be opened or read.
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        _check_file(path, file, check_crc=True)


def _check_file(path: str, file, check_crc: bool) -> None:
    size = os.fstat(file.fileno()).st_size
    if size == 0:
        raise CorruptCheckpointError(path, None, "empty file")
    with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
        try:
            problem = _check_archive(view, size, check_crc)
        except (struct.error, IndexError, ValueError, UnicodeDecodeError, OverflowError) as error:
            problem = (None, f"unreadable zip structure ({type(error).__name__}: {error})")
    if problem is not None:
        raise CorruptCheckpointError(path, problem[0], problem[1])


class _Damaged(Exception):
    def __init__(self, record: Optional[str], problem: str):
        super().__init__(problem)
        self.record, self.problem = record, problem


def _check_archive(view: memoryview, size: int, check_crc: bool = True) -> Optional[tuple]:
    try:
        _walk_archive(view, size, check_crc)
    except _Damaged as damaged:
        return damaged.record, damaged.problem
    return None


def _walk_archive(view: memoryview, size: int, check_crc: bool) -> None:
    def need(ok: bool, problem: str, record: Optional[str] = None) -> None:
        if not ok:
            raise _Damaged(record, problem)

    def read(fmt: str, offset: int) -> tuple:
        need(0 <= offset and offset + struct.calcsize(fmt) <= size, "a header runs past the end of the file")
        return struct.unpack_from(fmt, view, offset)

    # End of central directory: exactly at the end (no comment), ZIP64 records right before.
    need(size >= _END_SIZE, "too short for a zip archive")
    end = size - _END_SIZE
    sig, disk, cd_disk, n_here, n_total, cd_size, cd_offset, comment = read("<IHHHHIIH", end)
    need(sig == _ZIP["end_signature"] and comment == 0, "end of central directory record missing or damaged")
    need(disk == 0 and cd_disk == 0 and n_here == n_total, "end of central directory: multi-disk fields")
    cd_end = end
    locator = end - _LOCATOR_SIZE
    if size >= _END_SIZE + _LOCATOR_SIZE and read("<I", locator)[0] == _ZIP["zip64_locator_signature"]:
        _, z_disk, z_offset, z_disks = read("<IIQI", locator)
        need(z_disk == 0 and z_disks == 1 and z_offset + _END64_SIZE == locator, "ZIP64 end locator damaged")
        sig, rec_size, _, _, disk, cd_disk, n64_here, n64, cd64_size, cd64_offset = read("<IQHHIIQQQQ", z_offset)
        need(sig == _ZIP["zip64_end_signature"] and rec_size == _END64_SIZE - 12 and disk == 0 and cd_disk == 0
             and n64_here == n64, "ZIP64 end of central directory record damaged")
        need(n_total in (n64, _U16) and cd_size in (cd64_size, _U32) and cd_offset in (cd64_offset, _U32),
             "end of central directory disagrees with its ZIP64 record")
        n_total, cd_size, cd_offset, cd_end = n64, cd64_size, cd64_offset, z_offset
    need(cd_offset + cd_size == cd_end, "central directory size or offset damaged")

    names: set = set()
    prefix = None
    cursor, tile = cd_offset, 0  # central directory position; where the next local record must start
    for _ in range(n_total):
        need(cursor + _CENTRAL_SIZE <= cd_end, "central directory shorter than its entry count")
        (sig, _made_by, version, flags, method, mtime, mdate, crc, csize, usize, name_len, extra_len, comment_len,
         disk, _internal, external, offset) = read("<IHHHHHHIIIHHHHHII", cursor)
        need(sig == _ZIP["central_header_signature"], "central directory entry signature damaged")
        raw_name = bytes(view[cursor + _CENTRAL_SIZE:cursor + _CENTRAL_SIZE + name_len])
        name = raw_name.decode("utf-8", errors="replace")
        need(cursor + _CENTRAL_SIZE + name_len + extra_len + comment_len <= cd_end,
             "central directory entry runs past its end", name)
        need(flags & ~_ALLOWED_FLAGS == 0 and method == 0, "flags or compression method damaged", name)
        need(disk == 0 and external & 0x10 == 0 and not name.endswith("/"), "attributes damaged", name)
        need("/" in name and name not in names, "name damaged", name)
        need(not name.startswith("/") and ".." not in name.split("/") and "\\" not in name and "\0" not in name,
             "name leaves the archive's folder", name)
        record_prefix = name.split("/", 1)[0]
        need(prefix is None or record_prefix == prefix, "name outside the archive's folder", name)
        prefix = record_prefix
        names.add(name)
        # ZIP64 extra: 64-bit values for exactly the 32-bit fields that overflowed.
        wide = {}
        extra = cursor + _CENTRAL_SIZE + name_len
        extra_end = extra + extra_len
        while extra < extra_end:
            need(extra + 4 <= extra_end, "extra field damaged", name)
            kind, length = read("<HH", extra)
            need(extra + 4 + length <= extra_end, "extra field damaged", name)
            if kind == 1:
                fields = [f for f, v in (("usize", usize), ("csize", csize), ("offset", offset)) if v == _U32]
                need(length == 8 * len(fields), "ZIP64 extra field damaged", name)
                for k, f in enumerate(fields):
                    wide[f] = read("<Q", extra + 4 + 8 * k)[0]
            extra += 4 + length
        usize, csize, offset = wide.get("usize", usize), wide.get("csize", csize), wide.get("offset", offset)
        need(_U32 not in (usize, csize, offset) or len(wide) > 0, "ZIP64 extra field missing", name)
        need(usize == csize, "stored record whose sizes differ", name)
        cursor = extra_end + comment_len

        # Local header: same name, flags, method; records tile the file in order.
        need(offset == tile, "local header offset damaged", name)
        (sig, l_version, l_flags, l_method, l_time, l_date, l_crc, l_csize, l_usize, l_name_len,
         l_extra_len) = read("<IHHHHHIIIHH", offset)
        need(sig == _ZIP["local_header_signature"], "local header missing or damaged", name)
        need(bytes(view[offset + _LOCAL_SIZE:offset + _LOCAL_SIZE + l_name_len]) == raw_name,
             "name in the local header differs from the directory", name)
        need((l_version, l_flags, l_method, l_time, l_date) == (version, flags, method, mtime, mdate),
             "local header differs from the directory", name)
        if flags & 0x08:
            need(l_crc in (0, crc) and l_csize in (0, _U32, csize) and l_usize in (0, _U32, usize),
                 "local header sizes or CRC damaged", name)
        else:
            need(l_crc == crc and l_csize in (_U32, csize) and l_usize in (_U32, usize),
                 "local header sizes or CRC damaged", name)
        start = offset + _LOCAL_SIZE + l_name_len + l_extra_len
        stop = start + csize
        need(stop <= cd_offset, "payload runs past the central directory", name)
        if check_crc:
            with view[start:stop] as payload:
                actual = _C.checkpoint_crc32(payload)
            need(actual == crc, f"CRC mismatch: directory says {crc:08x}, payload has {actual:08x}", name)
        tile = stop
        if flags & 0x08:  # data descriptor: optional signature, CRC, sizes (64-bit for ZIP64 records)
            if read("<I", tile)[0] == _ZIP["descriptor_signature"]:
                tile += 4
            fmt = "<IQQ" if wide else "<III"
            need(read(fmt, tile) == (crc, csize, usize), "data descriptor damaged", name)
            tile += struct.calcsize(fmt)
    need(cursor == cd_end, "central directory size disagrees with its entries")
    need(tile == cd_offset, "bytes between the last record and the central directory")
