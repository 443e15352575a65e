"""First tokenization of a word-level corpus against one pass of ``str.split`` over the same
text, in the same run: the corpus cache's first build (``qrnn-train --data``) and the
in-memory path (``load_corpus``: ``Vocabulary.build`` and ``encode``), on a generated text of
about 50 MB (Zipf-distributed words, vocabulary 50,000). Each is timed in a fresh process,
best of a few runs, interleaved with the ``str.split`` pass."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .common import Result
from .scale import QUICK, measure_subprocess, write_corpus

AREA = "tokenize"

SHAPE = dict(train=10_000_000, valid=50_000, test=50_000, vocab=50_000)

_LOAD = r'''
import json, sys, time
from qrnn.train.data import load_corpus
start = time.perf_counter()
corpus = load_corpus(sys.argv[2], "word")
print(json.dumps({"seconds": time.perf_counter() - start, "tokens": corpus.train.numel()}))
'''


def run(quick: bool = False) -> list:
    shape = QUICK if quick else SHAPE
    rounds = 1 if quick else 3
    best: dict = {}
    with tempfile.TemporaryDirectory() as folder:
        data = write_corpus(Path(folder) / "zipf", shape)
        megabytes = (data / "train.txt").stat().st_size / 1e6
        for _ in range(rounds):  # interleaved: a busy moment slows every contender alike
            for mode in ("split", "build", "load"):
                result = measure_subprocess(mode, data, script=_LOAD if mode == "load" else None)
                if mode == "build":  # a fresh cache each round: every build is a first build
                    assert result["built_here"]
                    for cache in (data / ".qrnn-cache", data / "cache"):
                        shutil.rmtree(cache, ignore_errors=True)
                best[mode] = min(best.get(mode, float("inf")), result["seconds"])
    shape_text = f"{megabytes:.0f} MB, {shape['train'] / 1e6:.1f}M tokens, vocabulary {shape['vocab']:,}"
    results = []
    for mode, what in (("build", "corpus cache, first build"), ("load", "load_corpus (Vocabulary.build + encode)")):
        ratio = best[mode] / best["split"]
        results.append(Result(AREA, f"{what} vs one str.split pass, {shape_text}", ratio, "x", "<= 2x",
                              ratio <= 2.0, f"{best[mode]:.2f} s vs {best['split']:.2f} s (best of {rounds})",
                              series={"tokenize (s)": best[mode], "str.split (s)": best["split"]}))
    return results
