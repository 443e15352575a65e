"""Training with qrnn.train: bf16 autocast against float32 (CPU; fp16 against fp32 on a GPU),
and the same short run with and without a checkpoint every epoch, all in one run."""

from __future__ import annotations

import tempfile

import torch
import torch.nn.functional as F

from .common import Result, measure_interleaved

AREA = "train"


def _setup(device, precision, hidden, emsize=128, layers=3, batch=32, bptt=64, vocab=104, **trainer_args):
    from qrnn.lm import QRNNLanguageModel
    from qrnn.train import Distributed, Trainer

    torch.manual_seed(0)
    model = QRNNLanguageModel(vocab, emsize=emsize, hidden=hidden, layers=layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    trainer = Trainer(model, optimizer, loss_fn, precision=precision, dist=Distributed(device=torch.device(device)),
                      clip_norm=0.25, stateful=True, progress=False, log=lambda message: None, **trainer_args)
    return trainer


def _batches(device, tokens, batch, bptt, vocab=104):
    from qrnn.data import BPTTBatches

    torch.manual_seed(1)
    return BPTTBatches(torch.randint(0, vocab, (tokens,)), batch, bptt)


def step_speed(device, low, hidden, quick) -> list:
    """One training step (forward, backward, clip, Adam) in float32 and in `low` autocast."""
    batches = _batches(device, 32 * 65 * 4, 32, 64)
    trainers = {p: _setup(device, p, hidden) for p in ("fp32", low)}
    counters = {p: 0 for p in trainers}

    def step(p):
        def run():
            x, y = batches[counters[p] % len(batches)]
            counters[p] += 1
            trainers[p].train_step(x, y)
        return run

    t = measure_interleaved({p: step(p) for p in trainers}, device=device, rounds=3 if quick else 7,
                            repeat=2 if quick else 4, warmup=2)
    speedup = t["fp32"] / t[low]
    tokens = 32 * 64
    note = (f"fp32 {t['fp32'] * 1e3:.0f} ms ({tokens / t['fp32']:,.0f} tok/s), "
            f"{low} {t[low] * 1e3:.0f} ms ({tokens / t[low]:,.0f} tok/s)")
    name = f"{low} vs fp32 training step, {device}, hidden {hidden}, 3 layers, batch 32 x bptt 64"
    if device == "cpu" and hidden >= 1024:
        return [Result(AREA, name, speedup, "x", ">= 2x", speedup >= 2.0, note)]
    return [Result(AREA, name, speedup, "x", None, None, note)]


# The default qrnn-train model, and AWD-QRNN's word-level PTB model (where the 28 s per epoch
# on a GPU comes from) for the GPU comparison.
DEFAULT_MODEL = dict(vocab=104, emsize=128, hidden=256, layers=3, batch=16, bptt=64)
AWD_QRNN_PTB = dict(vocab=10000, emsize=400, hidden=1550, layers=4, batch=20, bptt=70)


def short_runs(device, precisions, config, quick) -> tuple:
    """The same short run (2 epochs of N steps, validation) with and without a checkpoint every
    epoch; returns results and the per-precision epoch seconds without checkpoints."""
    steps = 12 if quick else 60
    batch, bptt, vocab, hidden = config["batch"], config["bptt"], config["vocab"], config["hidden"]
    train = _batches(device, batch * (bptt * steps + 1), batch, bptt, vocab)
    valid = _batches(device, batch * (bptt * 4 + 1), batch, bptt, vocab)
    results, epoch_seconds = [], {}
    for precision in precisions:
        times = {False: [], True: []}
        stalls = []
        # Alternate the runs with and without checkpoints so a noisy neighbour hits both alike.
        for _ in range(1 if quick else 3):
            for checkpointing in (False, True):
                with tempfile.TemporaryDirectory() as folder:
                    trainer = _setup(device, precision, checkpoint_dir=folder if checkpointing else None, **config)
                    history = trainer.fit(train, valid, epochs=2)
                times[checkpointing] += [r["seconds"] for r in history]
                if checkpointing:
                    # Epoch 2 holds both parts of a stall: its first optimizer.step() waits for
                    # the staging of epoch 1's save, and its own save() blocks briefly.
                    stalls.append((history[1]["checkpoint_stall_pct"], history[1]["checkpoint_stall_ms"],
                                   history[1]["seconds"]))
        stall_pct, stall_ms, seconds = max(stalls)
        with_ckpt, without = min(times[True]), min(times[False])
        epoch_seconds[precision] = without
        shape = f"{device} {precision}, hidden {hidden}, {steps} steps/epoch"
        results.append(Result(AREA, f"checkpoint stall per epoch, {shape}", stall_pct, "%", "<= 1%",
                              stall_pct <= 1.0, f"worst: {stall_ms:.1f} ms of a {seconds:.2f} s epoch"))
        ratio = with_ckpt / without
        results.append(Result(AREA, f"epoch time with / without checkpoints, {shape}", ratio, "x", None, None,
                              f"best epochs: {with_ckpt:.2f} s vs {without:.2f} s"))
    return results, epoch_seconds


def run(quick: bool = False) -> list:
    results = []
    results += step_speed("cpu", "bf16", 1024, quick)
    if not quick:
        results += step_speed("cpu", "bf16", 256, quick)
    more, cpu_epochs = short_runs("cpu", ("fp32", "bf16"), DEFAULT_MODEL, quick)
    results += more
    ratio = cpu_epochs["bf16"] / cpu_epochs["fp32"]
    results.append(Result(AREA, "bf16 / fp32 epoch time, cpu, default model (hidden 256)", ratio, "x", None, None,
                          f"{cpu_epochs['bf16']:.2f} s vs {cpu_epochs['fp32']:.2f} s"))
    if torch.cuda.is_available():
        more, gpu_epochs = short_runs("cuda", ("fp32", "fp16"), AWD_QRNN_PTB, quick)
        results += more
        ratio = gpu_epochs["fp16"] / gpu_epochs["fp32"]
        results.append(Result(AREA, "fp16 / fp32 epoch time, cuda, AWD-QRNN PTB model", ratio, "x", "<= 0.65x",
                              ratio <= 0.65, f"{gpu_epochs['fp16']:.2f} s vs {gpu_epochs['fp32']:.2f} s"))
    else:
        results.append(Result(AREA, "fp16 / fp32 epoch time, cuda", float("nan"), "x", "<= 0.65x", None,
                              "skipped: no CUDA device"))
    return results
