"""DTensor sharding rules for the qrnn ops (``torch.distributed.tensor``): the machinery every
family's rules (``qrnn.ops.<family>.sharding``) are written with and registered by.

The recurrences are elementwise across batch and hidden units and sequential in time, so
each op runs on the local shards as they are when its sequence tensors are replicated or
sharded on the batch dimension; ForgetMult and linear_scan also when they are sharded on
the hidden dimension (the last). Sharding on the time dimension is refused with a ValueError
saying what to do. The fused gate op is not hidden-sharded: the last dimension of its gates
holds the Z, F, O blocks one after another, so an even split of it is not a split by hidden
unit.

``torch.distributed.tensor`` takes seconds to import, and a program that makes DTensors has
imported it, so nothing here imports it first: the rules are registered when qrnn's ops are
imported after it, or at the first ``qrnn.forget_mult`` / ``qrnn.qrnn_gates`` call given a
tensor subclass after it. :func:`register_sharding_rules` does it at once (for programs
that call ``torch.ops.qrnn.*`` on DTensors directly). Torch without ``register_sharding``
(2.4) keeps DTensor's own "no sharding strategy registered" error.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import warnings
from typing import Optional

import torch

__all__ = ["register_sharding_rules", "register_if_dtensor_loaded", "check_sharded_args", "add_rules",
           "add_scan_rules", "refuse_unsupported", "shardings", "present", "SEQUENCE", "STATE", "LENGTHS", "EMPTY",
           "REPLICATE", "BATCH", "HIDDEN"]

_DTENSOR_MODULE = "torch.distributed.tensor"

# The tensor arguments by role, which fixes where each mode shards them.
SEQUENCE = "sequence"  # (seq_len, batch, features), or (batch, seq_len, features) batch-first
STATE = "state"  # (batch, hidden)
LENGTHS = "lengths"  # (batch,)
EMPTY = "empty"  # the placeholder an op returns for an absent result (every rank: the same 0 elements)

REPLICATE, BATCH, HIDDEN = "replicate", "batch", "hidden"

TIME_SHARDED_MESSAGE = (
    "qrnn.{op}: {name} is a DTensor sharded on its time dimension (dim {time}), which is not supported: the "
    "recurrence runs sequentially over time. Redistribute it first (t.redistribute(mesh, [Replicate()])), or "
    "shard {alternatives} instead")

GATE_BLOCKS_SHARDED_MESSAGE = (
    "qrnn.qrnn_gates: {name} is a DTensor sharded on its last dimension, which is not supported: it holds the "
    "Z, F, O blocks one after another, so its shards are not whole hidden units. Redistribute it first "
    "(t.redistribute(mesh, [Replicate()])), or shard the batch dimension (dim {batch}) instead")

_registered: Optional[bool] = None  # None until registration was tried
_dtensor_type: Optional[type] = None  # DTensor, once its module is loaded
_dtensor_looked_up = False  # whether _dtensor_type was looked up (once the module is loaded)


def _batch_dim(batch_first: bool) -> int:
    return 0 if batch_first else 1


def refuse_unsupported(op: str, name: str, t, batch_first: bool, modes: tuple) -> None:
    """ValueError when ``t`` (a DTensor or DTensorSpec of a sequence tensor) is sharded on a
    dimension ``modes`` does not cover: time always, the last one unless hidden is a mode."""
    if t is None:
        return
    batch = _batch_dim(batch_first)
    for placement in t.placements:
        dim = getattr(placement, "dim", None)  # Shard and its variants; Replicate and Partial have none
        if dim is None:
            continue
        dim %= t.ndim
        if dim == 1 - batch:
            alternatives = f"the batch dimension (dim {batch})"
            if HIDDEN in modes:
                alternatives += " or the hidden one (dim 2)"
            raise ValueError(TIME_SHARDED_MESSAGE.format(op=op, name=name, time=dim, alternatives=alternatives))
        if dim == 2 and HIDDEN not in modes:
            raise ValueError(GATE_BLOCKS_SHARDED_MESSAGE.format(name=name, batch=batch))


def _placement(role: Optional[str], mode: str, batch_first: bool):
    from torch.distributed.tensor import Replicate, Shard

    if role is None:  # a non-tensor argument, or an optional tensor that is absent
        return None
    if mode == REPLICATE or role == EMPTY or (mode == HIDDEN and role == LENGTHS):
        return Replicate()
    if mode == BATCH:
        return Shard(_batch_dim(batch_first) if role == SEQUENCE else 0)
    return Shard(2 if role == SEQUENCE else 1)


def shardings(modes: tuple, batch_first: bool, outputs: list, inputs: list) -> list:
    """register_sharding's answer: per mode, (output placements, input placements)."""
    return [([_placement(r, m, batch_first) for r in outputs], [_placement(r, m, batch_first) for r in inputs])
            for m in modes]


def present(t, role: str) -> Optional[str]:
    return None if t is None else role


# Each family's rules, added by the family when its ops are defined (``qrnn.ops.<family>.sharding``):
# {op name: rule} for register_sharding, and {public op: the sharding modes it supports}.
_RULES: dict = {}
_MODES: dict = {}


def add_rules(op: str, modes: tuple, rules: dict) -> None:
    """A family's sharding rules: ``rules`` maps each of its op names (``"linear_scan"``,
    ``"linear_scan_backward"``) to a ``register_sharding`` rule; ``modes`` are the sharding
    modes of its public function ``op`` (:data:`REPLICATE`, :data:`BATCH`, :data:`HIDDEN`)."""
    _RULES.update(rules)
    _MODES[op] = modes


def _scan_rule(op: str, parameters: tuple, modes: tuple, backward: bool):
    """A scan op's rule, taking ``parameters`` (by position or name): the sequences, then
    ``h0``, then flags, ``batch_first`` among them."""
    signature = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                   for name in parameters])
    state = parameters.index("h0")

    def rule(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        h0, batch_first = bound["h0"], bound["batch_first"]
        for name in parameters[:state]:
            refuse_unsupported(op, name, bound[name], batch_first, modes)
        outputs = [SEQUENCE, SEQUENCE, STATE if h0 is not None else EMPTY] if backward else [SEQUENCE]
        return shardings(modes, batch_first, outputs,
                         [SEQUENCE] * state + [present(h0, STATE)] + [None] * (len(parameters) - state - 1))

    rule.__signature__ = signature  # type: ignore[attr-defined]
    return rule


def add_scan_rules(op: str, forward_parameters: tuple, backward_parameters: tuple) -> None:
    """The rules of a scan family (``h = a h + b`` forms: ForgetMult, linear_scan), whose ops
    run batch-sharded, hidden-sharded or replicated sequences on their local shards: the
    forward ``op`` returns one sequence, ``<op>_backward`` two and the state's gradient.
    ``*_parameters``: the arguments each rule takes, in the op's order: its sequences, ``h0``,
    then flags, ``batch_first`` among them (``("f", "x", "h0", "batch_first")``)."""
    modes = (REPLICATE, BATCH, HIDDEN)
    add_rules(op, modes, {op: _scan_rule(op, forward_parameters, modes, backward=False),
                          f"{op}_backward": _scan_rule(f"{op}_backward", backward_parameters, modes, backward=True)})


def _first_flag_index(op) -> int:
    """The index of the op's first argument that is not an (optional) tensor."""
    for i, argument in enumerate(op._schema.arguments):
        kind = argument.type
        if isinstance(kind, torch.OptionalType):
            kind = kind.getElementType()
        if not isinstance(kind, torch.TensorType):
            return i
    return len(op._schema.arguments)


def register_sharding_rules() -> bool:
    """Register the ops' sharding rules with DTensor (once; loads ``torch.distributed.tensor``).

    Calling it is optional: ``import qrnn`` registers them when DTensor is already loaded,
    and otherwise the first call of a qrnn op given a tensor subclass does. The rules cover
    batch-sharded inputs (every op), hidden-sharded ones (ForgetMult and linear_scan) and
    replicated ones.

    Returns:
        Whether the rules are registered: False on a torch without DTensor's
        ``register_sharding`` (before 2.5), or one whose DTensor keeps no per-op cache keys
        where this module can reach them (a rule reused for a call with another
        ``batch_first`` would be wrong, so none is registered). When registering fails
        part-way, a RuntimeWarning says so, nothing stays half registered, and False is
        returned; it never raises.
    """
    global _registered
    if _registered is not None:
        return _registered
    _registered = False
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError:  # torch < 2.5, or built without torch.distributed
        return False
    propagator = getattr(getattr(DTensor, "_op_dispatcher", None), "sharding_propagator", None)
    schema_infos = getattr(propagator, "op_to_schema_info", None)
    if not isinstance(schema_infos, dict):
        return False
    rules = [(getattr(torch.ops.qrnn, name).default, rule) for name, rule in _RULES.items()]
    try:
        for op, rule in rules:
            register_sharding(op)(rule)
            # register_sharding keys DTensor's sharding cache on the tensors and int arguments only;
            # batch_first, output_gate and reverse change the answer, so every argument from the first
            # non-tensor one is part of the key (without an entry DTensor keys on every argument).
            info = schema_infos.get(op)
            if info is not None:
                schema_infos[op] = dataclasses.replace(info, static_argnum=_first_flag_index(op))
    except Exception as error:  # an experimental API: a change in it must not break `import qrnn`
        for op, _ in rules:  # no rule left half registered (without its cache key)
            getattr(propagator, "op_strategy_funcs", {}).pop(op, None)
            schema_infos.pop(op, None)
        warnings.warn(f"qrnn: DTensor sharding rules for the qrnn ops could not be registered ({error!r}); "
                      "DTensor inputs to them are unsupported in this process", RuntimeWarning, stacklevel=2)
        return False
    _registered = True
    return True


def register_if_dtensor_loaded() -> None:
    """Register the rules now if this process has loaded DTensor (never loads it)."""
    _loaded_dtensor_type()


def _loaded_dtensor_type() -> Optional[type]:
    """DTensor, registering the rules the first time its module is seen loaded; None before
    (and always on torch 2.4, whose torch.distributed.tensor holds no DTensor)."""
    global _dtensor_type, _dtensor_looked_up
    if not _dtensor_looked_up and _DTENSOR_MODULE in sys.modules:
        _dtensor_looked_up = True
        register_sharding_rules()
        _dtensor_type = getattr(sys.modules[_DTENSOR_MODULE], "DTensor", None)
    return _dtensor_type


def check_sharded_args(op: str, batch_first: bool, **sequences) -> None:
    """For a call of a family's public function (``op``) given a tensor subclass: the rules
    registered once DTensor is loaded, and a DTensor among ``sequences`` sharded where ``op``
    cannot run refused here, with a ValueError (DTensor reports a rule's error as a
    RuntimeError)."""
    if torch.compiler.is_compiling():  # a traced graph: DTensor's own tracing meets the rules
        return
    dtensor = _loaded_dtensor_type()
    if dtensor is None:
        return
    for name, t in sequences.items():
        if isinstance(t, dtensor):
            refuse_unsupported(op, name, t, batch_first, _MODES[op])
