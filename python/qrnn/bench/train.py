"""Training with qrnn.train: bf16 autocast against float32 on the CPU (fp16 against fp32 on a
GPU), the same short run with and without a checkpoint every epoch, and qrnn-train's training
loop against a bare loop of the same model (the application's own overhead), all in one run.

Models: the default ``qrnn-train`` model (3 QRNN layers, hidden 256, emsize 128, char
vocabulary 104, batch 16 x bptt 64), the same at hidden 1024 for the bf16 target, and on a
GPU AWD-QRNN's PTB model (4 layers of 1550, emsize 400, vocabulary 10,000, batch 20 x bptt 70).
"""

from __future__ import annotations

import tempfile
from typing import Optional

import torch

from .common import Result, measure_interleaved

AREA = "train"

# The default qrnn-train model (char level), and AWD-QRNN's word-level PTB model (where the
# 28 s per epoch on a GPU comes from) for the GPU comparison.
DEFAULT_MODEL = dict(vocab=104, emsize=128, hidden=256, layers=3, batch=16, bptt=64)
AWD_QRNN_PTB = dict(vocab=10000, emsize=400, hidden=1550, layers=4, batch=20, bptt=70)


def _describe(config: dict) -> str:
    if config == DEFAULT_MODEL:
        return "default model (hidden 256)"
    if config == AWD_QRNN_PTB:
        return "AWD-QRNN PTB model (4 x 1550, vocab 10k)"
    if dict(config, hidden=DEFAULT_MODEL["hidden"]) == DEFAULT_MODEL:
        return f"default model at hidden {config['hidden']}"
    return str(config)


def _trainer(device: str, precision: str, config: dict, checkpoint_dir: Optional[str] = None):
    from qrnn.train import BPTTConfig, CheckpointConfig, Distributed, PrecisionConfig, Trainer
    from qrnn.train.lm import QRNNLanguageModel, lm_loss
    from qrnn.train.optim import make_optimizer

    torch.manual_seed(0)
    model = QRNNLanguageModel(config["vocab"], emsize=config["emsize"], hidden=config["hidden"],
                              layers=config["layers"])
    optimizer = make_optimizer("adam", model.parameters(), 1e-3, torch.device(device))  # as qrnn-train does

    def loss_fn(features, targets):
        return lm_loss(model, features, targets)

    return Trainer(model, optimizer, loss_fn, precision=PrecisionConfig(precision, clip_norm=0.25),
                   checkpointing=CheckpointConfig(checkpoint_dir), bptt=BPTTConfig(stateful=True),
                   dist=Distributed(device=torch.device(device)), progress=False, log=lambda message: None)


def _batches(device: str, config: dict, steps: int):
    """`steps` BPTT chunks of random tokens, already on the device."""
    from qrnn.train.data import BPTTBatches

    torch.manual_seed(1)
    tokens = config["batch"] * (config["bptt"] * steps + 1)
    ids = torch.randint(0, config["vocab"], (tokens,), device=device)
    return BPTTBatches(ids, config["batch"], config["bptt"])


def step_speed(device: str, low: str, config: dict, quick: bool, target: bool) -> list:
    """One training step (forward, backward, unscale/clip, Adam) in float32 and under `low`
    autocast, timed in interleaved rounds."""
    batches = _batches(device, config, 8)
    trainers = {p: _trainer(device, p, config) for p in ("fp32", low)}
    counters = {p: 0 for p in trainers}

    def step(p):
        def one_step():
            x, y = batches[counters[p] % len(batches)]
            counters[p] += 1
            trainers[p].train_step(x, y)
        return one_step

    t = measure_interleaved({p: step(p) for p in trainers}, device=device, rounds=3 if quick else 7,
                            repeat=2 if quick else 4, warmup=2)
    speedup = t["fp32"] / t[low]
    tokens = config["batch"] * config["bptt"]
    note = (f"fp32 {t['fp32'] * 1e3:.0f} ms ({tokens / t['fp32']:,.0f} tok/s), "
            f"{low} {t[low] * 1e3:.0f} ms ({tokens / t[low]:,.0f} tok/s)")
    name = f"{low} vs fp32 training step, {device}, {_describe(config)}"
    if target:
        return [Result(AREA, name, speedup, "x", ">= 2x", speedup >= 2.0, note)]
    return [Result(AREA, name, speedup, "x", None, None, note)]


def application_overhead(device: str, precision: str, config: dict, quick: bool) -> list:
    """qrnn-train's training loop (Trainer.train_epoch: autocast, GradScaler, clipping, the
    carried state, its stop and save decisions, loss bookkeeping; no progress bar and no
    checkpoint folder) against a bare loop doing the same work on a twin of the model (forward
    under the same autocast, backward, clip, optimizer step, state carry), both over the same
    batches, timed in interleaved rounds."""
    from qrnn.train.lm import lm_loss
    from qrnn.train.optim import make_optimizer
    from qrnn.train.state import tree_map

    steps = 4 if quick else 8
    batches = _batches(device, config, steps)
    trainer = _trainer(device, precision, config)
    model = _trainer(device, precision, config).module  # the same weights, its own copy
    optimizer = make_optimizer("adam", model.parameters(), 1e-3, torch.device(device))
    params = list(model.parameters())
    autocast_dtype = trainer.autocast_dtype

    def bare_step(inputs, targets, carry):
        # A function per step, as train_step is: its outputs and graph are freed on return,
        # not held while the next step allocates (which costs a loop page faults).
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            features, carry = model(inputs, carry)
            loss, _ = lm_loss(model, features, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.25)
        optimizer.step()
        return tree_map(torch.Tensor.detach, carry)

    def bare_epoch():
        model.train()
        carry = None
        for index in range(len(batches)):
            inputs, targets = batches[index]
            carry = bare_step(inputs, targets, carry)

    loops = {"qrnn-train": lambda: trainer.train_epoch(batches), "bare": bare_epoch}
    # Both orders within each round pair, so that whatever the one running second inherits
    # (a warm cache, a freed pool) is shared alike.
    t = {name: 0.0 for name in loops}
    for order in (list(loops), list(reversed(loops))):
        times = measure_interleaved({name: loops[name] for name in order}, device=device,
                                    rounds=2 if quick else 9, repeat=1, warmup=1)
        for name, seconds in times.items():
            t[name] += seconds / 2
    ratio = t["qrnn-train"] / t["bare"]
    note = (f"{t['qrnn-train'] / steps * 1e3:.1f} vs {t['bare'] / steps * 1e3:.1f} ms per step "
            f"({precision}, {steps}-step epochs)")
    name = f"qrnn-train's training step vs a bare loop of the same model, {device}, {_describe(config)}"
    return [Result(AREA, name, ratio, "x", "<= 1.03x", ratio <= 1.03, note)]


def short_runs(device: str, precisions: tuple, config: dict, quick: bool) -> tuple:
    """The same short run (2 epochs of N steps plus validation) in each precision, with and
    without a checkpoint every epoch, the four variants alternating so that a noisy neighbour
    slows them alike. Returns the results and, per precision, the best epoch seconds without
    checkpoints."""
    steps = 24 if quick else 60
    train, valid = _batches(device, config, steps), _batches(device, config, 4)
    variants = [(p, ckpt) for p in precisions for ckpt in (False, True)]
    seconds: dict[tuple, list[float]] = {v: [] for v in variants}
    stalls: dict[str, list[tuple]] = {p: [] for p in precisions}  # (stall %, stall ms, epoch s)
    for _ in range(1 if quick else 3):
        for precision, checkpointing in variants:
            with tempfile.TemporaryDirectory() as folder:
                trainer = _trainer(device, precision, config, checkpoint_dir=folder if checkpointing else None)
                history = trainer.fit(train, valid, epochs=2)
            seconds[precision, checkpointing] += [r["seconds"] for r in history]
            if checkpointing:
                # Epoch 2 holds both parts of a stall: its first optimizer.step() waits for
                # the staging of epoch 1's save (overlap mode), and its own save() blocks.
                second = history[1]
                stalls[precision].append((second["checkpoint_stall_pct"], second["checkpoint_stall_ms"],
                                          second["seconds"]))
    results, best = [], {}
    for precision in precisions:
        with_ckpt, without = min(seconds[precision, True]), min(seconds[precision, False])
        best[precision] = without
        stall_pct, stall_ms, epoch_s = max(stalls[precision])
        shape = f"{device} {precision}, {_describe(config)}, {steps}-step epochs"
        results.append(Result(AREA, f"checkpoint stall per epoch, {shape}", stall_pct, "%", "<= 1%",
                              stall_pct <= 1.0, f"worst of the runs: {stall_ms:.1f} ms of a {epoch_s:.2f} s epoch"))
        results.append(Result(AREA, f"epoch time with / without checkpoints, {shape}",
                              with_ckpt / without, "x", None, None,
                              f"best epochs {with_ckpt:.2f} s vs {without:.2f} s"))
    return results, best


def run(quick: bool = False) -> list:
    results = []
    big = dict(DEFAULT_MODEL, hidden=1024)
    results += step_speed("cpu", "bf16", big, quick, target=True)
    if not quick:
        results += step_speed("cpu", "bf16", DEFAULT_MODEL, quick, target=False)
    results += application_overhead("cpu", "fp32", DEFAULT_MODEL, quick)
    more, cpu = short_runs("cpu", ("fp32", "bf16"), DEFAULT_MODEL, quick)
    results += more
    results.append(Result(AREA, f"bf16 / fp32 epoch time, cpu, {_describe(DEFAULT_MODEL)}", cpu["bf16"] / cpu["fp32"],
                          "x", None, None, f"{cpu['bf16']:.2f} s vs {cpu['fp32']:.2f} s"))
    name = f"fp16 / fp32 epoch time, cuda, {_describe(AWD_QRNN_PTB)}"
    if torch.cuda.is_available():
        more, gpu = short_runs("cuda", ("fp32", "fp16"), AWD_QRNN_PTB, quick)
        results += more
        ratio = gpu["fp16"] / gpu["fp32"]
        results.append(Result(AREA, name, ratio, "x", "<= 0.65x", ratio <= 0.65,
                              f"{gpu['fp16']:.2f} s vs {gpu['fp32']:.2f} s"))
    else:
        results.append(Result(AREA, name, float("nan"), "x", "<= 0.65x", None, "skipped: no CUDA device"))
    return results
