"""ForgetMult's DTensor rules: batch-sharded, hidden-sharded or replicated sequences run on their
local shards (registered by :mod:`qrnn.ops.core.sharding` once DTensor is loaded)."""

from __future__ import annotations

from ..core.sharding import (
    BATCH,
    EMPTY,
    HIDDEN,
    REPLICATE,
    SEQUENCE,
    STATE,
    add_rules,
    present,
    refuse_unsupported,
    shardings,
)

MODES = (REPLICATE, BATCH, HIDDEN)


def forward_rule(f, x, h0, batch_first):
    for name, t in (("f", f), ("x", x)):
        refuse_unsupported("forget_mult", name, t, batch_first, MODES)
    return shardings(MODES, batch_first, [SEQUENCE],
                     [SEQUENCE, SEQUENCE, present(h0, STATE), None])


def backward_rule(grad_h, f, x, h, h0, batch_first):
    for name, t in (("grad_h", grad_h), ("f", f), ("x", x), ("h", h)):
        refuse_unsupported("forget_mult_backward", name, t, batch_first, MODES)
    return shardings(MODES, batch_first, [SEQUENCE, SEQUENCE, STATE if h0 is not None else EMPTY],
                     [SEQUENCE] * 4 + [present(h0, STATE), None])


add_rules("forget_mult", MODES, {"forget_mult": forward_rule, "forget_mult_backward": backward_rule})
