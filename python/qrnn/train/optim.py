"""Optimizers and learning rates for ``qrnn-train``: the optimizer by name (fused where torch
has a fused kernel), awd-lstm-lm's non-monotonically triggered averaged SGD (NT-ASGD) on
torch's own ``ASGD``, and the learning rate of each step (warm-up, ``--when`` drops, scaling
by the BPTT chunk's length), a pure function of the run's progress so that resuming needs
no scheduler state. :class:`OptimizerConfig` is ``qrnn-train``'s optimizer and learning
rates, :class:`ScheduleConfig` how :class:`qrnn.train.Trainer` sets each step's rate."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

__all__ = ["OptimizerConfig", "ScheduleConfig", "OPTIMIZERS", "make_optimizer", "make_asgd", "averaged_weights",
           "averaged_state_dict", "NTASGD", "LearningRate"]

# "asgd": SGD until validation stops improving, then averaged SGD (awd-lstm-lm's "sgd").
OPTIMIZERS = ("adam", "sgd", "asgd")


def make_optimizer(name: str, params, lr: float, device: torch.device, weight_decay: float = 0.0
                   ) -> torch.optim.Optimizer:
    """Adam or SGD ("asgd" starts as SGD), fused (one kernel for all parameters: several times
    faster than the per-parameter loop on a CPU) where this torch and device support it."""
    cls = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD, "asgd": torch.optim.SGD}[name]
    params = list(params)
    if device.type in ("cpu", "cuda"):
        try:
            return cls(params, lr=lr, weight_decay=weight_decay, fused=True)
        except (RuntimeError, TypeError, ValueError):  # an older torch without this fused kernel
            pass
    return cls(params, lr=lr, weight_decay=weight_decay)


def make_asgd(params, lr: float, weight_decay: float) -> torch.optim.ASGD:
    """awd-lstm-lm's switch target, ``ASGD(t0=0, lambd=0)``: plain SGD steps plus the running
    mean of the weights (``state[p]["ax"]``); torch's multi-tensor implementation (no Python
    loop over parameters)."""
    return torch.optim.ASGD(params, lr=lr, t0=0, lambd=0.0, weight_decay=weight_decay, foreach=True)


def _averages(optimizer: torch.optim.Optimizer) -> list:
    """(parameter, its running mean) for every parameter an averaging optimizer has stepped."""
    return [(p, optimizer.state[p]["ax"]) for group in optimizer.param_groups for p in group["params"]
            if "ax" in optimizer.state.get(p, {})]


@contextlib.contextmanager
def averaged_weights(optimizer: torch.optim.Optimizer) -> Iterator[bool]:
    """Within the block the parameters hold the optimizer's averaged weights (ASGD's ``ax``),
    restored after it; yields whether there were any (other optimizers: nothing changes)."""
    pairs = _averages(optimizer)
    saved = [p.detach().clone() for p, _ in pairs]
    with torch.no_grad():
        for p, average in pairs:
            p.copy_(average)
    try:
        yield bool(pairs)
    finally:
        with torch.no_grad():
            for (p, _), value in zip(pairs, saved):
                p.copy_(value)


def averaged_state_dict(model: torch.nn.Module, optimizer_state: dict) -> Optional[dict]:
    """`model`'s state dict with the averaged weights of a saved ASGD state (the optimizer was
    built on ``model.parameters()``, so its i-th state is the i-th parameter's), or None when
    the state has no averages."""
    states = optimizer_state.get("state", {})
    names = [name for name, _ in model.named_parameters()]
    averages = {names[i]: s["ax"] for i, s in states.items() if isinstance(s, dict) and "ax" in s and i < len(names)}
    if not averages:
        return None
    result = model.state_dict()
    for name, value in averages.items():
        result[name] = value
    return result


@dataclass
class NTASGD:
    """awd-lstm-lm's non-monotone trigger: after an epoch's validation, switch from SGD to
    averaged SGD when more than `nonmono` validation losses came before and this one is worse
    than the best of all but the last `nonmono` of them. Only complete epochs' validations
    count. ``switched_at``: the 1-based epoch after which the switch happened."""

    nonmono: int
    losses: list = field(default_factory=list)
    switched_at: Optional[int] = None

    def should_switch(self, valid_loss: float) -> bool:
        """Record an epoch's validation loss; True once, at the epoch that triggers the switch."""
        if self.switched_at is not None:
            return False
        trigger = len(self.losses) > self.nonmono and valid_loss > min(self.losses[:-self.nonmono])
        self.losses.append(valid_loss)
        return trigger

    def state_dict(self) -> dict:
        return {"nonmono": self.nonmono, "losses": list(self.losses), "switched_at": self.switched_at}

    def load_state_dict(self, state: dict) -> None:
        """A saved state, checked: a list of floats (one per epoch) and an epoch or None."""
        losses, switched_at = state["losses"], state["switched_at"]
        if not isinstance(losses, list) or not all(isinstance(v, float) for v in losses):
            raise TypeError("losses must be a list of floats")
        if switched_at is not None and (not isinstance(switched_at, int) or switched_at < 1):
            raise ValueError(f"switched_at must be an epoch >= 1 or None, got {switched_at!r}")
        self.losses, self.switched_at = list(losses), switched_at


@dataclass(frozen=True)
class LearningRate:
    """The learning rate of one optimizer step, from the run's progress alone:
    ``lr * min(1, (applied + 1) / warmup) * 0.1 ** drops * length / bptt``.

    ``drops``: the ``when`` epochs (1-based) completed before the current one; after an
    averaged-SGD switch at epoch s, awd-lstm-lm restarts from the initial lr and applies only a
    drop at s itself. ``length / bptt``: the chunk's length over the nominal one when
    `scale_by_length` (awd-lstm-lm's rule for random BPTT lengths)."""

    lr: float
    warmup: int = 0
    when: Sequence[int] = ()
    bptt: int = 1
    scale_by_length: bool = False

    def __call__(self, applied_steps: int, epoch: int, length: int, switched_at: Optional[int] = None) -> float:
        rate = self.lr
        if self.warmup > 1:
            rate *= min(1.0, (applied_steps + 1) / self.warmup)
        if switched_at is None:
            drops = sum(1 for e in self.when if e <= epoch)
        else:
            drops = sum(1 for e in self.when if e == switched_at and e <= epoch)
        rate *= 0.1 ** drops
        if self.scale_by_length:
            rate *= length / self.bptt
        return rate


@dataclass(frozen=True)
class ScheduleConfig:
    """How :class:`qrnn.train.Trainer` sets the learning rate of each optimizer step.

    Args:
        scheduler (Any): an LR scheduler stepped once per applied optimizer step (steps the
            fp16 GradScaler skips do not advance it), or None.
        lr_at: ``lr_at(applied_steps, epoch, length)``, the learning rate of each step, set
            on every parameter group before it, from the optimizer steps applied so far, the
            epoch (0-based) and the batch's length (the targets' first dimension: the chunk
            length of time-major batches); a pure function of progress, so resuming needs no
            scheduler state. None: the optimizer's own rates.
    """

    scheduler: Any = None
    lr_at: Optional[Callable[[int, int, int], float]] = None


@dataclass(frozen=True)
class OptimizerConfig:
    """``qrnn-train``'s optimizer and learning rates (its ``--optimizer``, ``--lr``,
    ``--wdecay``, ``--warmup``, ``--when`` and ``--nonmono``).

    Args:
        name: one of :data:`OPTIMIZERS`; ``"asgd"`` is SGD until NT-ASGD switches to averaged SGD.
        lr: the learning rate.
        weight_decay: L2 weight decay, in the optimizer.
        warmup: linear warm-up steps (0 or 1: none).
        when: the epochs after each of which the learning rate is divided by 10.
        nonmono: :class:`NTASGD`'s ``nonmono``.
    """

    name: str
    lr: float
    weight_decay: float
    warmup: int
    when: tuple
    nonmono: int

    def build(self, params, device: torch.device) -> torch.optim.Optimizer:
        """The optimizer over `params` (:func:`make_optimizer`)."""
        return make_optimizer(self.name, params, self.lr, device, self.weight_decay)

    def averaged(self, params) -> torch.optim.ASGD:
        """Averaged SGD over `params`, what NT-ASGD switches to (:func:`make_asgd`)."""
        return make_asgd(params, self.lr, self.weight_decay)

    def learning_rate(self, bptt: int, scale_by_length: bool) -> LearningRate:
        """Each step's learning rate, for chunks of nominal length `bptt` (:class:`LearningRate`)."""
        return LearningRate(self.lr, self.warmup, self.when, bptt, scale_by_length=scale_by_length)
