"""The ``qrnn-train`` and ``qrnn-generate`` commands: a QRNN language model trained with
:class:`qrnn.train.Trainer`, its run folder (checkpoints, best.pt, metrics.jsonl, loss.png),
and sampling from a saved model. ``torchrun --nproc_per_node=N -m qrnn.train ...`` trains on
N processes."""

from __future__ import annotations

import errno
import gc
import importlib.util
import io
import json
import math
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..checkpoint import AsyncCheckpointer, CheckpointError
from .cache import cached_corpus, check_data_identity, data_identity, ids_fingerprint
from .checkpoints import is_sharded_checkpoint, latest_checkpoint, load_checkpoint, restore_best
from .data import BPTTBatches, Corpus, DataError, Vocabulary, load_corpus
from .distributed import (
    Distributed,
    all_gather_object,
    broadcast_object,
    check_device,
    check_ranks_in_sync,
    collective_failure_message,
    init_distributed,
    is_collective_failure,
)
from .errors import TrainError, TrainingStopped
from .lm import QRNNLanguageModel, generate, lm_loss, meta_model
from .memory import OutOfMemoryAsError, check_model_fits
from .optim import NTASGD, LearningRate, averaged_state_dict, averaged_weights, make_asgd, make_optimizer
from .records import format_epoch_record, plural
from .settings import (
    CommandParser,
    Settings,
    build_parser,
    chosen_softmax,
    lr_note,
    positive_float,
    positive_int,
    preset_of,
    resolve,
    seed_int,
)
from .softmax import check_cutoffs, default_cutoffs
from .state import seed_everything
from .stopping import catch_stop_signals, with_ctrl_c
from .trainer import Trainer

__all__ = ["main", "generate_main", "build_parser", "build_training", "TrainingRun"]

CHECKPOINT_FORMAT = "qrnn-lm/1"


def _run_dirs(root="runs") -> list:
    """The folders under `root` that hold a checkpoint, the most recently written first."""
    if not os.path.isdir(root):
        return []
    runs = []
    for name in os.listdir(root):
        run_dir = os.path.join(root, name)
        latest = latest_checkpoint(run_dir) if os.path.isdir(run_dir) else None
        if latest is not None:
            try:
                runs.append((os.path.getmtime(latest), run_dir))
            except OSError:  # removed meanwhile
                pass
    return [run_dir for _, run_dir in sorted(runs, reverse=True)]


def _finished(state, epochs: Optional[int] = None) -> Optional[tuple]:
    """(epochs, step) when the checkpoint `state` completed `epochs` epochs (None: those its
    run was started for), else None (also for a damaged state: resuming it says what is wrong)."""
    progress = state.get("progress") if isinstance(state, dict) else None
    saved = state.get("settings") if isinstance(state, dict) else None
    if epochs is None:
        epochs = saved.get("epochs") if isinstance(saved, dict) else None
    if not isinstance(progress, dict) or not isinstance(epochs, int):
        return None
    epoch, step = progress.get("epoch"), progress.get("step")
    if not isinstance(epoch, int) or not isinstance(step, int) or epoch < epochs:
        return None
    return epochs, step


def _is_finished(run_dir: str) -> bool:
    """Whether `run_dir`'s latest checkpoint completed its run (read with its tensors mapped,
    not loaded); False when it cannot tell."""
    latest = latest_checkpoint(run_dir)
    try:
        return latest is not None and _finished(load_checkpoint(latest, mmap=True)) is not None
    except TrainError:
        return False


def _pick_run(say: Callable) -> str:
    """The run a bare --resume means: the one unfinished run under runs/ (the newest when every
    run is finished, which then says so); several unfinished runs: a TrainError asking which."""
    runs = _run_dirs()
    if not runs:
        raise TrainError("--resume: no run with a checkpoint under runs/; pass --checkpoint-dir")
    if len(runs) == 1:
        say(f"--resume: {runs[0]}, the only run under runs/")
        return runs[0]
    unfinished = [run_dir for run_dir in runs if not _is_finished(run_dir)]
    if len(unfinished) > 1:
        shown = ", ".join(unfinished[:4]) + (", ..." if len(unfinished) > 4 else "")
        raise TrainError(f"--resume: {len(unfinished)} unfinished runs under runs/ ({shown}): "
                         "pass --checkpoint-dir DIR to choose one")
    if unfinished:
        say(f"--resume: {unfinished[0]}, the only unfinished run of {len(runs)} under runs/ "
            "(--checkpoint-dir DIR picks another)")
        return unfinished[0]
    say(f"--resume: {runs[0]}, the newest of {len(runs)} runs under runs/, all finished")
    return runs[0]


def _missing_folders(path: str) -> list:
    """`path` and those of its parents that do not exist yet, deepest first."""
    missing, path = [], os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    return missing


def _remove_if_empty(folders: list) -> None:
    """Remove `folders` (deepest first) while they are empty: a run that saved nothing
    leaves no folder behind."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            return


def _take_run_dir(run_dir: str) -> AsyncCheckpointer:
    """The run folder's writer with its lock taken now: a second qrnn-train on the folder is
    refused at start-up, in one line naming the first, not at its first checkpoint."""
    writer = AsyncCheckpointer(run_dir, keep_last=None, max_pending=1)
    try:
        writer.lock()
    except CheckpointError as err:
        writer.close()
        if err.errno != errno.EBUSY:
            raise
        holder = re.search(r": (pid \d+ on host .*?) holds '", err.strerror or "")
        raise TrainError(f"{run_dir} is in use by {holder.group(1) if holder else 'another process'}: wait for "
                         "that run to end (or stop it), or pass another --checkpoint-dir") from None
    return writer


def _locate_run(args, dist, say: Callable) -> tuple:
    """(run folder, checkpoint to resume or None, folders created for it, rank 0's writer of
    the folder with its lock taken, else None), agreed by all ranks."""
    run_dir, resume_path, error, created, writer = args.checkpoint_dir, None, None, [], None
    if dist.is_main:
        try:
            if args.resume == "auto" and run_dir is None:
                raise TrainError("--resume auto needs --checkpoint-dir: the run folder to continue, or to start in")
            if args.resume is True and run_dir is None:
                run_dir = _pick_run(say)
            elif args.resume is True and latest_checkpoint(run_dir) is None:
                raise TrainError(f"--resume: no checkpoint in {run_dir}")
            elif run_dir is None:
                run_dir = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
            created = _missing_folders(run_dir)
            writer = _take_run_dir(run_dir)
            latest = latest_checkpoint(run_dir)  # now that no one else writes there
            if args.resume:
                resume_path = latest
                if resume_path is None and args.resume is True:
                    raise TrainError(f"--resume: no checkpoint in {run_dir}")
            elif latest:
                raise TrainError(f"{run_dir} already holds checkpoints: pass --resume to continue from them, "
                                 "or choose another --checkpoint-dir")
        except (TrainError, OSError) as err:
            if writer is not None:
                writer.close()
                writer = None
            _remove_if_empty(created)
            error = str(err)
    run_dir, resume_path, error = broadcast_object((run_dir, resume_path, error), dist)
    if error:
        raise TrainError(error)
    return run_dir, resume_path, created, writer


def _check_application_dependencies(settings: Settings) -> None:
    """The loss plot needs matplotlib, the progress bar tqdm: the 'train' extra installs both."""
    missing = [name for name in ("matplotlib",) + (() if settings.no_progress else ("tqdm",))
               if importlib.util.find_spec(name) is None]
    if missing:
        raise TrainError(f"qrnn-train needs {' and '.join(missing)}: pip install 'torch-qrnn[train]' "
                         "(from a source checkout: pip install '.[train]')")


def _batches(split: str, ids, settings: Settings, dist) -> BPTTBatches:
    try:
        if split == "training":
            random_lengths = settings.seed if settings.bptt_lengths == "random" else None
            return BPTTBatches(ids, settings.batch_size, settings.bptt, dist.rank, dist.world, random_lengths)
        return BPTTBatches(ids, settings.eval_batch_size or settings.batch_size, settings.bptt, dist.rank, dist.world)
    except DataError as err:
        raise DataError(f"{split} split: {err}") from None


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
    """The ``qrnn-train`` command (also ``python -m qrnn.train``).

    Args:
        argv (list[str] | None): the command line's arguments (the flags :class:`Settings`
            names); None: ``sys.argv[1:]``.

    Returns:
        The exit code: 0, also when a resumed run has already finished its epochs (one line
        on stderr says so; nothing is trained); 2 for usage, data, checkpoint and I/O errors,
        a run folder another process holds (refused at start-up, naming it), a bare
        ``--resume`` with several unfinished runs under runs/, and failed collectives, each
        one line on stderr; 128 + the signal after a stop by SIGTERM, SIGUSR1 or Ctrl-C (143,
        138, 130), once the position reached is checkpointed (one line on stderr names the
        file and how to continue); 130 too for a second Ctrl-C, which exits at once. A bad
        command line (and ``--help``) ends in argparse's SystemExit instead (status 2 with
        one line; 0 for ``--help``).
    """
    args = build_parser(preset_of(sys.argv[1:] if argv is None else argv)).parse_args(argv)
    try:
        # From the start, so that a signal during set-up is a stop request too (and a PID 1
        # of a container reacts to SIGTERM at all). Ctrl-C too: it saves like SIGTERM.
        with catch_stop_signals(with_ctrl_c(), args.stop_grace):
            return _train(args)
    finally:
        # DistributedDataParallel sits in reference cycles: collect it (and the process group
        # it holds) now, while Python is whole, not during interpreter shutdown, where
        # torch 2.4's gloo teardown can abort ("terminate called without an active exception").
        gc.collect()


def _train(args) -> int:
    prog = "qrnn-train"
    dist = trainer = run = writer = None
    created: list = []
    try:
        dist = init_distributed(args.device, args.dist_timeout)
        say = print if dist.is_main else (lambda *a, **k: None)
        run_dir, resume_path, created, writer = _locate_run(args, dist, say)
        checkpoint = load_checkpoint(resume_path) if resume_path else None
        if checkpoint is not None:
            _check_checkpoint(checkpoint, resume_path, _RESUME_KEYS)
        settings = resolve(args, checkpoint)
        finished = _finished(checkpoint, settings.epochs) if checkpoint is not None else None
        if checkpoint is not None and finished is not None:
            # Exit status 0, not an error: a requeued or restarted job that is done must
            # neither fail nor loop (Kubernetes restarts a container that exits non-zero).
            epochs, step = finished
            if dist.is_main:  # a kill may have cut the last best.pt promotion short
                best_step = checkpoint["progress"].get("best_step")
                restore_best(run_dir, best_step if type(best_step) is int and 0 <= best_step < 2**63 else None,
                             writer)
                print(f"{prog}: {run_dir} has finished its {epochs} epoch{'s' if epochs != 1 else ''} (step "
                      f"{step}): nothing to train; pass --epochs N above {epochs} to train it further",
                      file=sys.stderr)
            return 0
        if checkpoint is not None and args.data is None and settings.data is not None:
            _check_stored_data(settings.data, checkpoint, resume_path)
        _check_application_dependencies(settings)
        run = build_training(settings, dist, run_dir, checkpoint, resume_path, say, writer=writer)
        trainer, corpus = run.trainer, run.corpus

        def on_epoch_end(record):
            say(format_epoch_record(record, settings.level), flush=True)
            meter = trainer.checkpoints
            assert meter is not None  # the epoch's checkpoint was just saved through it
            files = meter.checkpointer  # the run folder's one writer
            write_metrics(files, trainer.history)
            plot_losses(files, trainer.history, trainer.loss_trace, settings.level)

        trainer.fit(run.train_batches, run.valid_batches, epochs=settings.epochs, max_steps=settings.max_steps,
                    time_budget=settings.time_budget, on_epoch_end=on_epoch_end)
        test_loss = trainer.evaluate(run.test_batches)
        unit = (f"test bpc {test_loss / math.log(2):.3f}" if settings.level == "char"
                else f"test ppl {math.exp(min(test_loss, 50)):.1f}")
        say(f"test loss {test_loss:.3f} | {unit}")
        if dist.enabled:
            say(check_ranks_in_sync(trainer.module, dist))
        if dist.is_main and settings.sample_length > 0:
            with averaged_weights(trainer.optimizer):
                sample = _sample(trainer.module, corpus.vocab, "", settings.sample_length, 0.8, settings.seed)
            say("sample:\n" + sample)
        best = ", best.pt" if settings.checkpoint_format == "file" else ""  # a dcp step folder has no second name
        say(f"saved in {run_dir}: checkpoints{best}, metrics.jsonl, loss.png")
        return 0
    except USER_ERRORS as err:
        return report_error(prog, err)
    except TrainingStopped as stop:
        assert trainer is not None and run is not None and dist is not None  # only fit() raises it
        print(f"{prog}: {_stop_report(stop, trainer, len(run.train_batches), dist)}", file=sys.stderr)
        return 128 + stop.signum
    except RuntimeError as err:
        if dist is None or not is_collective_failure(err, dist):
            raise
        where = f"at step {trainer.step}" if trainer is not None else "during set-up"
        return report_error(prog, collective_failure_message(err, dist, where))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    finally:
        if writer is not None:  # closed with the trainer, unless set-up failed first
            writer.close()
        _remove_if_empty(created)
        if dist is not None and dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _stop_report(stop: TrainingStopped, trainer: Trainer, epoch_batches: int, dist: Distributed) -> str:
    """What a stop by a signal saved, and how to continue: one line."""
    name, run_dir = signal.Signals(stop.signum).name, trainer.checkpoint_dir
    if not dist.is_main:  # rank 0 saves and says what
        return f"stopped by {name} at step {stop.step}, checkpointed by rank 0 in {run_dir}"
    latest = latest_checkpoint(run_dir) if run_dir else None
    if run_dir is None or latest is None:
        return f"stopped by {name} before the first step: nothing was saved; start again with the same command line"
    where = (f"epoch {trainer.epoch + 1}, batch {trainer.position} of {epoch_batches}" if trainer.position
             else f"end of epoch {trainer.epoch}")
    saved = os.path.join(run_dir, os.path.basename(latest))
    return (f"stopped by {name} at step {stop.step} ({where}): saved {saved}; "
            f"continue with --resume --checkpoint-dir {run_dir}")



@dataclass
class TrainingRun:
    """What :func:`build_training` sets up: the corpus, its batches, the model and its trainer."""

    settings: Settings
    corpus: Corpus
    model: QRNNLanguageModel
    trainer: Trainer
    train_batches: BPTTBatches
    valid_batches: BPTTBatches
    test_batches: BPTTBatches


def build_training(settings: Settings, dist: Optional[Distributed] = None, run_dir: Optional[str] = None,
                   checkpoint: Optional[dict] = None, resume_path: Optional[str] = None,
                   say: Callable = print, writer: Optional[AsyncCheckpointer] = None) -> TrainingRun:
    """The corpus, model, optimizer, learning rates, loss and Trainer of a qrnn-train run with
    `settings` (resuming `checkpoint`), the run's header lines said through `say`; `writer`:
    rank 0's open writer of `run_dir` (its lock taken at start-up), which the Trainer saves
    through (None: it opens one at its first save)."""
    dist = dist or Distributed(device=torch.device(settings.device or "cpu"))
    if checkpoint is None:  # a resumed model's sizes are first compared with its checkpoint's tensors
        # Sizes that cannot fit even with a one-token vocabulary: refused before the corpus is read.
        _check_model_fits(settings, _model_config(settings, 1, None), dist)
    vocab = _vocabulary(checkpoint, resume_path or "the checkpoint") if checkpoint else None
    cache = None
    if settings.data is None:  # the small built-in text: tokenized in memory
        corpus = load_corpus(settings.data, settings.level, vocab=vocab)
    else:  # tokenized once into the corpus cache, then mapped by every rank and restart
        corpus, cache = cached_corpus(settings.data, settings.level, say=say,
                                      progress=not settings.no_progress and dist.is_main)
    fingerprint = corpus.fingerprint if corpus.fingerprint is not None else ids_fingerprint(corpus.train.numpy())
    if checkpoint and (fingerprint != checkpoint["data"]["fingerprint"] or vocab != corpus.vocab):
        raise TrainError(f"the training data differs from the checkpoint's ({checkpoint['data'].get('name')}); "
                         "resume with the --data it was trained on")
    # Token ids live on the training device: a batch is then a slice, not a copy.
    corpus.train, corpus.valid, corpus.test = (ids.to(dist.device) for ids in
                                               (corpus.train, corpus.valid, corpus.test))
    train_batches, valid_batches, test_batches = (
        _batches(name, ids, settings, dist)
        for name, ids in (("training", corpus.train), ("validation", corpus.valid), ("test", corpus.test)))

    cutoffs = _softmax_cutoffs(settings, len(corpus.vocab))
    model_config = _model_config(settings, len(corpus.vocab), cutoffs)
    if checkpoint is not None:
        _check_model_shapes(model_config, checkpoint.get("model"), resume_path or "the checkpoint")
    # Absurd sizes are refused before a byte is allocated; an allocation that fails anyway
    # (memory taken meanwhile) is the same kind of one line.
    out_of_memory = OutOfMemoryAsError(settings, _check_model_fits(settings, model_config, dist), dist.device)
    seed_everything(settings.seed)  # identical initial weights on every rank
    with out_of_memory:
        model = QRNNLanguageModel(**model_config)
    seed_everything(settings.seed, rank=dist.rank)  # distinct dropout masks per rank
    nt_asgd = NTASGD(settings.nonmono)
    if checkpoint is not None and isinstance(checkpoint.get("nt_asgd"), dict):
        try:
            nt_asgd.load_state_dict(checkpoint["nt_asgd"])
        except (KeyError, TypeError, ValueError) as err:
            raise TrainError(f"{resume_path}: its averaged-SGD state is damaged "
                             f"({type(err).__name__}: {err})") from None
    optimizer: torch.optim.Optimizer
    if nt_asgd.switched_at is not None:
        optimizer = make_asgd(model.parameters(), settings.lr, settings.wdecay)
    else:
        optimizer = make_optimizer(settings.optimizer, model.parameters(), settings.lr, dist.device,
                                   settings.wdecay)
    learning_rate = LearningRate(settings.lr, settings.warmup, settings.when, settings.bptt,
                                 scale_by_length=settings.bptt_lengths == "random")

    def lr_at(applied_steps: int, epoch: int, length: int) -> float:
        return learning_rate(applied_steps, epoch, length, nt_asgd.switched_at)

    def loss_fn(features, targets):
        return lm_loss(model, features, targets, settings.alpha, settings.beta)

    extra = {"format": CHECKPOINT_FORMAT, "model_config": model_config, "vocab": corpus.vocab.state_dict(),
             "settings": settings.saved(), "nt_asgd": nt_asgd.state_dict(),
             "data": {"name": corpus.name, "fingerprint": fingerprint,
                      "files": None if settings.data is None else data_identity(settings.data)}}

    def on_validation(valid_loss, complete: bool) -> None:
        """NT-ASGD's trigger, on complete epochs' validation (the same on every rank)."""
        if settings.optimizer != "asgd" or valid_loss is None or not complete:
            return
        if nt_asgd.should_switch(valid_loss):
            nt_asgd.switched_at = trainer.epoch  # the epoch just completed (1-based)
            say(f"epoch {trainer.epoch}: validation stopped improving (--nonmono {settings.nonmono}): "
                "switching to averaged SGD", flush=True)
            trainer.replace_optimizer(make_asgd(model.parameters(), settings.lr, settings.wdecay))
        extra["nt_asgd"] = nt_asgd.state_dict()

    with out_of_memory:  # the model moved to its device
        trainer = Trainer(model, optimizer, loss_fn, lr_at=lr_at, on_validation=on_validation,
                          precision=settings.precision, dist=dist,
                          clip_norm=settings.clip, stateful=True, checkpoint_dir=run_dir,
                          # Every carried tensor is time-major, batch at dim 1 (cell state
                          # (1, batch, hidden), window tail (window - 1, batch, features)).
                          carry_batch_dim=1,
                          keep_last=settings.keep_last, checkpoint_extra=extra, progress=not settings.no_progress,
                          save_every=settings.save_every,
                          save_interval=None if settings.save_interval is None else 60 * settings.save_interval,
                          stop_grace=settings.stop_grace, checkpointer=writer,
                          checkpoint_format=settings.checkpoint_format)
    if checkpoint is not None:
        try:
            trainer.load_state_dict(checkpoint)
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError) as err:
            raise TrainError(f"checkpoint {resume_path} does not fit this model: "
                             f"{str(err).strip().splitlines()[0]}") from None
    n_params = sum(p.numel() for p in model.parameters())
    say(f"data: {corpus.name}, {settings.level} level, vocabulary {len(corpus.vocab):,}, "
        f"tokens train {corpus.train.numel():,} / valid {corpus.valid.numel():,} / test {corpus.test.numel():,}")
    say(f"model: QRNN language model, {plural(settings.layers, 'layer')}, hidden {settings.hidden}, "
        f"emsize {settings.emsize}, window {settings.window}, {'tied' if model.tied else 'untied'} decoder, "
        f"{n_params:,} parameters; softmax "
        + (f"adaptive, cutoffs {' '.join(map(str, cutoffs))}" if cutoffs else "full"))
    say(_recipe_line(settings, nt_asgd))
    if cache is not None:
        say(f"corpus cache: {cache.describe()}")
    say(f"device: {dist.device}{f', {dist.world} processes' if dist.enabled else ''}, "
        f"{plural(torch.get_num_threads(), 'thread')}; precision {trainer.precision} ({trainer.precision_reason})")
    say(f"run folder: {run_dir}" + (f" (resuming {os.path.basename(resume_path)}: epoch "
                                    f"{trainer.epoch + 1}, step {trainer.step})" if checkpoint and resume_path else ""))
    return TrainingRun(settings, corpus, model, trainer, train_batches, valid_batches, test_batches)


def _check_model_fits(settings: Settings, model_config: dict, dist: Distributed) -> int:
    """check_model_fits on every rank, agreed: a rank without the memory stops them all."""
    params, error = 0, None
    try:
        params = check_model_fits(settings, model_config, dist.device)
    except TrainError as err:
        error = str(err) + (f" (rank {dist.rank})" if dist.enabled else "")
    failed = [e for e in all_gather_object(error, dist) if e]
    if failed:
        raise TrainError(failed[0])
    return params


def _model_config(settings: Settings, vocab_size: int, cutoffs: Optional[tuple]) -> dict:
    """QRNNLanguageModel's arguments for `settings` and a vocabulary of `vocab_size` tokens."""
    return dict(vocab_size=vocab_size, emsize=settings.emsize, hidden=settings.hidden, layers=settings.layers,
                dropout=settings.dropout, dropout_emb=settings.dropouti, first_window=settings.window,
                dropout_hidden=settings.dropouth, dropout_words=settings.dropoute, weight_drop=settings.wdrop,
                cutoffs=cutoffs)


def _softmax_cutoffs(settings: Settings, vocab_size: int) -> Optional[tuple]:
    """The split softmax's cutoffs for --softmax and --cutoffs, or None for the full softmax."""
    softmax = chosen_softmax(settings.softmax, vocab_size)
    if softmax == "full":
        if settings.cutoffs:
            raise TrainError("--cutoffs needs --softmax adaptive (or auto with a vocabulary over 75,000 words)")
        return None
    try:
        return check_cutoffs(settings.cutoffs or default_cutoffs(vocab_size), vocab_size)
    except ValueError as err:
        raise TrainError(f"--cutoffs: {err}") from None


def _recipe_line(settings: Settings, nt_asgd: NTASGD) -> str:
    """The effective training recipe, one line (a preset's values included)."""
    optimizer = settings.optimizer
    if optimizer == "asgd":
        optimizer += (f" (averaging since epoch {nt_asgd.switched_at})" if nt_asgd.switched_at is not None
                      else f" (nonmono {settings.nonmono})")
    when = f", lr / 10 after epochs {' '.join(map(str, settings.when))}" if settings.when else ""
    note = lr_note(settings)
    lr = f"{settings.lr:g}" + (f" ({note})" if note else "")
    return (f"recipe: {settings.preset or 'no preset'}; {optimizer} lr {lr}{when}, warmup "
            f"{settings.warmup}, clip {settings.clip:g}, wdecay {settings.wdecay:g}; batch {settings.batch_size} "
            f"(eval {settings.eval_batch_size or settings.batch_size}), bptt {settings.bptt} {settings.bptt_lengths}; "
            f"dropout {settings.dropout:g} / h {settings.dropouth:g} / i {settings.dropouti:g} / e "
            f"{settings.dropoute:g}, wdrop {settings.wdrop:g}, alpha {settings.alpha:g}, beta {settings.beta:g}; "
            f"{plural(settings.epochs, 'epoch')}, seed {settings.seed}")


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


def _check_stored_data(data: str, checkpoint: dict, path: str) -> None:
    """A resume without --data reads the data path the checkpoint names only when it still
    holds the files the checkpoint recorded (regular files, sizes, sampled contents): a
    checkpoint is untrusted input, and must not choose what the process reads."""
    try:
        check_data_identity(data, checkpoint["data"].get("files"))
    except (DataError, OSError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        reason = reason.removeprefix(f"--data {data}: ")
        raise TrainError(f"{path} was trained on --data {data}, not used: {reason}; pass --data PATH") from None


def _check_model_shapes(model_config: dict, weights, path: str) -> None:
    """TrainError unless the model `model_config` describes has the shapes of `weights` (the
    tensors a checkpoint holds), found on the meta device: the numbers of a file never size
    an allocation before they are compared with the tensors it actually holds."""
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise TrainError(f"{path}: its model weights are damaged")
    try:
        expected = meta_model(model_config).state_dict()
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise TrainError(f"{path}: its model settings are damaged ({type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0] if str(err).strip() else ''})") from None
    for name, tensor in expected.items():
        stored = weights.get(name)
        if stored is None:
            raise TrainError(f"{path}: the model's {name} is missing")
        if stored.shape != tensor.shape:
            raise TrainError(f"{path}: the model's {name} is {list(stored.shape)} in the file, "
                             f"{list(tensor.shape)} by its settings")


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
    """The ``qrnn-generate`` command: sample text from a model ``qrnn-train`` saved.

    Args:
        argv (list[str] | None): the command line's arguments (``--checkpoint PATH`` and the
            sampling flags; see ``qrnn-generate --help``); None: ``sys.argv[1:]``.

    Returns:
        The exit code: 0, or 2 for any failure, reported in one line on stderr (a bad
        command line, and ``--help``, end in argparse's SystemExit instead).
    """
    p = CommandParser(prog="qrnn-generate", description="Sample text from a model saved by qrnn-train.")
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="a checkpoint file, or a run folder (its best.pt, else its latest checkpoint)")
    p.add_argument("--prompt", default="", help="text to continue (default: start of a line)")
    p.add_argument("--length", type=positive_int, default=300, help="tokens to generate (default: 300)")
    p.add_argument("--temperature", type=positive_float, default=0.8,
                   help="softmax temperature; one so small that the logits overflow when divided by it picks the "
                   "most likely token each step (greedy) (default: 0.8)")
    p.add_argument("--seed", type=seed_int, metavar="N", default=0, help="sampling seed (default: 0)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default: cpu)")
    args = p.parse_args(argv)
    try:
        device = check_device(args.device)  # before a checkpoint is read
        path = args.checkpoint
        if os.path.isdir(path) and not is_sharded_checkpoint(path):
            best = os.path.join(path, "best.pt")
            path = best if os.path.exists(best) else latest_checkpoint(path)
            if path is None:
                raise TrainError(f"--checkpoint {args.checkpoint}: folder holds no checkpoint")
        state = load_checkpoint(path)
        _check_checkpoint(state, path, _GENERATE_KEYS)
        vocab = _vocabulary(state, path)
        _check_model_shapes(state["model_config"], state.get("model"), path)
        if state["model_config"].get("vocab_size") != len(vocab):
            raise TrainError(f"{path}: its vocabulary has {plural(len(vocab), 'entry', 'entries')}, its model "
                             f"{state['model_config'].get('vocab_size')!r:.20}")
        try:
            model = QRNNLanguageModel(**state["model_config"])
            model.load_state_dict(state["model"])
            averaged = averaged_state_dict(model, state.get("optimizer") or {})
            if averaged is not None:  # trained with averaged SGD: sample from the average
                model.load_state_dict(averaged)
            model.to(device)
        except (RuntimeError, KeyError, ValueError, TypeError) as err:
            raise TrainError(f"cannot rebuild the model from {path}: {str(err).strip().splitlines()[0]}") from None
        print(_sample(model, vocab, args.prompt, args.length, args.temperature, args.seed))
        return 0
    except USER_ERRORS as err:
        return report_error("qrnn-generate", err)


# What both commands report as one line and exit status 2: usage, data and checkpoint
# errors, I/O errors (an unreadable file, a full disk), running out of memory.
USER_ERRORS = (TrainError, DataError, CheckpointError, OSError, MemoryError)


def report_error(prog: str, error) -> int:
    """The one way both commands fail: ``<prog>: error: <one line>`` on stderr, exit status 2."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2
