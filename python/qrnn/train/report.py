"""What ``qrnn-train`` and ``qrnn-generate`` report: each epoch's line, metrics.jsonl and
loss.png in the run folder, the recipe and test lines, the one line a stop by a signal
leaves, and the one way both commands fail (:func:`report_error`)."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import sys
from typing import Callable

from ..checkpoint import CheckpointError
from .data import DataError
from .distributed import Distributed
from .errors import TrainError, TrainingStopped
from .optim import NTASGD
from .records import format_epoch_record, plural
from .runs import latest_checkpoint
from .settings import Settings, lr_note

__all__ = ["write_metrics", "plot_losses", "epoch_reporter", "recipe_line", "final_loss_line", "stop_line",
           "USER_ERRORS", "report_error"]

# What both commands report as one line and exit status 2: usage, data and checkpoint
# errors, I/O errors (an unreadable file, a full disk), running out of memory.
USER_ERRORS = (TrainError, DataError, CheckpointError, OSError, MemoryError)


def report_error(prog: str, error) -> int:
    """The one way both commands fail: ``<prog>: error: <one line>`` on stderr, exit status 2."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2


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


def epoch_reporter(trainer, level: str, say: Callable) -> Callable:
    """The ``on_epoch_end`` of qrnn-train's :meth:`Trainer.fit` (rank 0 only): the epoch's
    line through `say`, then metrics.jsonl and loss.png through the run folder's one writer."""
    def on_epoch_end(record) -> None:
        say(format_epoch_record(record, level), flush=True)
        meter = trainer.checkpoints
        assert meter is not None  # the epoch's checkpoint was just saved through it
        files = meter.checkpointer  # the run folder's one writer
        write_metrics(files, trainer.history)
        plot_losses(files, trainer.history, trainer.loss_trace, level)
    return on_epoch_end


def recipe_line(settings: Settings, nt_asgd: NTASGD) -> str:
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


def final_loss_line(test_loss: float, level: str) -> str:
    """``test loss ... | test bpc ...`` (char level) or ``| test ppl ...`` (word level)."""
    unit = (f"test bpc {test_loss / math.log(2):.3f}" if level == "char"
            else f"test ppl {math.exp(min(test_loss, 50)):.1f}")
    return f"test loss {test_loss:.3f} | {unit}"


def stop_line(stop: TrainingStopped, trainer, epoch_batches: int, dist: Distributed) -> str:
    """What a stop by a signal saved, and how to continue: one line."""
    name, run_dir = signal.Signals(stop.signum).name, trainer.checkpointing.directory
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
