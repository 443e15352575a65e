"""The training loop: :class:`Trainer` (and :func:`fit`) runs any model over batches with
``torch.autocast``, a ``torch.amp.GradScaler`` for float16, gradient clipping after
unscaling, truncated BPTT with the carried state detached between chunks, checkpoints
through :class:`qrnn.checkpoint.AsyncCheckpointer`, exact resume (model, optimizer, scaler,
scheduler, data position, every RNG state), DistributedDataParallel under torchrun, and
graceful stops: on SIGTERM or SIGUSR1 every rank stops at the same step, checkpoints it and
exits (:class:`TrainingStopped`)."""

from __future__ import annotations

import math
import time
from typing import Callable, Optional, Sequence, Union

import torch
from torch import Tensor, nn

from ..checkpoint import AsyncCheckpointer
from .checkpoints import CheckpointConfig, CheckpointStallMeter, ShardedCheckpoints
from .distributed import Distributed, all_gather_object, all_reduce_max
from .errors import TrainError, TrainingStopped
from .optim import ScheduleConfig, averaged_weights
from .precision import AUTOCAST_DTYPES, PrecisionConfig, choose_precision
from .records import EpochRecord, plural
from .state import BPTTConfig, regroup_carry, rng_state, seed_everything, set_rng_state, tree_map
from .stopping import StopConfig, StopRequest, catch_stop_signals

__all__ = ["Trainer", "fit"]


class Trainer:
    """Trains ``model`` with ``optimizer`` on batches of (inputs, targets): mixed precision,
    gradient clipping, truncated BPTT, non-blocking checkpoints, exact resume, DDP under
    torchrun and graceful stops. :meth:`fit` runs it.

    What it does is set by a few configs, each defined beside the component that uses it
    (None: that config's defaults); the other arguments are the objects it runs with.

    Args:
        model: the ``nn.Module`` to train (moved to ``dist.device``). Called as
            ``model(inputs) -> outputs``, or with ``bptt.stateful`` as ``model(inputs, state)
            -> (outputs, state)``. Under torchrun it is wrapped in DistributedDataParallel.
        optimizer: a ``torch.optim.Optimizer`` over its parameters.
        loss_fn: ``loss_fn(outputs, targets)`` returns the loss, or a pair (objective to
            minimise, loss to report): e.g. a cross-entropy plus regularisation terms,
            reporting the cross-entropy.
        precision: a :class:`PrecisionConfig`: the autocast precision (``"auto"``: see
            :func:`choose_precision`), gradient clipping, the GradScaler.
        checkpointing: a :class:`CheckpointConfig`: the folder (None: no checkpoints), how
            many are kept, mid-epoch saves every N steps or minutes, overlap, format, extra
            entries.
        schedule: a :class:`ScheduleConfig`: an LR scheduler, or ``lr_at``, each step's rate.
        bptt: a :class:`BPTTConfig`: whether the model carries a state from chunk to chunk
            (truncated BPTT) and the batch dimension of that state.
        stopping: a :class:`StopConfig`: the signals caught during :meth:`fit` as a stop
            request and the grace after one.
        dist: this process's :class:`Distributed` (from :func:`init_distributed`); None: a
            single process on the model's device.
        checkpointer: rank 0's open :class:`qrnn.checkpoint.AsyncCheckpointer` of
            ``checkpointing.directory`` (``max_pending=1``) to save through, e.g. one whose
            writer lock was taken at start-up so that a second writer is refused before any
            work; :meth:`close` closes it. None: one opened at the first save.
        on_validation: ``on_validation(valid_loss, complete)``, called after each epoch's
            validation and before its checkpoint (on every rank), e.g. to switch optimizers
            (:meth:`replace_optimizer`).
        progress: show a progress bar (rank 0 only; needs tqdm, the ``train`` extra:
            without it :meth:`fit` raises TrainError unless this is False).
        log: where rank 0's log lines go (default ``print``).

    Raises:
        TypeError: ``model``, ``optimizer``, ``loss_fn`` or a config of the wrong kind.
        ValueError, TrainError: from :func:`choose_precision`.

    Data: any sequence of (inputs, targets) (``len`` and indexing, so a resume can start
    mid-epoch); a ``set_epoch(epoch)`` method, if present, is called at each epoch start.
    Under torchrun each rank must get its own shard of every batch: rank r the r-th
    contiguous slice of the global batch, the same number of rows on every rank (the loss a
    mean over the shard), so that DDP's averaged gradient is the gradient of the global
    batch's mean loss and N processes take the same steps as one process given the whole
    batch. Evaluation runs under ``torch.inference_mode``, with the optimizer's averaged
    weights when it keeps them (``torch.optim.ASGD``). One decision for every rank, made
    before each step (an all-reduce of a few flags under DDP), covers signals,
    ``max_steps`` and the time budget (rank 0's clock) alike.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, *,
                 precision: Optional[PrecisionConfig] = None, checkpointing: Optional[CheckpointConfig] = None,
                 schedule: Optional[ScheduleConfig] = None, bptt: Optional[BPTTConfig] = None,
                 stopping: Optional[StopConfig] = None, dist: Optional[Distributed] = None,
                 checkpointer: Optional[AsyncCheckpointer] = None,
                 on_validation: Optional[Callable[[Optional[float], bool], None]] = None, progress: bool = True,
                 log: Callable[[str], None] = print):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        self.precision_config = _config("precision", precision, PrecisionConfig)
        self.checkpointing = _config("checkpointing", checkpointing, CheckpointConfig)
        self.schedule = _config("schedule", schedule, ScheduleConfig)
        self.bptt = _config("bptt", bptt, BPTTConfig)
        self.stopping = _config("stopping", stopping, StopConfig)
        self.dist = dist or Distributed(device=next(model.parameters()).device)
        self.device = self.dist.device
        self.module = model.to(self.device)
        # What training steps call: DistributedDataParallel(module) under torchrun, else module itself.
        self.ddp_module: nn.Module = self.module
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp_module = DistributedDataParallel(self.module, device_ids=ids)
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.on_validation = on_validation
        self.precision, self.precision_reason = choose_precision(self.precision_config.precision, self.device)
        self.autocast_dtype = AUTOCAST_DTYPES[self.precision]
        grad_scaler = self.precision_config.grad_scaler
        if grad_scaler is None:
            grad_scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        self.scaler = grad_scaler
        self.progress = progress and self.dist.is_main
        self.log = log if self.dist.is_main else (lambda message: None)
        self.stop_signal: Optional[int] = None  # the signal that stopped fit(), agreed by all ranks
        self._stop_request: Optional[StopRequest] = None
        self._saved_step: Optional[int] = None  # step of the last checkpoint (same on every rank)
        self._next_save_time = 0.0
        # Rank 0's, opened by the first save (or on `checkpointer`, here), closed by close().
        self.checkpoints: Optional[Union[CheckpointStallMeter, ShardedCheckpoints]] = None
        config = self.checkpointing
        if config.format == "dcp" and config.directory is not None:  # every rank saves
            self.checkpoints = ShardedCheckpoints(config.directory, config.keep_last, checkpointer)
        elif checkpointer is not None and config.directory is not None and self.dist.is_main:
            self.checkpoints = CheckpointStallMeter(config.directory, config.keep_last,
                                                    optimizer if config.overlap else None, checkpointer)
        # Progress, all saved in checkpoints.
        self.epoch = 0              # epoch in progress (0-based)
        self.position = 0           # next batch index within it
        self.step = 0               # optimizer steps attempted
        self.skipped_steps = 0      # of which skipped by the GradScaler (inf/NaN gradients)
        self.best_valid_loss: Optional[float] = None
        self.best_step: Optional[int] = None  # step of the checkpoint with best_valid_loss
        self.history: list = []     # one record per epoch (the epoch in progress: its latest partial one)
        # The epoch in progress so far, over every stop and restart within it: this rank's
        # loss sum (rank 0 also holds what earlier runs of the epoch summed on every rank),
        # every rank's tokens, rank 0's training seconds.
        self.epoch_loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.epoch_tokens = 0
        self.epoch_seconds = 0.0
        self._segment_start: Optional[float] = None  # when train_epoch's present run began
        self.loss_trace: list = []  # [step, training loss] every `trace_every` steps (this rank's shard)
        self.trace_every = 10
        self.carry = None

    # ---- one step
    def autocast(self):
        """The ``torch.autocast`` context of this run's precision (disabled for fp32)."""
        return torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                              enabled=self.autocast_dtype is not None)

    def _forward(self, model, inputs, state):
        if self.bptt.stateful:
            return model(inputs, state)
        return model(inputs), None

    def train_step(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """One optimizer step; returns the (detached) loss."""
        inputs, targets = inputs.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
        self.optimizer.zero_grad(set_to_none=True)
        lr_at = self.schedule.lr_at
        if lr_at is not None:
            lr = lr_at(self.step - self.skipped_steps, self.epoch, targets.shape[0])
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        with self.autocast():
            outputs, carry = self._forward(self.ddp_module, inputs, self.carry)
            loss, reported = _objective(self.loss_fn(outputs, targets))
        self.scaler.scale(loss).backward()
        clip_norm = self.precision_config.clip_norm
        if clip_norm:
            self.scaler.unscale_(self.optimizer)
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            nn.utils.clip_grad_norm_(params, clip_norm)
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # The scale only shrinks when the step was skipped for inf/NaN gradients.
        if scale_before is not None and self.scaler.get_scale() < scale_before:
            self.skipped_steps += 1
        elif self.schedule.scheduler is not None:
            self.schedule.scheduler.step()
        self.step += 1
        if self.bptt.stateful:
            self.carry = tree_map(Tensor.detach, carry)
        return reported.detach()

    def replace_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Continue with `optimizer` (an averaged-SGD switch): pending checkpoints are committed
        first (a snapshot in flight waits on the old optimizer's next step, which never comes)."""
        if self.checkpoints is not None:
            self.checkpoints.wait()
            if self.checkpoints.overlap_with is not None:
                self.checkpoints.overlap_with = optimizer
        self.optimizer = optimizer

    # ---- epochs
    def _decide(self, max_steps, deadline) -> tuple:
        """(stop, save) before the next step: one decision for every rank. Step counts are
        the same everywhere; clocks are read on rank 0 only; a signal on any rank stops all."""
        signum = self._stop_request.signum if self._stop_request is not None else 0
        stop = max_steps is not None and self.step >= max_steps
        save_every, interval = self.checkpointing.save_every, self.checkpointing.interval_seconds
        save = save_every is not None and self.step % save_every == 0
        if self.dist.is_main:
            now = time.monotonic()
            stop = stop or (deadline is not None and now >= deadline)
            save = save or (interval is not None and now >= self._next_save_time)
        if self.dist.enabled:
            signum, stop, save = all_reduce_max([float(signum), float(stop), float(save)], self.dist)
        if signum:
            self.stop_signal = int(signum)
        return bool(stop or signum), bool(save) and self.step != self._saved_step

    def _progress_bar(self, total: int):
        """tqdm's bar over this epoch's batches, or one that shows nothing without progress
        (tqdm comes with the 'train' extra: the library runs without it)."""
        if not self.progress:
            return _NoProgressBar()
        try:
            from tqdm.auto import tqdm
        except ImportError:
            raise TrainError("the progress bar needs tqdm: pip install 'torch-qrnn[train]', or pass "
                             "progress=False") from None
        return tqdm(total=total, initial=self.position, desc=f"epoch {self.epoch + 1}", unit="batch", leave=False,
                    dynamic_ncols=True)

    def train_epoch(self, data: Sequence, max_steps: Optional[int] = None,
                    deadline: Optional[float] = None) -> dict:
        """Train from the current position to the end of the epoch (or until max_steps /
        the monotonic-clock deadline). Returns the loss and throughput of what ran."""
        if self.position == 0:
            self.carry = None
            self.epoch_loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
            self.epoch_tokens, self.epoch_seconds = 0, 0.0
        if hasattr(data, "set_epoch"):
            data.set_epoch(self.epoch)
        self.module.train()
        bar = self._progress_bar(len(data))
        start = self._segment_start = time.perf_counter()
        tokens_before = self.epoch_tokens
        completed = True
        with bar:
            for index in range(self.position, len(data)):
                stop, save = self._decide(max_steps, deadline)
                if stop:
                    completed = False
                    break
                if save:  # mid-epoch, at the position reached
                    self.save_checkpoint()
                inputs, targets = data[index]
                loss = self.train_step(inputs, targets)
                self.epoch_loss_sum += loss.double() * targets.numel()
                self.epoch_tokens += targets.numel() * self.dist.world  # every rank runs a shard this size
                self.position = index + 1
                bar.update(1)
                if self.step % self.trace_every == 0:  # a host sync, so only now and then
                    value = loss.item()
                    self.loss_trace.append([self.step, value])
                    rate = (self.epoch_tokens - tokens_before) / max(time.perf_counter() - start, 1e-9)
                    bar.set_postfix_str(f"loss {value:.3f}, {rate:,.0f} tok/s", refresh=False)
        self.epoch_seconds += time.perf_counter() - start
        self._segment_start = None
        loss_sum, tokens, seconds = self._epoch_totals(), self.epoch_tokens, self.epoch_seconds
        if completed:
            self.epoch += 1
            self.position = 0
            self.carry = None
        mean_loss = loss_sum / tokens if tokens else float("nan")
        return {"train_loss": mean_loss, "tokens": tokens, "train_seconds": seconds, "completed": completed,
                "ran": tokens > tokens_before}

    def _epoch_totals(self) -> float:
        """The loss summed over the epoch so far on every rank (collective under DDP)."""
        loss_sum = self.epoch_loss_sum.clone()
        if self.dist.enabled:
            torch.distributed.all_reduce(loss_sum)
        return loss_sum.item()

    def evaluate(self, data: Sequence) -> float:
        """Mean (reported) loss per target over `data` (all ranks' shards), in eval mode, under
        inference mode, with the optimizer's averaged weights where it keeps them."""
        self.module.eval()
        with averaged_weights(self.optimizer), torch.inference_mode():
            loss_sum, count = self._evaluate_sums(data)
        if self.dist.enabled:
            both = torch.stack([loss_sum, count])
            torch.distributed.all_reduce(both)
            loss_sum, count = both[0], both[1]
        self.module.train()
        return (loss_sum / count).item() if count.item() else float("nan")

    def _evaluate_sums(self, data: Sequence) -> tuple:
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        count = torch.zeros((), dtype=torch.float64, device=self.device)
        state = None
        for index in range(len(data)):
            inputs, targets = data[index]
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            with self.autocast():
                outputs, state = self._forward(self.module, inputs, state)
                _, loss = _objective(self.loss_fn(outputs, targets))
            loss_sum += loss.double() * targets.numel()
            count += targets.numel()
        return loss_sum, count

    def fit(self, train_data: Sequence, valid_data: Optional[Sequence] = None, epochs: int = 1,
            max_steps: Optional[int] = None, time_budget: Optional[float] = None,
            on_epoch_end: Optional[Callable[[dict], None]] = None) -> list:
        """Train until ``epochs`` epochs are complete (counting those done before a resume),
        or until ``max_steps`` optimizer steps in all, or ``time_budget`` seconds of this call,
        or a stop signal. Validates, checkpoints and calls ``on_epoch_end(record)`` after
        every epoch (and after a partial one when stopped early; no validation after a
        signal), then waits for pending checkpoints.

        Args:
            train_data: the training batches (see the class description).
            valid_data: validation batches, or None for no validation (and no best.pt).
            epochs: the total number of epochs.
            max_steps: stop after this many optimizer steps in all, or None.
            time_budget: stop after this many seconds of this call (rank 0's clock), or None.
            on_epoch_end: called with each epoch's :class:`EpochRecord`, or None.

        Returns:
            The history: one :class:`EpochRecord` per epoch run so far, in epoch order.

        Raises:
            TrainingStopped: after a stop signal, once the position reached is checkpointed
                and every save committed.
            qrnn.checkpoint.CheckpointError: a checkpoint could not be saved.
            TrainError: a problem the user can fix (e.g. ``progress`` without tqdm).
        """
        deadline = None if time_budget is None else time.monotonic() + time_budget
        self._saved_step = self.step  # what was loaded (or nothing yet) needs no save
        self._next_save_time = time.monotonic() + (self.checkpointing.interval_seconds or 0.0)
        with catch_stop_signals(self.stopping.signals, self.stopping.grace) as request:
            self._stop_request = request
            try:
                self._fit_epochs(train_data, valid_data, epochs, max_steps, deadline, on_epoch_end)
            finally:
                self._stop_request = None
                self.close()
        if self.stop_signal is not None:
            raise TrainingStopped(self.stop_signal, self.step)
        return self.history

    def _fit_epochs(self, train_data, valid_data, epochs, max_steps, deadline, on_epoch_end) -> None:
        while self.epoch < epochs:
            epoch_start = time.perf_counter()
            epoch, seconds_before = self.epoch, self.epoch_seconds if self.position else 0.0
            stats = self.train_epoch(train_data, max_steps=max_steps, deadline=deadline)
            if not stats["ran"]:
                break
            segment_seconds = stats["train_seconds"] - seconds_before
            signalled = self.stop_signal is not None  # stop quickly: no validation
            valid_loss = self.evaluate(valid_data) if valid_data is not None and not signalled else None
            if self.on_validation is not None:
                self.on_validation(valid_loss, stats["completed"])
            best = valid_loss is not None and (self.best_valid_loss is None or valid_loss < self.best_valid_loss)
            if best:
                self.best_valid_loss = valid_loss
                if self.checkpointing.directory is not None:
                    self.best_step = self.step
            record = EpochRecord(epoch=epoch + 1, complete=stats["completed"], step=self.step,
                                 train_loss=stats["train_loss"], valid_loss=valid_loss, tokens=stats["tokens"],
                                 tokens_per_s=stats["tokens"] / max(stats["train_seconds"], 1e-9),
                                 skipped_steps=self.skipped_steps, lr=self.optimizer.param_groups[0]["lr"],
                                 precision=self.precision)
            self.history = one_record_per_epoch(self.history + [record])
            self.save_checkpoint(best=best)
            # The epoch's training time over all its runs, plus this run's validation and save.
            seconds = stats["train_seconds"] + time.perf_counter() - epoch_start - segment_seconds
            # This epoch's stall: the wait in its first optimizer.step() for the previous
            # epoch's snapshot, plus the blocking part of its own save().
            stall = self.checkpoints.take_stall_seconds() if self.checkpoints is not None else 0.0
            record["seconds"] = seconds
            record["checkpoint_stall_ms"] = stall * 1e3
            record["checkpoint_stall_pct"] = 100 * stall / seconds
            if on_epoch_end is not None and self.dist.is_main:
                on_epoch_end(record)
            if not stats["completed"]:
                break

    def close(self) -> None:
        """Wait for pending checkpoints to be committed (best.pt included); fit() calls it."""
        if self.checkpoints is not None:
            checkpoints, self.checkpoints = self.checkpoints, None
            checkpoints.close()

    # ---- checkpoints
    def state_dict(self) -> dict:
        """Everything needed to continue bit-identically. Collective under DDP: every rank
        must call it (RNG states and carried states are gathered from all ranks)."""
        carry = None if self.carry is None else tree_map(lambda t: t.detach().cpu(), self.carry)
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "scheduler": self.schedule.scheduler.state_dict() if self.schedule.scheduler is not None else None,
            "progress": {"epoch": self.epoch, "position": self.position, "step": self.step,
                         "skipped_steps": self.skipped_steps, "best_valid_loss": self.best_valid_loss,
                         "best_step": self.best_step,
                         "world": self.dist.world, "precision": self.precision},
            # The epoch in progress so far (at a mid-epoch save): its record survives restarts.
            "epoch_so_far": {"loss_sum": self._epoch_totals(), "tokens": self.epoch_tokens,
                             "seconds": self.epoch_seconds + (0.0 if self._segment_start is None else
                                                              time.perf_counter() - self._segment_start)},
            "rng": all_gather_object(rng_state(self.device), self.dist),
            "carry": all_gather_object(carry, self.dist),
            "history": self.history,
            # A tensor, not a list: its bytes are staged by the writer, not pickled on this thread.
            "loss_trace": torch.tensor(self.loss_trace, dtype=torch.float64).reshape(-1, 2),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` (:meth:`state_dict`'s, e.g. read from a checkpoint). It is
        checked before use (TrainError naming what does not fit): a file is untrusted input.
        Nothing is read or written on disk: after a kill between a checkpoint's commit and
        best.pt's promotion, :func:`qrnn.train.checkpoints.restore_best` re-promotes it
        (``restore_best(directory, trainer.best_step)``; ``qrnn-train --resume`` does)."""
        check_training_state(state, self.module, self.optimizer)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        if self.schedule.scheduler is not None and state.get("scheduler") is not None:
            self.schedule.scheduler.load_state_dict(state["scheduler"])
        progress = state["progress"]
        self.epoch, self.position, self.step = progress["epoch"], progress["position"], progress["step"]
        self.skipped_steps = progress["skipped_steps"]
        self.best_valid_loss = progress["best_valid_loss"]
        self.best_step = progress.get("best_step")  # absent from checkpoints of older versions
        # Rank 0 carries the epoch's loss sum over every rank so far, the others start at zero
        # (the epoch's end sums all ranks). Absent from older checkpoints: the epoch's record
        # then covers the steps after the restart only.
        so_far = state.get("epoch_so_far") or {}
        self.epoch_loss_sum = torch.tensor(float(so_far.get("loss_sum", 0.0)) if self.dist.is_main else 0.0,
                                           dtype=torch.float64, device=self.device)
        self.epoch_tokens = int(so_far.get("tokens", 0))
        self.epoch_seconds = float(so_far.get("seconds", 0.0))
        self.history = one_record_per_epoch(state.get("history") or [])
        trace = state.get("loss_trace")
        self.loss_trace = [] if trace is None else [[int(step), loss] for step, loss in trace.tolist()]
        saved_world = progress.get("world", 1)
        same_world = saved_world == self.dist.world
        carries = state["carry"]
        if not same_world:
            if self.position and self.bptt.stateful:
                if self.bptt.carry_batch_dim is None:
                    processes = plural(saved_world, "process", "processes")
                    raise TrainError(f"the checkpoint was written mid-epoch by {processes}; resume it with {processes}")
                # The global batch is unchanged: re-cut the carried states for this many processes.
                carries = regroup_carry(carries, self.dist.world, self.bptt.carry_batch_dim)
            else:
                carries = [None] * self.dist.world
        carry = carries[self.dist.rank]
        self.carry = None if carry is None else tree_map(lambda t: t.to(self.device), carry)
        if same_world:
            set_rng_state(state["rng"][self.dist.rank], self.device)
        else:  # a new number of processes: fresh per-rank streams, continuing deterministically
            seed_everything(1_000_003 * (self.epoch + 1), rank=self.dist.rank)

    def save_checkpoint(self, best: bool = False):
        """Checkpoint the full training state (plus ``checkpointing.extra``) as step `self.step`;
        with `best`, best.pt becomes this checkpoint once committed. Call on every rank."""
        config = self.checkpointing
        if config.directory is None:
            return None
        start = time.perf_counter()
        state = self.state_dict()  # collective under DDP
        self._saved_step = self.step
        if self.dist.is_main:
            self._next_save_time = time.monotonic() + (config.interval_seconds or 0.0)
        if isinstance(self.checkpoints, ShardedCheckpoints):  # every rank writes its part
            state.update(config.extra)
            return self.checkpoints.save(state, self.step, best=best, prepare_seconds=time.perf_counter() - start)
        if not self.dist.is_main:
            return None
        if self.checkpoints is None:
            self.checkpoints = CheckpointStallMeter(config.directory, config.keep_last,
                                                    self.optimizer if config.overlap else None)
        state.update(config.extra)
        return self.checkpoints.save(state, self.step, best=best, prepare_seconds=time.perf_counter() - start)


def _tensor_shapes(tree) -> dict:
    return {key: tuple(value.shape) for key, value in tree.items() if isinstance(value, Tensor)}


def check_training_state(state, module: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """TrainError unless `state` fits `module` and `optimizer`: the model's tensors of the
    module's shapes, the optimizer's per-parameter tensors of their parameters' shapes (before
    torch would copy them in, or an optimizer step would meet them), progress counters that
    are counts, and a history of epoch records."""
    if not isinstance(state, dict):
        raise TrainError("the training state is not a dict")
    for key in ("model", "optimizer", "progress"):
        if not isinstance(state.get(key), dict):
            raise TrainError(f"the training state's {key!r} is missing or damaged")
    want, have = _tensor_shapes(module.state_dict()), _tensor_shapes(state["model"])
    for name, shape in want.items():
        if have.get(name, shape) != shape:
            raise TrainError(f"the model's {name} is {list(have[name])} in the checkpoint, {list(shape)} here")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved_state = state["optimizer"].get("state", {})
    if not isinstance(saved_state, dict):
        raise TrainError("the optimizer state is damaged")
    for index, per_param in saved_state.items():
        if not isinstance(index, int) or not 0 <= index < len(params) or not isinstance(per_param, dict):
            raise TrainError(f"the optimizer state is damaged (an entry for parameter {index!r:.40})")
        for key, value in per_param.items():
            if isinstance(value, Tensor) and value.dim() > 0 and value.shape != params[index].shape:
                raise TrainError(f"the optimizer's {key} of parameter {index} is {list(value.shape)}, "
                                 f"the parameter {list(params[index].shape)}")
    progress = state["progress"]
    so_far = state.get("epoch_so_far") or {}
    if not isinstance(so_far, dict):
        raise TrainError("the training state's 'epoch_so_far' is damaged")
    numbers = [(key, progress.get(key), True) for key in ("epoch", "position", "step", "skipped_steps")]
    numbers += [("tokens", so_far.get("tokens", 0), True), ("loss_sum", so_far.get("loss_sum", 0.0), False),
                ("seconds", so_far.get("seconds", 0.0), False)]
    for key, value, integral in numbers:
        if not _is_count(value, integral):
            raise TrainError(f"the training progress's {key} is damaged: {value!r:.40}")
    history = state.get("history") or []
    if not isinstance(history, list) or not all(map(_is_epoch_record, history)):
        raise TrainError("the training history is damaged: expected a list of epoch records")
    if any(record["epoch"] > progress["epoch"] + 1 for record in history):
        raise TrainError("the training history holds records of epochs not yet run")


def _is_count(value: object, integral: bool) -> bool:
    """A finite number in [0, 2**62): an int where `integral`; never a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integral and isinstance(value, float)):
        return False
    return math.isfinite(value) and 0 <= value < 2**62


_RECORD_KEYS = EpochRecord.__required_keys__ | EpochRecord.__optional_keys__


def _is_epoch_record(record) -> bool:
    return (isinstance(record, dict) and isinstance(record.get("epoch"), int) and set(record) <= _RECORD_KEYS
            and all(value is None or isinstance(value, (int, float)) or (isinstance(value, str) and len(value) < 64)
                    for value in record.values()))


def one_record_per_epoch(history: list) -> list:
    """`history` with one record per epoch, the last of each (a partial epoch's record is
    replaced by the record of the same epoch once it completes), in epoch order."""
    latest: dict = {}
    for record in history:
        latest[record["epoch"]] = record
    return [latest[epoch] for epoch in sorted(latest)]


class _NoProgressBar:
    """The part of tqdm's bar train_epoch uses, showing nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        return None

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        pass


def fit(model: nn.Module, train_data: Sequence, optimizer: torch.optim.Optimizer, loss_fn: Callable, *,
        valid_data: Optional[Sequence] = None, epochs: int = 1, **trainer_args) -> list:
    """One-call form of :class:`Trainer` and :meth:`Trainer.fit`: ``fit(model, batches,
    optimizer, loss_fn, valid_data=..., epochs=..., checkpointing=CheckpointConfig(...))``.

    Args:
        model: as for :class:`Trainer`.
        train_data: as for :meth:`Trainer.fit`.
        optimizer: as for :class:`Trainer`.
        loss_fn: as for :class:`Trainer`.
        valid_data: as for :meth:`Trainer.fit`.
        epochs: as for :meth:`Trainer.fit`.
        **trainer_args (Any): ``max_steps``, ``time_budget`` and ``on_epoch_end`` go to
            :meth:`Trainer.fit`; every other keyword to :class:`Trainer`.

    Returns:
        The history, a list of :class:`EpochRecord` (see :meth:`Trainer.fit`).

    Raises:
        As :class:`Trainer` and :meth:`Trainer.fit`.
    """
    fit_args = {k: trainer_args.pop(k) for k in ("max_steps", "time_budget", "on_epoch_end") if k in trainer_args}
    trainer = Trainer(model, optimizer, loss_fn, **trainer_args)
    return trainer.fit(train_data, valid_data, epochs=epochs, **fit_args)


def _config(name: str, value, kind: type):
    """`value`, a `kind` (None: the defaults of `kind`); TypeError for anything else, such as
    the single values a config groups (``precision="fp32"`` for ``PrecisionConfig("fp32")``)."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a qrnn.train.{kind.__name__} (or None), got {type(value).__name__}"
                        + (f": pass {kind.__name__}({value!r})" if isinstance(value, (str, bool)) else ""))
    return value


def _objective(loss) -> tuple:
    """(objective, reported) from a loss function's result: a loss, or such a pair."""
    if isinstance(loss, (tuple, list)):
        objective, reported = loss
        return objective, reported
    return loss, loss
