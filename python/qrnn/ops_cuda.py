"""Former home of the CUDA backend, now :mod:`qrnn.ops.cuda`: its public names, re-exported."""

from .ops.cuda import (
    AVAILABLE,
    backward_into,
    backward_plan,
    current_stream_handle,
    forward_into,
    forward_plan,
    gates_backward_into,
    gates_backward_width,
    gates_forward_into,
    gates_forward_width,
    schedule,
)

__all__ = ["AVAILABLE", "current_stream_handle", "schedule", "forward_into", "backward_into", "forward_plan",
           "backward_plan", "gates_forward_into", "gates_backward_into", "gates_forward_width", "gates_backward_width"]
