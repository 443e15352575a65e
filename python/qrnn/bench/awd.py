"""AWD-QRNN's recipes in ``qrnn-train``: each preset's model on a corpus generated at Penn
Treebank's shape (about 930k training tokens, 10k words), float32 and bf16, the estimated
epoch, and the share of a training step that is not the QRNN stack (softmax, optimizer,
regularisation, data).

With ``AWD_LSTM_LM`` naming a checkout of salesforce/awd-lstm-lm, also awd-lstm-lm's own
``main.py --model QRNN`` on the same data, unedited, in a subprocess (its QRNN layers are
this package's, through ``torchqrnn``): its training step against ``qrnn-train``'s with the
PTB recipe on, and the loss sequence of both from the same initial weights with dropouts and
weight drop off, a fixed BPTT length and SGD at lr 2 (where awd-lstm-lm agrees with itself).
"""

from __future__ import annotations

import math
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

AREA = "awd"

PTB_SHAPE = dict(train=929_589, valid=73_760, test=82_430, vocab=10_000)
QUICK_SHAPE = dict(train=30_000, valid=3_000, test=3_000, vocab=500)
# Small models for the quick smoke run (the presets' structure, a fraction of the width).
QUICK_SIZES = dict(hidden=48, emsize=24)


def write_corpus(folder: Path, shape: dict, seed: int = 0) -> Path:
    """train.txt / valid.txt / test.txt of Zipf-distributed words in lines of about 21 words,
    as Penn Treebank's: the end-of-line token and ``<unk>`` are words too, and every word of
    validation and test occurs in training (so every tool builds the same vocabulary).
    `shape` gives the token counts and the vocabulary."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(shape["vocab"] - 1)], dtype=object)
    words[min(30, len(words) - 1)] = "<unk>"  # PTB's most frequent words include <unk>
    probs = 1.0 / np.arange(1, len(words) + 1)
    probs /= probs.sum()
    folder.mkdir(parents=True, exist_ok=True)
    in_train = None
    for split in ("train", "valid", "test"):
        ids = rng.choice(len(words), size=shape[split], p=probs)
        if in_train is None:
            in_train = np.zeros(len(words), dtype=bool)
            in_train[ids] = True
        ids = ids[in_train[ids]]
        cuts = np.cumsum(rng.integers(10, 32, size=shape[split] // 10 + 2))
        lines = np.split(words[ids], cuts[cuts < len(ids)])
        text = "\n".join(" ".join(line) for line in lines if len(line)) + "\n"
        (folder / f"{split}.txt").write_text(text)
    return folder


# ---- qrnn-train's side


def _flags(preset: str, quick: bool, overrides: Optional[dict] = None) -> dict:
    from qrnn.train.settings import PRESETS

    flags = dict(PRESETS[preset])
    if quick:
        flags.update(QUICK_SIZES)
    flags.update(overrides or {})
    return flags


def qrnn_run(data: Path, preset: str, precision: str, quick: bool, overrides: Optional[dict] = None):
    """A :class:`qrnn.train.setup.TrainingRun` for `preset` as qrnn-train builds it (its settings,
    model, loss, optimizer and learning rates), without checkpoints or progress bar."""
    from qrnn.train.settings import Settings
    from qrnn.train.setup import build_training

    flags = _flags(preset, quick, overrides)
    settings = Settings(**{**flags, "data": str(data), "preset": preset, "precision": precision,
                           "no_progress": True, "sample_length": 0})
    return build_training(settings, say=lambda *a, **k: None)


def qrnn_step_seconds(trainer, batches, steps: int, warmup: int = 1) -> float:
    """Median seconds of a training step of `trainer` over `batches` (the loop's own work
    included: the step's decision, data, bookkeeping), after `warmup` steps."""
    trainer.train_epoch(batches, max_steps=trainer.step + warmup)
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.train_epoch(batches, max_steps=trainer.step + 1)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def qrnn_stack_share(trainer, batches, repeat: int) -> tuple:
    """(seconds of the whole step, seconds of the QRNN stack's forward and backward alone on
    the same shapes and precision): the rest is softmax, optimizer, regularisation, data."""
    model = trainer.module
    inputs, _ = batches[0]
    x = model.embedding(inputs.to(trainer.device)).detach().requires_grad_()
    layers = list(model.layers)

    def stack():
        with trainer.autocast():
            h = x
            for layer in layers:
                h, _ = layer(h)
        h.float().sum().backward()

    for _ in range(2):
        stack()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        stack()
        samples.append(time.perf_counter() - start)
    step = qrnn_step_seconds(trainer, batches, repeat)
    return step, statistics.median(samples)


def loop_overhead(data: Path, preset: str, quick: bool) -> Result:
    """qrnn-train's loop (Trainer.train_epoch: its stop and save decisions, learning rates,
    bookkeeping, progress) against a bare loop doing the same work on a twin of the model
    (the step's learning rate, forward, loss with AR/TAR, backward, clip, optimizer step, the
    carried state detached), over the same batches, timed in interleaved rounds."""
    import torch.nn as nn

    from qrnn.train.lm import lm_loss
    from qrnn.train.state import tree_map

    steps, rounds = (3, 3) if quick else (2, 3)
    ours, twin = qrnn_run(data, preset, "fp32", quick), qrnn_run(data, preset, "fp32", quick)
    trainer, settings = ours.trainer, twin.settings
    model, optimizer, batches = twin.model, twin.trainer.optimizer, twin.train_batches
    params = list(model.parameters())
    lr_at = twin.trainer.schedule.lr_at
    assert lr_at is not None
    bare: dict = {"carry": None}
    bare_step = [0]

    def bare_steps():
        for _ in range(steps):
            inputs, targets = batches[bare_step[0] % len(batches)]
            for group in optimizer.param_groups:
                group["lr"] = lr_at(bare_step[0], 0, targets.shape[0])
            optimizer.zero_grad(set_to_none=True)
            features, carry = model(inputs, bare["carry"])
            loss, _ = lm_loss(model, features, targets, settings.alpha, settings.beta)
            loss.backward()
            nn.utils.clip_grad_norm_(params, settings.clip)
            optimizer.step()
            bare["carry"] = tree_map(torch.Tensor.detach, carry)
            bare_step[0] += 1

    def loop_steps():
        if trainer.position + steps > len(batches):
            trainer.position, trainer.carry = 0, None
        trainer.train_epoch(batches, max_steps=trainer.step + steps)

    samples: dict = {"loop": [], "bare": []}
    for fn in (loop_steps, bare_steps):
        fn()  # warm-up
    for round_index in range(rounds):
        order = [("loop", loop_steps), ("bare", bare_steps)]
        for name, fn in order if round_index % 2 == 0 else reversed(order):
            start = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - start) / steps)
    loop, bare_s = statistics.median(samples["loop"]), statistics.median(samples["bare"])
    overhead = 100 * (loop - bare_s) / loop
    return Result(AREA, f"{preset}: qrnn-train's own loop overhead (share of the step), cpu fp32"
                        f"{', quick sizes' if quick else ''}", overhead, "%", "<= 3%", overhead <= 3.0,
                  f"{loop * 1e3:.1f} vs {bare_s * 1e3:.1f} ms per step (qrnn-train vs bare loop)")


# ---- awd-lstm-lm's side: its main.py, unedited, in a subprocess


_AWD_DRIVER = r'''
import os, runpy, sys, time
import numpy as np
import torch
awd, out, steps, fixed = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "fixed"
sys.argv = [os.path.join(awd, "main.py")] + sys.argv[5:]
sys.path.insert(0, awd)
import data as awd_data, model as awd_model, splitcross
record = {"losses": [], "times": [], "initial": None, "words": None}
models = []

class Done(Exception):
    pass

init = awd_model.RNNModel.__init__
def model_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    models.append(self)
    record["initial"] = {k: v.detach().clone() for k, v in self.state_dict().items()}
awd_model.RNNModel.__init__ = model_init

corpus_init = awd_data.Corpus.__init__
def corpus(self, path):
    corpus_init(self, path)
    record["words"] = list(self.dictionary.idx2word)
awd_data.Corpus.__init__ = corpus

forward = splitcross.SplitCrossEntropyLoss.forward
def criterion(self, *args, **kwargs):
    if models[0].training:
        record["times"].append(time.perf_counter())
        if len(record["losses"]) == steps:
            raise Done()
    loss = forward(self, *args, **kwargs)
    if models[0].training:
        record["losses"].append(loss.item())
    return loss
splitcross.SplitCrossEntropyLoss.forward = criterion

if fixed:  # main.py's random BPTT length, pinned to --bptt
    np.random.random = lambda *a: 0.0
    np.random.normal = lambda loc, scale: loc
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except Done:
    pass
torch.save(record, out)
'''

# qrnn-train's settings -> awd-lstm-lm's main.py flags.
_AWD_FLAGS = dict(emsize="emsize", hidden="nhid", layers="nlayers", lr="lr", clip="clip", batch_size="batch_size",
                  bptt="bptt", dropout="dropout", dropouth="dropouth", dropouti="dropouti", dropoute="dropoute",
                  wdrop="wdrop", seed="seed", nonmono="nonmono", alpha="alpha", beta="beta", wdecay="wdecay")


def awd_run(awd_dir: str, data: Path, flags: dict, steps: int, fixed_length: bool) -> dict:
    """awd-lstm-lm's main.py for `steps` training steps: losses, the time of each step's
    loss call, the initial weights and its vocabulary (word of each id)."""
    optimizer = "adam" if flags["optimizer"] == "adam" else "sgd"  # its sgd is NT-ASGD
    argv = ["--data", str(data), "--model", "QRNN", "--epochs", "1", "--cuda", "--log-interval", "1000000",
            "--optimizer", optimizer]
    for ours, theirs in _AWD_FLAGS.items():
        argv += [f"--{theirs}", str(flags[ours])]
    if flags.get("when"):
        argv += ["--when"] + [str(e) for e in flags["when"]]
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "record.pt")
        argv += ["--save", os.path.join(work, "model.pt")]
        command = [sys.executable, "-c", _AWD_DRIVER, awd_dir, out, str(steps), "fixed" if fixed_length else "random"]
        done = subprocess.run(command + argv, cwd=work, capture_output=True, text=True, timeout=7200)
        if done.returncode != 0 or not os.path.exists(out):
            raise RuntimeError(f"awd-lstm-lm's main.py failed: {done.stderr[-2000:]}")
        return torch.load(out, weights_only=False)


def load_awd_weights(trainer, record: dict, vocab) -> None:
    """Copy awd-lstm-lm's initial weights into qrnn-train's model (rows of the embedding and
    decoder bias permuted from its word ids to ours)."""
    initial = record["initial"]
    ours = torch.tensor([vocab.tokens.index(w) if w in vocab.tokens else 0 for w in record["words"]])
    model = trainer.module
    with torch.no_grad():
        model.embedding.weight[ours] = initial["encoder.weight"]
        model.decoder.bias[ours] = initial["decoder.bias"]
        for i, layer in enumerate(model.layers):
            linear = layer.layers[0].linear
            linear.weight.copy_(initial[f"rnns.{i}.linear.module.weight_raw"])
            linear.bias.copy_(initial[f"rnns.{i}.linear.module.bias"])


def same_recipe(awd_dir: str, data: Path, quick: bool, steps: int) -> Result:
    """The first `steps` SGD steps from the same weights, regularisers' randomness off."""
    overrides = dict(dropout=0.0, dropouth=0.0, dropouti=0.0, dropoute=0.0, wdrop=0.0, lr=2.0,
                     bptt_lengths="fixed")
    flags = _flags("awd-qrnn-ptb", quick, overrides)
    record = awd_run(awd_dir, data, flags, steps, fixed_length=True)
    run = qrnn_run(data, "awd-qrnn-ptb", "fp32", quick, overrides)
    trainer, batches = run.trainer, run.train_batches
    load_awd_weights(trainer, record, run.corpus.vocab)
    ours = []
    for _ in range(steps):
        before = len(trainer.loss_trace)
        trainer.trace_every = 1
        trainer.train_epoch(batches, max_steps=trainer.step + 1)
        ours.append(trainer.loss_trace[before][1])
    theirs = record["losses"][:steps]
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    return Result(AREA, f"loss sequence vs awd-lstm-lm, first {steps} SGD steps, PTB preset "
                        f"({'quick sizes' if quick else 'full size'}), fp32", worst, "", "<= 1e-4 relative",
                  worst <= 1e-4, f"first {theirs[0]:.5f} vs {ours[0]:.5f}, last {theirs[-1]:.5f} vs {ours[-1]:.5f}")


def _precisions(quick: bool) -> tuple:
    """fp32, and bf16 where this CPU runs it natively (elsewhere torch emulates bfloat16
    matrix products: measured 6x slower than float32 forward and up to 280x in backward on
    an AVX2 CPU, minutes per full-size step), or in a quick run (small shapes)."""
    from qrnn.train.precision import cpu_bf16_support

    return ("fp32", "bf16") if quick or cpu_bf16_support()[0] else ("fp32",)


def _bf16_skipped(name: str, target: str) -> Result:
    from qrnn.train.precision import cpu_bf16_support

    return Result(AREA, name, math.nan, "x", target, None,
                  f"skipped: {cpu_bf16_support()[1]}: bfloat16 matrix products are emulated here "
                  "(--precision auto trains fp32)")


def against_awd(awd_dir: str, data: Path, quick: bool, steps: int) -> list:
    """qrnn-train's PTB-preset step (fp32, and bf16) against main.py's (fp32), whole recipe on."""
    flags = _flags("awd-qrnn-ptb", quick)
    record = awd_run(awd_dir, data, flags, steps + 2, fixed_length=False)
    awd_step = statistics.median(np.diff(record["times"][2:]).tolist())
    results = []
    precisions = _precisions(quick)
    for precision, target in (("fp32", 1.0), ("bf16", 0.4)):
        name = (f"PTB preset training step, qrnn-train {precision} vs awd-lstm-lm main.py fp32 (same kernels), "
                f"cpu{', quick sizes' if quick else ''}")
        if precision not in precisions:
            results.append(_bf16_skipped(name, f"<= {target}x"))
            continue
        run = qrnn_run(data, "awd-qrnn-ptb", precision, quick)
        ours = qrnn_step_seconds(run.trainer, run.train_batches, steps)
        ratio = ours / awd_step
        results.append(Result(AREA, name, ratio, "x", f"<= {target}x", ratio <= target,
                              f"{ours * 1e3:.0f} vs {awd_step * 1e3:.0f} ms per step (median of {steps})"))
    return results


def run(quick: bool = False) -> list:
    results = []
    with tempfile.TemporaryDirectory() as folder:
        shape = QUICK_SHAPE if quick else PTB_SHAPE
        data = write_corpus(Path(folder) / "ptb-shaped", shape)
        repeat = 2
        for preset in ("awd-qrnn-ptb", "awd-qrnn-wt2", "awd-qrnn-wt103"):
            seconds = {}
            for precision in _precisions(quick):
                run = qrnn_run(data, preset, precision, quick)
                step, stack = qrnn_stack_share(run.trainer, run.train_batches, repeat)
                seconds[precision] = step
                flags = _flags(preset, quick)
                epoch = step * shape["train"] / (flags["batch_size"] * flags["bptt"])
                results.append(Result(AREA, f"{preset}: share of the step outside the QRNN stack, cpu {precision}",
                                      100 * (1 - stack / step), "%", None, None,
                                      f"step {step * 1e3:.0f} ms, QRNN stack {stack * 1e3:.0f} ms; epoch at PTB "
                                      f"shape about {epoch / 60:.1f} min"))
            if "bf16" in seconds:
                results.append(Result(AREA, f"{preset}: bf16 / fp32 training step, cpu",
                                      seconds["bf16"] / seconds["fp32"], "x", None, None,
                                      f"{seconds['bf16'] * 1e3:.0f} vs {seconds['fp32'] * 1e3:.0f} ms"))
        results.append(loop_overhead(data, "awd-qrnn-ptb", quick))
        awd_dir = os.environ.get("AWD_LSTM_LM")
        if awd_dir:
            results.append(same_recipe(awd_dir, data, quick, 5 if quick else 100))
            results += against_awd(awd_dir, data, quick, 3 if quick else 6)
        else:
            for name, target in (("loss sequence vs awd-lstm-lm", "<= 1e-4 relative"),
                                 ("PTB preset step vs awd-lstm-lm main.py", "<= 1.0x")):
                results.append(Result(AREA, name, math.nan, "", target, None,
                                      "skipped: set AWD_LSTM_LM to a checkout of salesforce/awd-lstm-lm"))
    return results
