"""Per-process state a checkpoint holds besides the model and optimizer: the carried
(truncated-BPTT) state, re-cut when a run resumes on another number of processes, and every
random-number stream a training step may draw from."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from .errors import TrainError
from .records import plural

__all__ = ["BPTTConfig", "tree_map", "regroup_carry", "rng_state", "set_rng_state", "seed_everything"]


@dataclass(frozen=True)
class BPTTConfig:
    """How :class:`qrnn.train.Trainer` calls a model that carries a state (truncated BPTT).

    Args:
        stateful: call the model as ``model(inputs, state) -> (outputs, state)`` and carry
            its state from chunk to chunk within an epoch, detached, reset at each epoch
            start; False: ``model(inputs) -> outputs``.
        carry_batch_dim: the batch dimension of every tensor of the carried state. With it,
            a checkpoint written mid-epoch resumes on a different number of processes (the
            carried states are re-cut, :func:`regroup_carry`); without it, only at an epoch
            boundary.
    """

    stateful: bool = False
    carry_batch_dim: Optional[int] = None


def _rebuilt(like, items: list):
    """A list or tuple of `like`'s type (named tuples included) holding `items`."""
    return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)


def tree_map(fn, tree):
    """`tree` with `fn` applied to every tensor in its lists, tuples and dicts."""
    if isinstance(tree, Tensor):
        return fn(tree)
    if isinstance(tree, (list, tuple)):
        return _rebuilt(tree, [tree_map(fn, t) for t in tree])
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    return tree


def regroup_carry(carries: list, world: int, batch_dim: int) -> list:
    """The carried states of one training step written by ``len(carries)`` processes, one per
    rank (rank r holding the r-th contiguous slice of the global batch), re-cut for `world`
    processes: joined along `batch_dim` in rank order, then split into `world` equal slices.
    Every tensor of a carried state must have the batch at `batch_dim`; None stays None."""
    if all(c is None for c in carries):
        return [None] * world
    if any(c is None for c in carries):
        raise TrainError("the checkpoint's carried states are missing for some processes")

    def join(trees):
        first = trees[0]
        if isinstance(first, Tensor):
            return torch.cat(trees, batch_dim)
        if isinstance(first, (list, tuple)):
            return _rebuilt(first, [join([t[i] for t in trees]) for i in range(len(first))])
        if isinstance(first, dict):
            return {k: join([t[k] for t in trees]) for k in first}
        return first

    def split(tree, rank):
        if isinstance(tree, Tensor):
            size = tree.shape[batch_dim]
            if size % world:
                raise TrainError(f"a carried state of batch {size} does not split over "
                                 f"{plural(world, 'process', 'processes')}")
            return tree.narrow(batch_dim, rank * (size // world), size // world).clone()
        if isinstance(tree, (list, tuple)):
            return _rebuilt(tree, [split(t, rank) for t in tree])
        if isinstance(tree, dict):
            return {k: split(v, rank) for k, v in tree.items()}
        return tree

    whole = join(list(carries))
    return [split(whole, rank) for rank in range(world)]


def rng_state(device: torch.device) -> dict:
    """Every RNG a training step may draw from, as tensors and numbers a checkpoint holds."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, py_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": {"version": version, "state": torch.tensor(py_state, dtype=torch.int64), "gauss": py_gauss},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore the streams :func:`rng_state` saved."""
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss"]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def seed_everything(seed: int, rank: Optional[int] = None) -> None:
    """Seed Python's, NumPy's and torch's (every device's) random streams: with ``seed``, the
    same on every process (e.g. for identical initial weights), or with ``rank`` a stream of
    the process's own (``seed + rank``: distinct dropout masks per rank).

    Args:
        seed: an int; NumPy gets it modulo 2**32.
        rank: None, or this process's rank, added to ``seed``.
    """
    if rank is not None:
        seed += rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
