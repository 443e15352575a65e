"""Text corpora for language-model training: loading, a vocabulary, vectorised tokenisation,
and truncated-BPTT batches that shard across DistributedDataParallel ranks.

With no path the corpus is the English reference text that every CPython carries in
``pydoc_data.topics`` (about 465,000 characters), so training runs with no download.
"""

from __future__ import annotations

import fnmatch
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from qrnn import _C

__all__ = ["DataConfig", "DataError", "Tokenizer", "Vocabulary", "Corpus", "load_corpus", "load_texts", "split_files",
           "default_text", "split_text", "line_cuts", "decode_text", "decode_file_text", "BPTTBatches", "UNK", "EOS",
           "LEVELS", "SPLITS"]

UNK = "<unk>"
EOS = "<eos>"
LEVELS = ("char", "word")
SPLITS = ("train", "valid", "test")


class DataError(ValueError):
    """A corpus that cannot be used (missing, empty, too small); the message is one line."""


class Tokenizer:
    """The one tokenizer of every corpus path (:class:`Vocabulary`, :func:`load_corpus`, the
    corpus cache): ``qrnn._C.Tokenizer``, C++ that runs without the GIL (cpp/src/text/).

    Word level: the words ``str.split()`` finds (Unicode whitespace), with ``<eos>`` for each
    ``"\\n"``; char level: each character. Without `tokens`, each token gets a provisional
    id, its order of first appearance, and :meth:`vocabulary` orders the counted ones into
    the corpus's vocabulary; with `tokens` (a vocabulary's), ids are their places, 0 for any
    other token. Each text passed is whole: a block of a longer text ends at a line end.
    """

    def __init__(self, level: str, tokens: Optional[Sequence[str]] = None):
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        self.level = level
        self._native = _C.Tokenizer(level, None if tokens is None else list(tokens))

    def ids(self, text, count: bool = False) -> np.ndarray:
        """int32 ids of the tokens of `text` (str, or UTF-8 bytes); `count`: it is training
        text, whose tokens make the vocabulary."""
        return np.frombuffer(self._native.tokenize(text, count), dtype=np.int32)

    def count(self, text) -> None:
        """Count the tokens of the training text `text`, keeping no ids."""
        self._native.tokenize(text, True, False)

    def vocabulary(self) -> tuple:
        """(the :class:`Vocabulary` of the counted text, the final id of each provisional id
        as an int32 array: 0 for tokens never counted)."""
        tokens, final = self._native.vocabulary()
        return Vocabulary(self.level, tokens), np.frombuffer(final, dtype=np.int32)


class Vocabulary:
    """Token <-> id mapping. Id 0 is ``<unk>``, given to tokens never seen in training.

    Char level: tokens are single characters, sorted by code point. Word level: tokens are
    whitespace-separated words plus ``<eos>`` at each line end (the WikiText / PTB
    convention), most frequent first, ties in code point order. :class:`Tokenizer` finds
    and orders them.
    """

    def __init__(self, level: str, tokens: Sequence[str]):
        if level not in LEVELS:
            raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
        tokens = list(tokens)
        if not tokens or tokens[0] != UNK:
            raise ValueError(f"the first token must be {UNK!r}")
        # A vocabulary read from a file (a cache, a checkpoint) is checked whole here.
        if not all(isinstance(t, str) for t in tokens):
            raise ValueError("tokens must be strings")
        if len(set(tokens)) != len(tokens):
            raise ValueError("tokens must be distinct")
        self.level = level
        self.tokens = tokens
        if level == "char":
            codes = np.array([ord(t) for t in tokens[1:]], dtype=np.int64)
            if np.any(np.diff(codes) <= 0):
                raise ValueError("char tokens must be single characters in increasing order")
        self._encoder: Optional[Tokenizer] = None  # made on the first encode()

    @classmethod
    def build(cls, text: str, level: str) -> "Vocabulary":
        tokenizer = Tokenizer(level)
        tokenizer.count(text)
        return tokenizer.vocabulary()[0]

    def __len__(self) -> int:
        return len(self.tokens)

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and (self.level, self.tokens) == (other.level, other.tokens)

    def __getstate__(self) -> dict:  # the C++ encoder is not pickled: remade when needed
        return {**self.__dict__, "_encoder": None}

    def encode(self, text: str) -> Tensor:
        """Token ids (int64) of `text`; unknown tokens become 0 (``<unk>``)."""
        if self._encoder is None:
            self._encoder = Tokenizer(self.level, self.tokens)
        return torch.from_numpy(self._encoder.ids(text).astype(np.int64))

    def decode(self, ids) -> str:
        tokens = [self.tokens[i] for i in torch.as_tensor(ids).tolist()]
        if self.level == "char":
            return "".join("\ufffd" if t == UNK else t for t in tokens)
        return " ".join(tokens).replace(f" {EOS} ", "\n").replace(EOS, "\n")

    def state_dict(self) -> dict:
        return {"level": self.level, "tokens": list(self.tokens)}

    @classmethod
    def from_state_dict(cls, state: dict) -> "Vocabulary":
        return cls(state["level"], state["tokens"])


@dataclass
class Corpus:
    """Token ids of the three splits and the vocabulary built from the training split;
    `fingerprint`, where known, the CRC-32 of the training ids as int64."""

    name: str
    vocab: Vocabulary
    train: Tensor
    valid: Tensor
    test: Tensor
    fingerprint: Optional[int] = None


def default_text() -> str:
    """The reference text in the standard library's pydoc_data, joined in a fixed order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def line_cuts(size: int, newline_at: Callable[[int], int], fractions=(0.9, 0.05)) -> list:
    """Byte offsets cutting `size` bytes into train/valid/test (90/5/5 by default): the first
    line end at or after each fraction. `newline_at(offset)` is the offset of the first
    newline byte at or after `offset`, or -1. Counted in bytes, so that a file cut while
    streamed (the corpus cache) and a text cut in memory split at the same lines."""
    cuts = []
    for fraction in np.cumsum(fractions):
        target = int(size * fraction)
        newline = newline_at(target)
        cuts.append(target if newline < 0 else newline + 1)
    return cuts


def decode_text(data: bytes) -> str:
    """Bytes of a text file as ``Path.read_text`` decodes them: UTF-8 with replacement,
    universal newlines."""
    return _universal_newlines(data.decode("utf-8", errors="replace"), data)


def _universal_newlines(text: str, data: bytes) -> str:
    """`text`, decoded from `data`, with CRLF and CR line ends made LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n") if b"\r" in data else text


NOT_TEXT_ADVICE = ("pass --data a UTF-8 text file, or a folder with train.txt, valid.txt and test.txt "
                   "(decompress an archive first; convert another encoding, e.g. iconv -t utf-8)")


def decode_file_text(data: bytes, file, offset: int = 0, at_end: bool = True) -> str:
    """The text of `data`, bytes read from `file` at byte `offset`, decoded as
    :func:`decode_text` decodes them once they are known to be text: UTF-8 without a NUL
    byte. Anything else (a compressed, binary or Latin-1 file) is a DataError naming the
    file, the byte offset and what to pass instead. `at_end`: `data` ends where the file
    ends, where a character cut short (a file truncated at a byte count) is replaced
    rather than refused. The checks run on the bytes already read: one ``memchr`` and the
    decode itself, strict instead of replacing (the same speed for valid UTF-8)."""
    try:
        text, bad = data.decode("utf-8"), len(data)
    except UnicodeDecodeError as err:
        bad = err.start
        if at_end and err.end == len(data) and err.reason == "unexpected end of data":
            text = data[: err.start].decode("utf-8") + "\ufffd"
        else:
            text = ""
    nul = data.find(b"\0", 0, bad)  # the first problem is the one named
    if nul >= 0:
        raise DataError(f"{file} is not UTF-8 text (a NUL byte at byte {offset + nul:,}): {NOT_TEXT_ADVICE}")
    if not text and data:
        raise DataError(f"{file} is not UTF-8 text (byte {offset + bad:,} is not UTF-8): {NOT_TEXT_ADVICE}")
    return _universal_newlines(text, data)


def _split_bytes(data: bytes, file=None) -> tuple:
    """The train/valid/test texts of `data` (the bytes of `file`, checked to be text; None:
    bytes encoded here, decoded with replacement)."""
    cuts = line_cuts(len(data), lambda offset: data.find(b"\n", offset))
    parts = ((0, data[: cuts[0]]), (cuts[0], data[cuts[0]: cuts[1]]), (cuts[1], data[cuts[1]:]))
    if file is None:
        return tuple(decode_text(part) for _, part in parts)
    return tuple(decode_file_text(part, file, start, at_end=start == cuts[1]) for start, part in parts)


def split_text(text: str) -> tuple:
    """Split into train/valid/test (90/5/5 of its UTF-8 bytes) at line ends."""
    return _split_bytes(text.encode("utf-8", errors="surrogatepass"))


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read {path}: {err.strerror or err}") from None


def _find_split_file(folder: Path, split: str) -> Optional[Path]:
    """train.txt, or the WikiText (wiki.train.tokens) and PTB (ptb.train.txt) names."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    for pattern in (f"{split}.txt", f"*.{split}.txt", f"*.{split}.tokens", f"{split}.tokens"):
        matches = fnmatch.filter(names, pattern)
        if len(matches) == 1:
            return folder / matches[0]
    return None


def split_files(path: str) -> tuple:
    """({split: file}, name) for --data PATH: a folder's three split files, or one file for
    all three (split 90/5/5 when read)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"--data {path}: no such file or folder")
    if not p.is_dir():
        files, name = {split: p for split in SPLITS}, p.stem
    else:
        found = {split: _find_split_file(p, split) for split in SPLITS}
        missing = [s for s, f in found.items() if f is None]
        if missing:
            raise DataError(f"--data {path}: folder has no {'/'.join(m + '.txt' for m in missing)} "
                            "(expected train.txt, valid.txt and test.txt, or a single text file)")
        files, name = {s: f for s, f in found.items() if f is not None}, p.name
    for file in files.values():  # a device or FIFO would be read forever, or block
        if not stat.S_ISREG(file.stat().st_mode):
            raise DataError(f"--data {path}: {file} is not a regular file")
    return files, name


def load_texts(path: Optional[str]) -> tuple:
    """(name, train text, valid text, test text) for --data PATH (None: the default corpus).
    The files must be UTF-8 text (:func:`decode_file_text`): a binary one is a DataError."""
    if path is None:
        return ("pydoc_data", *split_text(default_text()))
    files, name = split_files(path)
    if len(set(files.values())) == 1:
        data = _read(files["train"])
        if not data.strip():
            raise DataError(f"--data {path}: file is empty")
        return (name, *_split_bytes(data, files["train"]))
    texts = [decode_file_text(_read(files[s]), files[s]) for s in SPLITS]
    for split, text in zip(SPLITS, texts):
        if not text.strip():
            raise DataError(f"--data {path}: {files[split].name} is empty")
    return (name, *texts)


def load_corpus(path: Optional[str] = None, level: str = "char", vocab: Optional[Vocabulary] = None) -> Corpus:
    """Load and tokenise a corpus. The vocabulary comes from the training split unless given
    (e.g. from a checkpoint being resumed)."""
    if level not in LEVELS:
        raise DataError(f"--level must be one of {', '.join(LEVELS)}, got {level!r}")
    name, train, valid, test = load_texts(path)
    if vocab is not None:
        return Corpus(name, vocab, vocab.encode(train), vocab.encode(valid), vocab.encode(test))
    # One pass: provisional ids, counted on the training split, then mapped to the vocabulary's.
    tokenizer = Tokenizer(level)
    provisional = [tokenizer.ids(text, count=split == "train") for split, text in zip(SPLITS, (train, valid, test))]
    vocab, final = tokenizer.vocabulary()
    ids = [torch.from_numpy(final[raw].astype(np.int64)) for raw in provisional]
    return Corpus(name, vocab, ids[0], ids[1], ids[2])


@dataclass(frozen=True)
class DataConfig:
    """``qrnn-train``'s corpus and batches (its ``--data``, ``--level``, ``--batch-size``,
    ``--eval-batch-size``, ``--bptt`` and ``--bptt-lengths``).

    Args:
        path: the corpus (:func:`load_corpus`); None: the built-in reference text.
        level: one of :data:`LEVELS`.
        batch_size: the global batch of training (:class:`BPTTBatches`).
        eval_batch_size: the global batch of validation and test; None: ``batch_size``.
        bptt: the truncated-BPTT chunk length.
        bptt_lengths: ``"fixed"``, or ``"random"``: awd-lstm-lm's chunk lengths around ``bptt``.
    """

    path: Optional[str]
    level: str
    batch_size: int
    eval_batch_size: Optional[int]
    bptt: int
    bptt_lengths: str


class BPTTBatches(Sequence):
    """Truncated-BPTT chunks over a (steps, batch) token layout: item i is (inputs, targets),
    each (<= bptt, batch), targets shifted by one step. Chunk i of one epoch continues chunk
    i - 1 column by column, so a model may carry its state across them.

    With `world` > 1, rank r keeps its own contiguous slice of the batch columns: every rank
    sees its own shard of every global batch, and together they see exactly what one process
    with the whole batch would see.

    With `random_lengths` (a seed), chunk lengths vary as awd-lstm-lm draws them: the nominal
    `bptt` (half of it with probability 0.05), plus normal noise of standard deviation 5, at
    least 5. The lengths are a function of the seed and the epoch (:meth:`set_epoch`), the
    same on every rank and after a resume.
    """

    def __init__(self, ids: Tensor, batch_size: int, bptt: int, rank: int = 0, world: int = 1,
                 random_lengths: Optional[int] = None):
        if batch_size % world:
            raise DataError(f"--batch-size {batch_size} must be a multiple of the number of processes ({world})")
        steps = ids.numel() // batch_size
        if steps < 2:
            raise DataError(f"{ids.numel()} tokens are too few for --batch-size {batch_size} "
                            "(each column needs at least 2 tokens)")
        per_rank = batch_size // world
        # Column b is ids[b * steps: (b + 1) * steps]: a view of the ids (a memory-mapped
        # corpus stays mapped); each chunk is copied out when asked for.
        self._columns = ids[: steps * batch_size].view(batch_size, steps)[rank * per_rank: (rank + 1) * per_rank]
        self.bptt = bptt
        self.global_batch_size = batch_size
        self.random_lengths = random_lengths
        self._starts = np.arange(0, steps - 1, bptt)
        self.set_epoch(0)

    @property
    def stream(self) -> Tensor:
        """The (steps, batch) token layout this rank reads (a view)."""
        return self._columns.t()

    def set_epoch(self, epoch: int) -> None:
        """The chunk lengths of `epoch` (only random lengths depend on it)."""
        if self.random_lengths is None:
            return
        rng = np.random.default_rng([self.random_lengths & (2**63 - 1), epoch])
        end, start, starts = self._columns.shape[1] - 1, 0, []
        while start < end:
            nominal = self.bptt if rng.random() < 0.95 else self.bptt / 2
            starts.append(start)
            start += max(5, int(rng.normal(nominal, 5)))
        self._starts = np.array(starts, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i: int) -> tuple:  # type: ignore[override]  # batch indices only, no slices
        if not 0 <= i < len(self):
            raise IndexError(i)
        start = int(self._starts[i])
        stop = int(self._starts[i + 1]) if i + 1 < len(self) else self._columns.shape[1] - 1
        chunk = self._columns[:, start: stop + 1].t().to(torch.int64, memory_format=torch.contiguous_format)
        return chunk[:-1], chunk[1:]
