"""linear_scan's DTensor rules: batch-sharded, hidden-sharded or replicated sequences run on their
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


def forward_rule(a, b, h0, reverse, batch_first):
    for name, t in (("a", a), ("b", b)):
        refuse_unsupported("linear_scan", name, t, batch_first, MODES)
    return shardings(MODES, batch_first, [SEQUENCE],
                     [SEQUENCE, SEQUENCE, present(h0, STATE), None, None])


def backward_rule(grad_h, a, h, h0, reverse, batch_first):
    for name, t in (("grad_h", grad_h), ("a", a), ("h", h)):
        refuse_unsupported("linear_scan_backward", name, t, batch_first, MODES)
    return shardings(MODES, batch_first, [SEQUENCE, SEQUENCE, STATE if h0 is not None else EMPTY],
                     [SEQUENCE] * 3 + [present(h0, STATE), None, None])


add_rules("linear_scan", MODES, {"linear_scan": forward_rule, "linear_scan_backward": backward_rule})
