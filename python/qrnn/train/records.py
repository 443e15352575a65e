"""The epoch record: what :class:`qrnn.train.Trainer` appends to its history after each
(possibly partial) epoch, what ``metrics.jsonl`` holds one per line, and its one-line
summary as ``qrnn-train`` prints it. A plain dict (checkpoints and JSON hold it as is),
its keys defined here once."""

from __future__ import annotations

import math
from typing import Optional, TypedDict

__all__ = ["EpochRecord", "format_epoch_record"]


class _Measured(TypedDict):
    epoch: int                    # 1-based
    complete: bool                # False: stopped early (max_steps, time budget, a signal)
    step: int                     # optimizer steps so far
    train_loss: float             # mean over the epoch's batches
    valid_loss: Optional[float]   # None without validation data or after a stop signal
    tokens: int
    tokens_per_s: float
    skipped_steps: int            # fp16 steps the GradScaler skipped, in all
    lr: float
    precision: str


class EpochRecord(_Measured, total=False):
    """One epoch's record (a TypedDict: a plain dict at run time), as :meth:`Trainer.fit`
    returns them in its history and ``metrics.jsonl`` holds them, one per line.

    Keys:
        epoch: the epoch, 1-based.
        complete: False for an epoch stopped early (max_steps, time budget, a signal).
        step: optimizer steps so far.
        train_loss: the mean reported loss over the epoch's batches.
        valid_loss: the mean validation loss per target; None without validation data or
            after a stop signal.
        tokens, tokens_per_s: targets trained on in the epoch (all ranks), and per second.
        skipped_steps: fp16 steps the GradScaler skipped, in all.
        lr: the first parameter group's learning rate at the epoch's end.
        precision: ``"fp32"``, ``"fp16"`` or ``"bf16"``.
        seconds, checkpoint_stall_ms, checkpoint_stall_pct: (optional) the epoch's time and
            how long checkpointing held training, in milliseconds and as a percentage;
            known once the epoch's checkpoint is saved, so absent from the copy inside it.
    """

    # Known once the epoch's checkpoint is saved (absent from the copy inside that checkpoint).
    seconds: float
    checkpoint_stall_ms: float
    checkpoint_stall_pct: float


def plural(count: int, noun: str, nouns: Optional[str] = None) -> str:
    """``"1 epoch"``, ``"4 epochs"``: a count and its noun (`nouns`: the plural, when it is
    not the noun and an s)."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def format_epoch_record(record: EpochRecord, level: str) -> str:
    """``epoch   3 | train loss ... | valid bpc (char level) or ppl (word level) | ...``."""
    loss = record["valid_loss"]
    if loss is None:
        quality = ""
    elif level == "char":
        quality = f" | valid loss {loss:.3f} | valid bpc {loss / math.log(2):.3f}"
    else:
        quality = f" | valid loss {loss:.3f} | valid ppl {math.exp(min(loss, 50)):.1f}"
    line = (f"epoch {record['epoch']:3d}{'' if record['complete'] else ' (partial)'} | "
            f"train loss {record['train_loss']:.3f}{quality} | "
            f"{record['tokens_per_s']:,.0f} tok/s | {record.get('seconds', 0.0):.1f} s | "
            f"ckpt stall {record.get('checkpoint_stall_ms', 0.0):.1f} ms "
            f"({record.get('checkpoint_stall_pct', 0.0):.2f}%)")
    if record["precision"] == "fp16":
        line += f" | skipped steps {record['skipped_steps']}"
    return line
