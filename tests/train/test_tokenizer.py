"""The compiled tokenizer (qrnn._C.Tokenizer, cpp/src/text/) against the pure-Python algorithm
it replaced, kept here as the oracle: the same vocabulary and the same ids through
Vocabulary.build and encode, load_corpus, and the corpus cache (built in blocks small enough
to cut lines), on generated texts with every whitespace character str.isspace() accepts,
CRLF and lone CR line ends, words that look like <unk> and <eos>, empty lines, non-ASCII and
4-byte UTF-8 words, lone surrogates, and ties in counts."""

import collections
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from property_cases import SETTINGS
from qrnn.train import cache as cache_module
from qrnn.train.cache import cached_corpus
from qrnn.train.data import LEVELS, SPLITS, DataError, Vocabulary, load_corpus, load_texts

# The characters str.isspace() accepts (str.split() splits at them), as the C++ lists them.
SPACES = ("\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
          + "\u2028\u2029\u202f\u205f\u3000")


# The oracle: the pure-Python tokenizer that Vocabulary, load_corpus and the cache used before.

def oracle_tokens(text: str, level: str) -> list:
    return list(text) if level == "char" else text.replace("\n", " <eos> ").split()


def oracle_vocabulary(train: str, level: str) -> list:
    """<unk>, then characters by code point, or words by descending count, ties in code point
    order, the word <unk> left out."""
    if level == "char":
        return ["<unk>"] + sorted(set(train))
    counts = collections.Counter(oracle_tokens(train, level))
    counts.pop("<unk>", None)
    return ["<unk>"] + [word for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def oracle_ids(tokens: list, text: str, level: str) -> list:
    index = {token: i for i, token in enumerate(tokens)}
    return [index.get(token, 0) for token in oracle_tokens(text, level)]


def universal_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def test_the_whitespace_list_is_str_isspace():
    assert SPACES == "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())


@pytest.mark.parametrize("level", LEVELS)
def test_every_code_point(level):
    """Each code point, lone surrogates included, between two letters: a separator exactly
    where str.split() sees one, and the vocabulary's order over all of them."""
    text = "".join(f"x{chr(c)}y{chr(c)} " for c in range(sys.maxunicode + 1))
    vocab = Vocabulary.build(text, level)
    assert vocab.tokens == oracle_vocabulary(text, level)
    assert vocab.encode(text).tolist() == oracle_ids(vocab.tokens, text, level)


def test_ties_unk_and_eos():
    # Counts 3, 2 (in code point order: z < é < U+FF5A < U+1D51E), 1; the word <unk> is 0,
    # the word <eos> is the line end's token, <unk>x and x<eos> are words of their own.
    text = "<eos> 𝔞 z é ｚ\n<unk> 𝔞 z é ｚ <unk>x x<eos>\n\n"
    vocab = Vocabulary.build(text, "word")
    assert vocab.tokens == ["<unk>", "<eos>", "z", "é", "ｚ", "𝔞", "<unk>x", "x<eos>"]
    assert vocab.tokens == oracle_vocabulary(text, "word")
    assert vocab.encode(text + " new").tolist() == [1, 5, 2, 3, 4, 1, 0, 5, 2, 3, 4, 6, 7, 1, 1, 0]


# Generated texts: words from a small pool (ties in counts, words met again), random words,
# and every separator, line end and look-alike of the special tokens.
_WORD_CHARS = st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc"))
_POOL = ["a", "b", "é", "ｚ", "𝔞", "😀x", "<unk>", "<eos>", "<unk>a", "<eos>b", "<", "unk>", "\x00", "\u200b",
         "\u180e", "\x84", "\xa1", "\u2030"]
_SEPARATORS = list(SPACES) + ["\r\n", "\n\n", "\r\r\n", " \r ", "\n \n"]
_PIECES = st.one_of(st.sampled_from(_POOL), st.sampled_from(_SEPARATORS), st.text(_WORD_CHARS, min_size=1, max_size=6),
                    st.text(st.characters(blacklist_categories=("Cs",)), max_size=4))
TEXTS = st.lists(_PIECES, max_size=60).map("".join)
_SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc80", "\ud7ff", "\ue000"])


@SETTINGS
@given(train=TEXTS, other=st.one_of(TEXTS, st.lists(st.one_of(_PIECES, _SURROGATES)).map("".join)),
       level=st.sampled_from(LEVELS))
def test_vocabulary_build_and_encode(train, other, level):
    if level == "char":  # lone surrogates: word level only (the char level never had them)
        other = other.encode("utf-8", "replace").decode()
    vocab = Vocabulary.build(train, level)
    assert vocab.tokens == oracle_vocabulary(train, level)
    for text in (train, other):
        assert vocab.encode(text).tolist() == oracle_ids(vocab.tokens, text, level)


@SETTINGS
@given(text=st.lists(_PIECES, max_size=30).map("".join).filter(lambda t: "\ud800" not in t))
def test_surrogates_at_word_level(text):
    # A text with lone surrogates: ordered as Python orders them (UTF-8's surrogatepass bytes).
    text = text + " \ud800 \udfff a\udc80 \ud7ff \ue000 \ud800"
    vocab = Vocabulary.build(text, "word")
    assert vocab.tokens == oracle_vocabulary(text, "word")
    assert vocab.encode(text).tolist() == oracle_ids(vocab.tokens, text, "word")


def _nonblank(text: str) -> str:
    return text if text.strip() else text + " w"


def _check_corpus(corpus, texts, level):
    tokens = oracle_vocabulary(texts[0], level)
    assert corpus.vocab.tokens == tokens
    for ids, text in zip((corpus.train, corpus.valid, corpus.test), texts):
        assert ids.tolist() == oracle_ids(tokens, text, level)


@SETTINGS
@given(texts=st.tuples(TEXTS, TEXTS, TEXTS).map(lambda ts: tuple(map(_nonblank, ts))), level=st.sampled_from(LEVELS),
       block=st.sampled_from([1, 7, 64]))
def test_load_corpus_and_cache_of_a_folder(texts, level, block, monkeypatch):
    """Three split files: universal newlines come first (decode_file_text), then the
    tokenizer, in memory and in the cache's blocks (which end at line ends)."""
    texts = tuple(t.replace("\x00", "0") for t in texts)  # a NUL byte: not a text file
    monkeypatch.setattr(cache_module, "BLOCK_BYTES", block)
    with tempfile.TemporaryDirectory() as folder:
        for split, text in zip(SPLITS, texts):
            Path(folder, f"{split}.txt").write_bytes(text.encode())
        want = tuple(map(universal_newlines, texts))
        assert load_texts(folder)[1:] == want  # so a lone CR is a line end: "<eos>"
        _check_corpus(load_corpus(folder, level), want, level)
        _check_corpus(cached_corpus(folder, level, say=lambda *a, **k: None, progress=False)[0], want, level)


@SETTINGS
@given(lines=st.lists(TEXTS, min_size=20, max_size=40), level=st.sampled_from(LEVELS), block=st.sampled_from([5, 64]))
def test_load_corpus_and_cache_of_one_file(lines, level, block, monkeypatch):
    """One file cut 90/5/5 at line ends, CRLF line ends: the same texts whole or in blocks."""
    # Ends in a short line: the cuts, at the first line end after 90% and 95% of the bytes, never
    # fall inside a character (where no line end follows, a cut is a byte count).
    text = "\r\n".join(line.replace("\x00", "0") + " w" for line in lines) + "\r\nw\r\n"
    monkeypatch.setattr(cache_module, "BLOCK_BYTES", block)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "corpus.txt")
        path.write_bytes(text.encode())
        texts = load_texts(str(path))[1:]
        assert "".join(texts) == universal_newlines(text)
        _check_corpus(load_corpus(str(path), level), texts, level)
        if not all(t.strip() for t in texts):  # both cuts in one line: the cache refuses the empty split
            with pytest.raises(DataError, match="split is empty"):
                cached_corpus(str(path), level, say=lambda *a, **k: None, progress=False)
            return
        _check_corpus(cached_corpus(str(path), level, say=lambda *a, **k: None, progress=False)[0], texts, level)
