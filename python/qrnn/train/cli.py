"""The ``qrnn-train`` and ``qrnn-generate`` commands: a QRNN language model trained with
:class:`qrnn.train.Trainer`, its run folder (checkpoints, best.pt, metrics.jsonl, loss.png),
and sampling from a saved model. ``torchrun --nproc_per_node=N -m qrnn.train ...`` trains on
N processes."""

from __future__ import annotations

import argparse
import gc
import io
import json
import math
import os
import signal
import sys
import time
import zlib

import torch
import torch.nn.functional as F

from ..checkpoint import CheckpointError
from .checkpoints import latest_checkpoint, load_checkpoint
from .data import BPTTBatches, DataError, Vocabulary, load_corpus
from .distributed import (
    DEFAULT_DIST_TIMEOUT,
    broadcast_object,
    check_ranks_in_sync,
    collective_failure_message,
    init_distributed,
    is_collective_failure,
)
from .errors import TrainError, TrainingStopped
from .lm import QRNNLanguageModel, generate
from .precision import PRECISIONS
from .state import seed_everything
from .stopping import DEFAULT_STOP_GRACE, STOP_SIGNALS, catch_stop_signals
from .trainer import Trainer, make_optimizer

__all__ = ["main", "generate_main", "build_parser"]

CHECKPOINT_FORMAT = "qrnn-lm/1"

# Defaults: on a 2-core CPU the default run takes about two minutes.
DEFAULTS = dict(data=None, level="char", epochs=4, batch_size=16, bptt=64, layers=3, hidden=256,
                emsize=128, dropout=0.1, lr=5e-3, optimizer="adam", warmup=100, clip=0.25, seed=1234,
                precision="auto")
# Settings a checkpoint fixes: resuming with a different explicit value is an error.
FIXED_ON_RESUME = ("level", "batch_size", "bptt", "layers", "hidden", "emsize", "dropout", "lr",
                   "optimizer", "warmup", "clip", "seed")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def _checked(kind, accepts, expected: str):
    """An argparse type: `kind(text)` when `accepts` it, else "expected <expected>, got <text>"."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not accepts(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


_pos_int = _checked(int, lambda value: value > 0, "a positive int")
_pos_float = _checked(float, lambda value: value > 0 and math.isfinite(value), "a positive float")
_non_negative_int = _checked(int, lambda value: value >= 0, "an int >= 0")
_fraction = _checked(float, lambda value: 0.0 <= value < 1.0, "a number in [0, 1)")
_auto = _checked(str, lambda value: value == "auto", "auto (or no value)")
# torch.manual_seed takes a 64-bit seed, and each rank adds its rank to it.
_seed = _checked(int, lambda value: -2**63 <= value < 2**63 - 2**16, "an int in [-2**63, 2**63 - 2**16)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="qrnn-train", description="Train a QRNN language model (mixed precision, "
                "non-blocking checkpoints, resumable, one or many processes via torchrun).")
    d = DEFAULTS
    data = p.add_argument_group("data")
    data.add_argument("--data", metavar="PATH", help="folder with train.txt, valid.txt, test.txt, or one "
                      "text file split 90/5/5 (default: the reference text in Python's pydoc_data)")
    data.add_argument("--level", choices=("char", "word"), help=f"tokens (default: {d['level']})")
    model = p.add_argument_group("model")
    model.add_argument("--layers", type=_pos_int, metavar="N", help=f"QRNN layers (default: {d['layers']})")
    model.add_argument("--hidden", type=_pos_int, metavar="N", help=f"QRNN hidden size (default: {d['hidden']})")
    model.add_argument("--emsize", type=_pos_int, metavar="N", help=f"embedding size (default: {d['emsize']})")
    model.add_argument("--dropout", type=_fraction, metavar="P",
                       help=f"embedding and inter-layer dropout (default: {d['dropout']})")
    train = p.add_argument_group("training")
    train.add_argument("--epochs", type=_pos_int, metavar="N",
                       help=f"total epochs, counting resumed ones (default: {d['epochs']})")
    train.add_argument("--max-steps", type=_pos_int, metavar="N", help="stop after this many optimizer steps in all")
    train.add_argument("--time-budget", type=_pos_float, metavar="SECONDS", help="stop after this many seconds")
    train.add_argument("--batch-size", type=_pos_int, metavar="N",
                       help=f"global batch size (default: {d['batch_size']})")
    train.add_argument("--bptt", type=_pos_int, metavar="N", help=f"truncated-BPTT chunk length (default: {d['bptt']})")
    train.add_argument("--lr", type=_pos_float, metavar="LR", help=f"learning rate (default: {d['lr']})")
    train.add_argument("--optimizer", choices=("adam", "sgd"), help=f"(default: {d['optimizer']})")
    train.add_argument("--warmup", type=_pos_int, metavar="N",
                       help=f"linear warm-up steps (default: {d['warmup']})")
    train.add_argument("--clip", type=_pos_float, metavar="NORM", help=f"gradient-norm clip (default: {d['clip']})")
    train.add_argument("--precision", choices=PRECISIONS,
                       help="autocast precision; auto (default): fp16 on CUDA, bf16 on a CPU with native bf16, "
                            "else fp32")
    train.add_argument("--seed", type=_seed, metavar="N", help=f"random seed (default: {d['seed']})")
    train.add_argument("--device", help="cpu, cuda, cuda:N (default: cuda when available)")
    ckpt = p.add_argument_group("checkpoints and output")
    ckpt.add_argument("--checkpoint-dir", metavar="DIR", help="run folder: checkpoints, best.pt, metrics.jsonl, "
                      "loss.png (default: runs/<date-time>)")
    ckpt.add_argument("--keep-last", type=_pos_int, default=3, metavar="N", help="checkpoints kept (default: 3)")
    ckpt.add_argument("--resume", nargs="?", const=True, type=_auto, metavar="auto",
                      help="continue from the latest checkpoint in --checkpoint-dir (default: the newest run "
                      "under runs/); --resume auto: continue if --checkpoint-dir holds a checkpoint, else "
                      "start there (one command line for first starts, restarts and requeues)")
    ckpt.add_argument("--save-every", type=_pos_int, metavar="STEPS",
                      help="also checkpoint every STEPS optimizer steps, mid-epoch")
    ckpt.add_argument("--save-interval", type=_pos_float, metavar="MINUTES",
                      help="also checkpoint every MINUTES minutes (rank 0's clock), mid-epoch")
    faults = p.add_argument_group("stops and faults")
    faults.add_argument("--stop-grace", type=_pos_float, default=DEFAULT_STOP_GRACE, metavar="SECONDS",
                        help="on SIGTERM or SIGUSR1: stop at the next step, checkpoint it and exit with "
                        "128 + the signal within SECONDS, else exit at once (default: "
                        f"{DEFAULT_STOP_GRACE:g})")
    faults.add_argument("--dist-timeout", type=_pos_float, default=DEFAULT_DIST_TIMEOUT, metavar="SECONDS",
                        help="under torchrun: how long a collective waits for a hung or dead peer before "
                        f"the run fails (default: {DEFAULT_DIST_TIMEOUT:g})")
    ckpt.add_argument("--sample-length", type=_non_negative_int, default=300, metavar="N",
                      help="tokens generated at the end (default: 300; 0: none)")
    ckpt.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _run_dirs(root="runs"):
    if not os.path.isdir(root):
        return []
    dirs = [os.path.join(root, name) for name in os.listdir(root)]
    return sorted((d for d in dirs if os.path.isdir(d)), key=os.path.getmtime)


def _fingerprint(ids: torch.Tensor) -> int:
    return zlib.crc32(ids.numpy().tobytes())


def _locate_run(args, dist) -> tuple:
    """(run folder, checkpoint to resume or None), agreed by all ranks."""
    run_dir, resume_path, error = args.checkpoint_dir, None, None
    if dist.is_main:
        if args.resume == "auto":
            if run_dir is None:
                error = "--resume auto needs --checkpoint-dir: the run folder to continue, or to start in"
            else:
                resume_path = latest_checkpoint(run_dir)
        elif args.resume:
            if run_dir is None:
                candidates = [d for d in reversed(_run_dirs()) if latest_checkpoint(d)]
                run_dir = candidates[0] if candidates else None
            resume_path = latest_checkpoint(run_dir) if run_dir else None
            if resume_path is None:
                error = (f"--resume: no checkpoint in {run_dir}" if run_dir else
                         "--resume: no run with a checkpoint under runs/; pass --checkpoint-dir")
        else:
            if run_dir is None:
                run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
            elif latest_checkpoint(run_dir):
                error = (f"{run_dir} already holds checkpoints: pass --resume to continue from them, "
                         "or choose another --checkpoint-dir")
    run_dir, resume_path, error = broadcast_object((run_dir, resume_path, error), dist)
    if error:
        raise TrainError(error)
    return run_dir, resume_path


def _settings(args, checkpoint) -> dict:
    """Flags given, else the checkpoint's, else the defaults; conflicts with a checkpoint fail."""
    saved = checkpoint["settings"] if checkpoint else {}
    settings = {}
    for key, default in DEFAULTS.items():
        given = getattr(args, key)
        if checkpoint and key in FIXED_ON_RESUME and given is not None and given != saved.get(key):
            flag = "--" + key.replace("_", "-")
            raise TrainError(f"{flag} {given} conflicts with the checkpoint, trained with {flag} {saved.get(key)}")
        settings[key] = given if given is not None else saved.get(key, default)
    if args.data is not None:  # so that --resume finds it from any working folder
        settings["data"] = os.path.abspath(args.data)
    return settings


def _batches(split: str, ids, settings: dict, dist) -> BPTTBatches:
    try:
        return BPTTBatches(ids, settings["batch_size"], settings["bptt"], dist.rank, dist.world)
    except DataError as err:
        raise DataError(f"{split} split: {err}") from None


def _format_record(record: dict, level: str) -> str:
    loss = record["valid_loss"]
    if loss is None:
        quality = ""
    elif level == "char":
        quality = f" | valid loss {loss:.3f} | valid bpc {loss / math.log(2):.3f}"
    else:
        quality = f" | valid loss {loss:.3f} | valid ppl {math.exp(min(loss, 50)):.1f}"
    line = (f"epoch {record['epoch']:3d}{'' if record['complete'] else ' (partial)'} | "
            f"train loss {record['train_loss']:.3f}{quality} | "
            f"{record['tokens_per_s']:,.0f} tok/s | {record['seconds']:.1f} s | "
            f"ckpt stall {record['checkpoint_stall_ms']:.1f} ms ({record['checkpoint_stall_pct']:.2f}%)")
    if record["precision"] == "fp16":
        line += f" | skipped steps {record['skipped_steps']}"
    return line


def write_metrics(files, history: list) -> None:
    """metrics.jsonl through `files` (the run's AsyncCheckpointer: crash-safe, follows no link)."""
    files.write_file("metrics.jsonl", "".join(json.dumps(record) + "\n" for record in history).encode())


def plot_losses(files, history: list, loss_trace: list, level: str) -> None:
    """loss.png: training loss over steps, and train / validation loss at each epoch's end
    (drawn on an Agg canvas: no display needed, no global matplotlib backend change)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if loss_trace:
        ax.plot([p[0] for p in loss_trace], [p[1] for p in loss_trace], color="tab:blue", alpha=0.35,
                linewidth=1, label="train (batches)")
    steps = [r["step"] for r in history]
    ax.plot(steps, [r["train_loss"] for r in history], "o-", color="tab:blue", label="train (epoch mean)")
    if any(r["valid_loss"] is not None for r in history):
        ax.plot(steps, [r["valid_loss"] for r in history], "s-", color="tab:orange", label="validation")
    for r in history:
        ax.annotate(f"epoch {r['epoch']}", (r["step"], r["train_loss"]), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats per " + ("character" if level == "char" else "word") + ")")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png")
    files.write_file("loss.png", image.getvalue())


def main(argv=None) -> int:
    """``qrnn-train``: returns the exit code (0; 1 for I/O errors; 2 for usage errors and failed
    collectives; 128 + the signal after a stop by SIGTERM or SIGUSR1; 130 for Ctrl-C)."""
    args = build_parser().parse_args(argv)
    try:
        # From the start, so that a signal during set-up is a stop request too (and a PID 1
        # of a container reacts to SIGTERM at all).
        with catch_stop_signals(STOP_SIGNALS, args.stop_grace):
            return _train(args)
    finally:
        # DistributedDataParallel sits in reference cycles: collect it (and the process group
        # it holds) now, while Python is whole, not during interpreter shutdown, where
        # torch 2.4's gloo teardown can abort ("terminate called without an active exception").
        gc.collect()


def _train(args) -> int:
    prog = "qrnn-train"
    dist = trainer = None
    try:
        dist = init_distributed(args.device, args.dist_timeout)
        say = print if dist.is_main else (lambda *a, **k: None)
        run_dir, resume_path = _locate_run(args, dist)
        checkpoint = load_checkpoint(resume_path) if resume_path else None
        if checkpoint is not None:
            _check_checkpoint(checkpoint, resume_path, _RESUME_KEYS)
        settings = _settings(args, checkpoint)
        epochs, data_path = settings["epochs"], settings["data"]
        vocab = _vocabulary(checkpoint, resume_path) if checkpoint else None
        corpus = load_corpus(data_path, settings["level"], vocab=vocab)
        fingerprint = _fingerprint(corpus.train)
        if checkpoint and fingerprint != checkpoint["data"]["fingerprint"]:
            raise TrainError(f"the training data differs from the checkpoint's ({checkpoint['data'].get('name')}); "
                             "resume with the --data it was trained on")
        # Token ids live on the training device: a batch is then a slice, not a copy.
        corpus.train, corpus.valid, corpus.test = (ids.to(dist.device) for ids in
                                                   (corpus.train, corpus.valid, corpus.test))
        train_batches, valid_batches, test_batches = (
            _batches(name, ids, settings, dist)
            for name, ids in (("training", corpus.train), ("validation", corpus.valid), ("test", corpus.test)))

        seed_everything(settings["seed"] + dist.rank)  # distinct dropout masks per rank
        model_config = dict(vocab_size=len(corpus.vocab), emsize=settings["emsize"], hidden=settings["hidden"],
                            layers=settings["layers"], dropout=settings["dropout"], dropout_emb=settings["dropout"])
        torch.manual_seed(settings["seed"])  # identical initial weights on every rank
        model = QRNNLanguageModel(**model_config)
        seed_everything(settings["seed"] + dist.rank)
        optimizer = make_optimizer(settings["optimizer"], model.parameters(), settings["lr"], dist.device)
        warmup = settings["warmup"]
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
        vocab_size = len(corpus.vocab)

        def loss_fn(logits, targets):
            return F.cross_entropy(logits.reshape(-1, vocab_size), targets.reshape(-1))

        extra = {"format": CHECKPOINT_FORMAT, "model_config": model_config, "vocab": corpus.vocab.state_dict(),
                 "settings": settings,
                 "data": {"name": corpus.name, "fingerprint": fingerprint}}
        trainer = Trainer(model, optimizer, loss_fn, scheduler=scheduler, precision=settings["precision"], dist=dist,
                          clip_norm=settings["clip"], stateful=True, checkpoint_dir=run_dir,
                          # Every carried tensor is time-major, batch at dim 1 (cell state
                          # (1, batch, hidden), window tail (window - 1, batch, features)).
                          carry_batch_dim=1,
                          keep_last=args.keep_last, checkpoint_extra=extra, progress=not args.no_progress,
                          save_every=args.save_every,
                          save_interval=None if args.save_interval is None else 60 * args.save_interval,
                          stop_grace=args.stop_grace)
        if checkpoint is not None:
            try:
                trainer.load_state_dict(checkpoint)
            except (RuntimeError, KeyError, ValueError) as err:
                raise TrainError(f"checkpoint {resume_path} does not fit this model: "
                                 f"{str(err).strip().splitlines()[0]}") from None
        n_params = sum(p.numel() for p in model.parameters())
        say(f"data: {corpus.name}, {settings['level']} level, vocabulary {len(corpus.vocab):,}, "
            f"tokens train {corpus.train.numel():,} / valid {corpus.valid.numel():,} / test {corpus.test.numel():,}")
        say(f"model: QRNN language model, {settings['layers']} layers, hidden {settings['hidden']}, "
            f"emsize {settings['emsize']}, {'tied' if model.tied else 'untied'} decoder, {n_params:,} parameters")
        say(f"device: {dist.device}{f', {dist.world} processes' if dist.enabled else ''}, "
            f"{torch.get_num_threads()} threads; precision {trainer.precision} ({trainer.precision_reason})")
        say(f"run folder: {run_dir}" + (f" (resuming {os.path.basename(resume_path)}: epoch "
                                        f"{trainer.epoch + 1}, step {trainer.step})" if checkpoint else ""))

        def on_epoch_end(record):
            say(_format_record(record, settings["level"]), flush=True)
            meter = trainer.checkpoints
            assert meter is not None  # the epoch's checkpoint was just saved through it
            files = meter.checkpointer  # the run folder's one writer
            write_metrics(files, trainer.history)
            plot_losses(files, trainer.history, trainer.loss_trace, settings["level"])

        trainer.fit(train_batches, valid_batches, epochs=epochs, max_steps=args.max_steps,
                    time_budget=args.time_budget, on_epoch_end=on_epoch_end)
        test_loss = trainer.evaluate(test_batches)
        unit = (f"test bpc {test_loss / math.log(2):.3f}" if settings["level"] == "char"
                else f"test ppl {math.exp(min(test_loss, 50)):.1f}")
        say(f"test loss {test_loss:.3f} | {unit}")
        if dist.enabled:
            say(check_ranks_in_sync(trainer.module, dist))
        if dist.is_main and args.sample_length > 0:
            say("sample:\n" + _sample(trainer.module, corpus.vocab, "", args.sample_length, 0.8, settings["seed"]))
        say(f"saved in {run_dir}: checkpoints, best.pt, metrics.jsonl, loss.png")
        return 0
    except (TrainError, DataError, CheckpointError, MemoryError) as err:  # CheckpointError: full disk...
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. an unreadable data file
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    except TrainingStopped as stop:
        print(f"{prog}: stopped by {signal.Signals(stop.signum).name} at step {stop.step}, checkpointed in "
              f"{trainer.checkpoint_dir if trainer else '-'}; continue with --resume", file=sys.stderr)
        return 128 + stop.signum
    except RuntimeError as err:
        if dist is None or not is_collective_failure(err, dist):
            raise
        where = f"at step {trainer.step}" if trainer is not None else "during set-up"
        print(f"{prog}: error: {collective_failure_message(err, dist, where)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        if dist is not None and dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


# Top-level entries a qrnn-train checkpoint must have (each a dict), beyond its format.
_RESUME_KEYS = ("settings", "vocab", "data", "model_config")
_GENERATE_KEYS = ("model_config", "model", "vocab")


def _check_checkpoint(state, path: str, keys: tuple) -> None:
    """A qrnn-train checkpoint with `keys`, else one TrainError line (a foreign file)."""
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise TrainError(f"{path} is not a qrnn-train checkpoint")
    missing = [key for key in keys if not isinstance(state.get(key), dict)]
    if "data" in keys and "data" not in missing and not isinstance(state["data"].get("fingerprint"), int):
        missing.append("data.fingerprint")
    if missing:
        raise TrainError(f"{path} is not a complete qrnn-train checkpoint: {', '.join(missing)} missing or damaged")


def _vocabulary(state: dict, path: str) -> Vocabulary:
    try:
        return Vocabulary.from_state_dict(state["vocab"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise TrainError(f"{path}: its vocabulary is damaged ({type(err).__name__}: {err})") from None


def _sample(model, vocab, prompt: str, length: int, temperature: float, seed: int) -> str:
    shown = prompt
    if not prompt:  # start at a line start
        prompt = "\n" if vocab.level == "char" else "<eos>"
    ids = vocab.encode(prompt)
    if ids.numel() == 0:
        raise TrainError("--prompt holds no tokens")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    out = generate(model, ids, length, temperature, generator)
    separator = "" if vocab.level == "char" or not shown else " "
    return shown + separator + vocab.decode(out)


def generate_main(argv=None) -> int:
    p = _Parser(prog="qrnn-generate", description="Sample text from a model saved by qrnn-train.")
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="a checkpoint file, or a run folder (its best.pt, else its latest checkpoint)")
    p.add_argument("--prompt", default="", help="text to continue (default: start of a line)")
    p.add_argument("--length", type=_pos_int, default=300, help="tokens to generate (default: 300)")
    p.add_argument("--temperature", type=_pos_float, default=0.8, help="softmax temperature (default: 0.8)")
    p.add_argument("--seed", type=_seed, metavar="N", default=0, help="sampling seed (default: 0)")
    p.add_argument("--device", default="cpu", help="device (default: cpu)")
    args = p.parse_args(argv)
    try:
        path = args.checkpoint
        if os.path.isdir(path):
            best = os.path.join(path, "best.pt")
            path = best if os.path.exists(best) else latest_checkpoint(path)
            if path is None:
                raise TrainError(f"--checkpoint {args.checkpoint}: folder holds no checkpoint")
        state = load_checkpoint(path)
        _check_checkpoint(state, path, _GENERATE_KEYS)
        try:
            device = torch.device(args.device)
            model = QRNNLanguageModel(**state["model_config"])
            model.load_state_dict(state["model"])
            model.to(device)
        except (RuntimeError, KeyError, ValueError, TypeError) as err:
            raise TrainError(f"cannot rebuild the model from {path}: {str(err).strip().splitlines()[0]}") from None
        vocab = _vocabulary(state, path)
        print(_sample(model, vocab, args.prompt, args.length, args.temperature, args.seed))
        return 0
    except (TrainError, DataError, OSError, MemoryError) as err:  # every failure: one line
        print(f"qrnn-generate: error: {err}", file=sys.stderr)
        return 2
