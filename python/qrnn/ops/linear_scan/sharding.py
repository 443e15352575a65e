"""linear_scan's DTensor rules: batch-sharded, hidden-sharded or replicated sequences run on their
local shards (registered by :mod:`qrnn.ops.core.sharding` once DTensor is loaded)."""

from __future__ import annotations

from ..core.sharding import add_scan_rules

add_scan_rules("linear_scan", ("a", "b", "h0", "reverse", "batch_first"),
               ("grad_h", "a", "h", "h0", "reverse", "batch_first"))
