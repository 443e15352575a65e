"""WikiText-103 scale: the split softmax's share of a training step at WikiText-103's
vocabulary (267,735 words) against the full softmax's, the split softmax's validation
perplexity against the full one's after the same steps on real text, and the tokenized
corpus cache on a corpus of WikiText-103's shape (103M training tokens; Zipf-distributed
words): the first build's time against one pass of ``str.split`` over the same text and its
peak memory, the start of a run to its first training step on a warm cache, and the data's
private memory in a rank."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .common import Result

AREA = "scale"

WT103 = dict(train=103_227_021, valid=217_646, test=245_569, vocab=267_735)
QUICK = dict(train=400_000, valid=20_000, test=20_000, vocab=30_000)


def write_corpus(folder: Path, shape: dict, seed: int = 0) -> Path:
    """train/valid/test.txt of Zipf-distributed words (vocabulary `shape["vocab"]`, the
    end-of-line token included) in lines of about 100 words, written block by block."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(shape["vocab"] - 1)], dtype=object)
    probs = 1.0 / np.arange(1, len(words) + 1)
    probs /= probs.sum()
    cdf = np.cumsum(probs)
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        with open(folder / f"{split}.txt", "w") as out:
            left = shape[split]
            while left > 0:
                n = min(left, 1_000_000)
                ids = np.minimum(np.searchsorted(cdf, rng.random(n)), len(words) - 1)
                if split == "train" and left == shape[split]:
                    ids[: len(words)] = np.arange(min(n, len(words)))  # every word occurs in training
                lines = words[ids].reshape(-1, 100) if n % 100 == 0 else words[ids].reshape(1, -1)
                out.write("\n".join(" ".join(line) for line in lines) + "\n")
                left -= n
    return folder


def _softmax_share(quick: bool) -> list:
    """One training step's forward and backward, QRNN stack vs softmax on its output, at
    WikiText-103's vocabulary: the full softmax and the split one (awd-lstm-lm's splits)."""
    from qrnn import QRNN
    from qrnn.train.softmax import SplitSoftmax, default_cutoffs

    vocab = 30_000 if quick else WT103["vocab"]
    # The WikiText-103 preset's model (4 x 2500, emsize 400) and BPTT length, at batch 10
    # (awd-lstm-lm's evaluation batch; its training batch of 60 makes the QRNN's share larger).
    hidden, emsize, (steps, batch) = (64, 32, (16, 4)) if quick else (2500, 400, (140, 10))
    torch.manual_seed(0)
    stack = [QRNN(emsize, hidden, window=2), QRNN(hidden, hidden), QRNN(hidden, hidden), QRNN(hidden, emsize)]
    weight = torch.nn.Parameter(torch.randn(vocab, emsize) * 0.1)
    bias = torch.nn.Parameter(torch.zeros(vocab))
    split = SplitSoftmax(emsize, vocab, default_cutoffs(WT103["vocab"]) if not quick else default_cutoffs(vocab))
    probs = 1.0 / np.arange(1, vocab + 1)
    targets = torch.from_numpy(np.random.default_rng(0).choice(vocab, steps * batch, p=probs / probs.sum()))
    x = torch.randn(steps, batch, emsize)

    def run_stack():
        h = x
        for layer in stack:
            h, _ = layer(h)
        h.sum().backward()

    h = x
    with torch.no_grad():
        for layer in stack:
            h, _ = layer(h)
    features = h.reshape(-1, emsize).requires_grad_()

    def full():
        logits = torch.nn.functional.linear(features, weight, bias)
        torch.nn.functional.cross_entropy(logits, targets).backward()

    def adaptive():
        split.nll(weight, bias, features, targets).mean().backward()

    timings: dict = {"stack": [], "full": [], "adaptive": []}
    fns = {"stack": run_stack, "full": full, "adaptive": adaptive}
    for fn in fns.values():
        fn()
    for _ in range(2 if quick else 3):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - start)
    t = {name: statistics.median(v) for name, v in timings.items()}
    shape = f"vocabulary {vocab:,}, 4 x {hidden}, emsize {emsize}, {steps * batch} tokens"
    results = []
    for name, target in (("full", None), ("adaptive", 35.0)):
        share = 100 * t[name] / (t[name] + t["stack"])
        results.append(Result(AREA, f"{name} softmax's share of a training step, {shape}, cpu", share, "%",
                              None if target is None else f"<= {target:g}%",
                              None if target is None else share <= target,
                              f"softmax {t[name] * 1e3:.0f} ms, QRNN stack {t['stack'] * 1e3:.0f} ms"))
    return results


def _perplexity(quick: bool) -> Result:
    """Validation perplexity of the split softmax against the full one after the same steps
    of the same model on Python's reference text at word level."""
    from qrnn.train.settings import Settings
    from qrnn.train.setup import build_training

    with tempfile.TemporaryDirectory() as folder:
        from qrnn.train.data import default_text

        path = Path(folder) / "reference.txt"
        path.write_text(default_text(), encoding="utf-8")
        steps = 40 if quick else 400
        losses = {}
        for softmax in ("full", "adaptive"):
            settings = Settings(data=str(path), level="word", softmax=softmax, layers=2, hidden=128, emsize=64,
                                batch_size=16, bptt=35, lr=3e-3, warmup=20, precision="fp32", no_progress=True,
                                sample_length=0, dropout=0.1)
            run = build_training(settings, say=lambda *a, **k: None)
            run.trainer.train_epoch(run.train_batches, max_steps=steps)
            losses[softmax] = run.trainer.evaluate(run.valid_batches)
            vocab = len(run.corpus.vocab)
    full, adaptive = np.exp(losses["full"]), np.exp(losses["adaptive"])
    ratio = adaptive / full
    return Result(AREA, f"adaptive / full softmax validation perplexity after {steps} steps, reference text "
                        f"(vocabulary {vocab:,})", ratio, "x", "<= 1.05x", ratio <= 1.05,
                  f"ppl {adaptive:.1f} vs {full:.1f}")


_MEASURE = r'''
import json, os, sys, time
mode, path = sys.argv[1], sys.argv[2]

def status_kb(field):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))

def anon_kb():
    return status_kb("RssAnon")

start = time.perf_counter()
if mode == "split":  # one pass of str.split over the text, block by block
    words = 0
    with open(os.path.join(path, "train.txt"), "rb") as fh:
        while block := fh.read(4 << 20):
            words += len(block.decode().split())
    print(json.dumps({"seconds": time.perf_counter() - start}))
    sys.exit()
import torch
from qrnn.train.cache import cached_corpus
from qrnn.train.data import BPTTBatches
before = anon_kb()
start = time.perf_counter()
corpus, info = cached_corpus(path, "word", say=lambda *a, **k: None, progress=False)
built = time.perf_counter() - start
batches = BPTTBatches(corpus.train, 60, 140)
first = batches[0]
for i in range(0, len(batches), max(1, len(batches) // 50)):
    batches[i]  # read across the corpus
result = {"built_here": info.built_here, "seconds": built,
          # VmHWM: this process image's peak (ru_maxrss would carry the forking parent's over exec).
          "peak_mb": status_kb("VmHWM") / 1024,
          "data_private_mb": (anon_kb() - before) / 1024}
if mode == "start":  # to the first training step of a small model on the mapped corpus
    from qrnn.train.lm import QRNNLanguageModel, lm_loss
    from qrnn.train.softmax import default_cutoffs
    cutoffs = default_cutoffs(len(corpus.vocab))
    model = QRNNLanguageModel(len(corpus.vocab), emsize=16, hidden=16, layers=2, cutoffs=cutoffs)
    features, _ = model(first[0])
    lm_loss(model, features, first[1])[0].backward()
    result["first_step_at"] = time.time()
print(json.dumps(result))
'''


def measure_subprocess(mode: str, data: Path, script: Optional[str] = None) -> dict:
    """The JSON line `script` (default: the cache's measurements, `mode` "split", "build" or
    "start") prints when run in a fresh interpreter on the corpus folder `data`."""
    launched = time.time()
    done = subprocess.run([sys.executable, "-c", script or _MEASURE, mode, str(data)], capture_output=True, text=True,
                          timeout=3600, env=dict(os.environ, QRNN_CACHE_DIR=str(data / "cache")))
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if "first_step_at" in result:  # from the launch: interpreter start and imports included
        result["first_step_seconds"] = result["first_step_at"] - launched
    return result


def _cache(quick: bool) -> list:
    shape = QUICK if quick else WT103
    with tempfile.TemporaryDirectory() as folder:
        data = write_corpus(Path(folder) / "wt103-shaped", shape)
        split = measure_subprocess("split", data)
        build = measure_subprocess("build", data)
        warm = measure_subprocess("start", data)
        assert build["built_here"] and not warm["built_here"]
    tokens = f"{shape['train'] / 1e6:.1f}M tokens, vocabulary {shape['vocab']:,}"
    ratio = build["seconds"] / split["seconds"]
    return [
        Result(AREA, f"corpus cache, first build vs one str.split pass, {tokens}", ratio, "x", "<= 2x", ratio <= 2.0,
               f"{build['seconds']:.1f} s vs {split['seconds']:.1f} s"),
        Result(AREA, f"corpus cache, first build's peak memory, {tokens}", build["peak_mb"], " MB", "<= 2048 MB",
               build["peak_mb"] <= 2048, "the building process's peak resident memory (VmHWM), torch imported"),
        Result(AREA, f"start to the first training step, warm cache, {tokens}", warm["first_step_seconds"], " s",
               "<= 5 s", warm["first_step_seconds"] <= 5.0,
               f"interpreter start, imports, cache check, map, model, one step (cache check and map "
               f"{warm['seconds']:.1f} s)"),
        Result(AREA, f"the data's private memory in a rank, warm cache, {tokens}", warm["data_private_mb"], " MB",
               "<= 100 MB", warm["data_private_mb"] <= 100, "anonymous resident memory added by mapping the corpus "
               "and reading batches across it"),
    ]


def _timed_process(args: list) -> float:
    """Wall time of a fresh interpreter running `args` (interpreter start and imports included)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True, timeout=600)
    return time.perf_counter() - start


def _generate_start(quick: bool) -> Result:
    """qrnn-generate's first token against `import torch` and loading the same checkpoint,
    each a whole fresh process, interleaved, best of a few: what sampling adds to loading."""
    rounds = 1 if quick else 5
    with tempfile.TemporaryDirectory() as folder:
        run_dir = os.path.join(folder, "run")  # qrnn-train's default model, one step
        subprocess.run([sys.executable, "-m", "qrnn.train", "--max-steps", "1", "--no-progress", "--sample-length",
                        "0", "--precision", "fp32", "--checkpoint-dir", run_dir], check=True, capture_output=True,
                       timeout=1800)
        best_pt = os.path.join(run_dir, "best.pt")
        load = ["-c", "import sys, torch; torch.load(sys.argv[1], weights_only=True)", best_pt]
        sample = ["-c", "import sys; from qrnn.train.generate import generate_main; "
                  "sys.exit(generate_main(sys.argv[1:]))", "--checkpoint", best_pt, "--length", "1"]
        best = {"load": float("inf"), "sample": float("inf")}
        for _ in range(rounds):
            best["load"] = min(best["load"], _timed_process(load))
            best["sample"] = min(best["sample"], _timed_process(sample))
    ratio = best["sample"] / best["load"]
    return Result(AREA, "qrnn-generate's first token vs import torch and torch.load of the checkpoint", ratio, "x",
                  "<= 1.5x", ratio <= 1.5, f"{best['sample']:.2f} s vs {best['load']:.2f} s, fresh processes, best "
                  f"of {rounds}; qrnn-train's default model")


def run(quick: bool = False) -> list:
    return _softmax_share(quick) + [_perplexity(quick)] + _cache(quick) + [_generate_start(quick)]
