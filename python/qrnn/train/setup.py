"""Building a ``qrnn-train`` run (:func:`build_training`): the corpus and its batches, the
language model, optimizer, learning rates and loss, and the :class:`Trainer` over them, each
from its component's config (:class:`Settings` composes them), resumed from a checkpoint once
what the file holds has been checked (a checkpoint is untrusted input)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..checkpoint import AsyncCheckpointer
from .cache import cached_corpus, check_data_identity, data_identity, ids_fingerprint
from .checkpoints import restore_best
from .data import BPTTBatches, Corpus, DataConfig, DataError, Vocabulary, load_corpus
from .distributed import Distributed, all_gather_object
from .errors import TrainError
from .lm import QRNNLanguageModel, lm_loss, meta_model
from .memory import OutOfMemoryAsError, check_model_fits
from .optim import NTASGD, ScheduleConfig
from .records import plural
from .report import recipe_line
from .settings import Settings, chosen_softmax
from .softmax import check_cutoffs, default_cutoffs
from .state import BPTTConfig, seed_everything
from .trainer import Trainer

__all__ = ["build_training", "TrainingRun", "CHECKPOINT_FORMAT", "check_application_dependencies", "check_checkpoint",
           "check_stored_data", "check_model_shapes", "checkpoint_vocabulary", "RESUME_KEYS", "GENERATE_KEYS"]

CHECKPOINT_FORMAT = "qrnn-lm/1"


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
    `settings` (resuming `checkpoint`, best.pt re-promoted where a kill cut that short), the
    run's header lines said through `say`; `writer`: rank 0's open writer of `run_dir` (its
    lock taken at start-up), which the Trainer saves through (None: it opens one at its first
    save)."""
    dist = dist or Distributed(device=torch.device(settings.device or "cpu"))
    data, model_settings, optim = settings.data_config, settings.model_config, settings.optimizer_config
    if checkpoint is None:  # a resumed model's sizes are first compared with its checkpoint's tensors
        # Sizes that cannot fit even with a one-token vocabulary: refused before the corpus is read.
        _check_model_fits(settings, model_settings.arguments(1, None), dist)
    vocab = checkpoint_vocabulary(checkpoint, resume_path or "the checkpoint") if checkpoint else None
    cache = None
    if data.path is None:  # the small built-in text: tokenized in memory
        corpus = load_corpus(data.path, data.level, vocab=vocab)
    else:  # tokenized once into the corpus cache, then mapped by every rank and restart
        corpus, cache = cached_corpus(data.path, data.level, say=say,
                                      progress=not settings.no_progress and dist.is_main)
    fingerprint = corpus.fingerprint if corpus.fingerprint is not None else ids_fingerprint(corpus.train.numpy())
    if checkpoint and (fingerprint != checkpoint["data"]["fingerprint"] or vocab != corpus.vocab):
        raise TrainError(f"the training data differs from the checkpoint's ({checkpoint['data'].get('name')}); "
                         "resume with the --data it was trained on")
    # Token ids live on the training device: a batch is then a slice, not a copy.
    corpus.train, corpus.valid, corpus.test = (ids.to(dist.device) for ids in
                                               (corpus.train, corpus.valid, corpus.test))
    train_batches, valid_batches, test_batches = (
        _batches(name, ids, data, settings.seed, dist)
        for name, ids in (("training", corpus.train), ("validation", corpus.valid), ("test", corpus.test)))

    cutoffs = _softmax_cutoffs(model_settings, len(corpus.vocab))
    model_config = model_settings.arguments(len(corpus.vocab), cutoffs)
    if checkpoint is not None:
        check_model_shapes(model_config, checkpoint.get("model"), resume_path or "the checkpoint")
    # Absurd sizes are refused before a byte is allocated; an allocation that fails anyway
    # (memory taken meanwhile) is the same kind of one line.
    out_of_memory = OutOfMemoryAsError(settings, _check_model_fits(settings, model_config, dist), dist.device)
    seed_everything(settings.seed)  # identical initial weights on every rank
    with out_of_memory:
        model = QRNNLanguageModel(**model_config)
    seed_everything(settings.seed, rank=dist.rank)  # distinct dropout masks per rank
    nt_asgd = NTASGD(optim.nonmono)
    if checkpoint is not None and isinstance(checkpoint.get("nt_asgd"), dict):
        try:
            nt_asgd.load_state_dict(checkpoint["nt_asgd"])
        except (KeyError, TypeError, ValueError) as err:
            raise TrainError(f"{resume_path}: its averaged-SGD state is damaged "
                             f"({type(err).__name__}: {err})") from None
    optimizer: torch.optim.Optimizer
    if nt_asgd.switched_at is not None:
        optimizer = optim.averaged(model.parameters())
    else:
        optimizer = optim.build(model.parameters(), dist.device)
    learning_rate = optim.learning_rate(data.bptt, scale_by_length=data.bptt_lengths == "random")

    def lr_at(applied_steps: int, epoch: int, length: int) -> float:
        return learning_rate(applied_steps, epoch, length, nt_asgd.switched_at)

    def loss_fn(features, targets):
        return lm_loss(model, features, targets, model_settings.alpha, model_settings.beta)

    extra = {"format": CHECKPOINT_FORMAT, "model_config": model_config, "vocab": corpus.vocab.state_dict(),
             "settings": settings.saved(), "nt_asgd": nt_asgd.state_dict(),
             "data": {"name": corpus.name, "fingerprint": fingerprint,
                      "files": None if data.path is None else data_identity(data.path)}}

    def on_validation(valid_loss, complete: bool) -> None:
        """NT-ASGD's trigger, on complete epochs' validation (the same on every rank)."""
        if optim.name != "asgd" or valid_loss is None or not complete:
            return
        if nt_asgd.should_switch(valid_loss):
            nt_asgd.switched_at = trainer.epoch  # the epoch just completed (1-based)
            say(f"epoch {trainer.epoch}: validation stopped improving (--nonmono {optim.nonmono}): "
                "switching to averaged SGD", flush=True)
            trainer.replace_optimizer(optim.averaged(model.parameters()))
        extra["nt_asgd"] = nt_asgd.state_dict()

    with out_of_memory:  # the model moved to its device
        trainer = Trainer(model, optimizer, loss_fn, precision=settings.precision_config,
                          checkpointing=dataclasses.replace(settings.checkpoint_config, directory=run_dir,
                                                            extra=extra),
                          schedule=ScheduleConfig(lr_at=lr_at),
                          # Every carried tensor is time-major, batch at dim 1 (cell state
                          # (1, batch, hidden), window tail (window - 1, batch, features)).
                          bptt=BPTTConfig(stateful=True, carry_batch_dim=1),
                          stopping=settings.stop_config, dist=dist, checkpointer=writer,
                          on_validation=on_validation, progress=not settings.no_progress)
    if checkpoint is not None:
        try:
            trainer.load_state_dict(checkpoint)
            if run_dir is not None and dist.is_main:  # a kill may have cut its promotion short
                restore_best(run_dir, trainer.best_step, writer)
        except (RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError) as err:
            raise TrainError(f"checkpoint {resume_path} does not fit this model: "
                             f"{str(err).strip().splitlines()[0]}") from None
    n_params = sum(p.numel() for p in model.parameters())
    say(f"data: {corpus.name}, {data.level} level, vocabulary {len(corpus.vocab):,}, "
        f"tokens train {corpus.train.numel():,} / valid {corpus.valid.numel():,} / test {corpus.test.numel():,}")
    say(f"model: QRNN language model, {plural(model_settings.layers, 'layer')}, hidden {model_settings.hidden}, "
        f"emsize {model_settings.emsize}, window {model_settings.first_window}, "
        f"{'tied' if model.tied else 'untied'} decoder, {n_params:,} parameters; softmax "
        + (f"adaptive, cutoffs {' '.join(map(str, cutoffs))}" if cutoffs else "full"))
    say(recipe_line(settings, nt_asgd))
    if cache is not None:
        say(f"corpus cache: {cache.describe()}")
    say(f"device: {dist.device}{f', {dist.world} processes' if dist.enabled else ''}, "
        f"{plural(torch.get_num_threads(), 'thread')}; precision {trainer.precision} ({trainer.precision_reason})")
    say(f"run folder: {run_dir}" + (f" (resuming {os.path.basename(resume_path)}: epoch "
                                    f"{trainer.epoch + 1}, step {trainer.step})" if checkpoint and resume_path else ""))
    return TrainingRun(settings, corpus, model, trainer, train_batches, valid_batches, test_batches)


def check_application_dependencies(settings: Settings) -> None:
    """The loss plot needs matplotlib, the progress bar tqdm: the 'train' extra installs both."""
    missing = [name for name in ("matplotlib",) + (() if settings.no_progress else ("tqdm",))
               if importlib.util.find_spec(name) is None]
    if missing:
        raise TrainError(f"qrnn-train needs {' and '.join(missing)}: pip install 'torch-qrnn[train]' "
                         "(from a source checkout: pip install '.[train]')")


def _batches(split: str, ids, data: DataConfig, seed: int, dist) -> BPTTBatches:
    try:
        if split == "training":
            random_lengths = seed if data.bptt_lengths == "random" else None
            return BPTTBatches(ids, data.batch_size, data.bptt, dist.rank, dist.world, random_lengths)
        return BPTTBatches(ids, data.eval_batch_size or data.batch_size, data.bptt, dist.rank, dist.world)
    except DataError as err:
        raise DataError(f"{split} split: {err}") from None


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


def _softmax_cutoffs(model, vocab_size: int) -> Optional[tuple]:
    """The split softmax's cutoffs for `model`'s softmax and cutoffs (a :class:`ModelConfig`:
    --softmax and --cutoffs), or None for the full softmax."""
    softmax = chosen_softmax(model.softmax, vocab_size)
    if softmax == "full":
        if model.cutoffs:
            raise TrainError("--cutoffs needs --softmax adaptive (or auto with a vocabulary over 75,000 words)")
        return None
    try:
        return check_cutoffs(model.cutoffs or default_cutoffs(vocab_size), vocab_size)
    except ValueError as err:
        raise TrainError(f"--cutoffs: {err}") from None


# ---- what a checkpoint must hold (untrusted input): for a resume and for qrnn-generate

# Top-level entries a qrnn-train checkpoint must have (each a dict), beyond its format.
RESUME_KEYS = ("settings", "vocab", "data", "model_config")
GENERATE_KEYS = ("model_config", "model", "vocab")


def check_checkpoint(state, path: str, keys: tuple) -> None:
    """A qrnn-train checkpoint with `keys`, else one TrainError line (a foreign file)."""
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise TrainError(f"{path} is not a qrnn-train checkpoint")
    missing = [key for key in keys if not isinstance(state.get(key), dict)]
    if "data" in keys and "data" not in missing and not isinstance(state["data"].get("fingerprint"), int):
        missing.append("data.fingerprint")
    if missing:
        raise TrainError(f"{path} is not a complete qrnn-train checkpoint: {', '.join(missing)} missing or damaged")


def check_stored_data(data: str, checkpoint: dict, path: str) -> None:
    """A resume without --data reads the data path the checkpoint names only when it still
    holds the files the checkpoint recorded (regular files, sizes, sampled contents): a
    checkpoint is untrusted input, and must not choose what the process reads."""
    try:
        check_data_identity(data, checkpoint["data"].get("files"))
    except (DataError, OSError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        reason = reason.removeprefix(f"--data {data}: ")
        raise TrainError(f"{path} was trained on --data {data}, not used: {reason}; pass --data PATH") from None


def check_model_shapes(model_config: dict, weights, path: str) -> None:
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


def checkpoint_vocabulary(state: dict, path: str) -> Vocabulary:
    """The checkpoint `state`'s vocabulary, or one TrainError line saying it is damaged."""
    try:
        return Vocabulary.from_state_dict(state["vocab"])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise TrainError(f"{path}: its vocabulary is damaged ({type(err).__name__}: {err})") from None
