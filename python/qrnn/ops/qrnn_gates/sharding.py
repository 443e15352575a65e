"""The fused gates' DTensor rules: batch-sharded or replicated gates run on their local shards;
never hidden-sharded, as the gates' last dimension holds the Z, F, O blocks (registered by
:mod:`qrnn.ops.core.sharding` once DTensor is loaded)."""

from __future__ import annotations

from ..core.sharding import (
    BATCH,
    EMPTY,
    LENGTHS,
    REPLICATE,
    SEQUENCE,
    STATE,
    add_rules,
    present,
    refuse_unsupported,
    shardings,
)

MODES = (REPLICATE, BATCH)


def forward_rule(gates, c0, forget_mask, lengths, forget_scale, output_gate, batch_first, reverse):
    for name, t in (("gates", gates), ("forget_mask", forget_mask)):
        refuse_unsupported("qrnn_gates", name, t, batch_first, MODES)
    return shardings(MODES, batch_first, [SEQUENCE, STATE, SEQUENCE if output_gate else EMPTY],
                     [SEQUENCE, present(c0, STATE), present(forget_mask, SEQUENCE),
                      present(lengths, LENGTHS), None, None, None, None])


def backward_rule(grad_output, grad_c_n, gates, states, c0, forget_mask, lengths, forget_scale, output_gate,
                  batch_first, reverse):
    for name, t in (("grad_output", grad_output), ("gates", gates), ("states", states),
                    ("forget_mask", forget_mask)):
        refuse_unsupported("qrnn_gates_backward", name, t, batch_first, MODES)
    return shardings(MODES, batch_first, [SEQUENCE, STATE if c0 is not None else EMPTY],
                     [present(grad_output, SEQUENCE), present(grad_c_n, STATE), SEQUENCE, SEQUENCE,
                      present(c0, STATE), present(forget_mask, SEQUENCE), present(lengths, LENGTHS),
                      None, None, None, None])


add_rules("qrnn_gates", MODES, {"qrnn_gates": forward_rule, "qrnn_gates_backward": backward_rule})
