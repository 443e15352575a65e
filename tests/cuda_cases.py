"""Inputs and float64 references shared by the CUDA kernel tests (on a GPU, and emulated on
the CPU): random inputs, the strided views the kernels must handle, NaN-poisoned outputs
inside wider buffers (the backward reference is conftest.reference_grads)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from conftest import CPU_DTYPES, assert_close_to_reference, dtype_id
from qrnn.ops.forget_mult.reference import forget_mult_reference

HALF = (torch.float16, torch.bfloat16)


def h0_cases():
    """(dtype, h0's dtype) of a scan's kernels: no h0 (None), one in the dtype, and a float32
    one next to 16-bit data (the carried state's dtype)."""
    for dtype in CPU_DTYPES:
        kinds = {"none": None, "same": dtype, **({"float32": torch.float32} if dtype in HALF else {})}
        for kind, h0_dtype in kinds.items():
            yield pytest.param(dtype, h0_dtype, id=f"{dtype_id(dtype)}-h0_{kind}")


def assert_schedule_taken(schedule: str, *plans) -> None:
    """Plans (vector_width, chunks) that a forced schedule gives: chunked ones split time,
    serial ones do not."""
    if schedule == "chunked":
        assert all(plan[1] > 1 for plan in plans), plans
    if schedule == "serial":
        assert all(plan[1] == 1 for plan in plans), plans


def expanded(T, B, H, dtype) -> Tensor:
    """(T, B, H) values broadcast from one row of H (no memory: the shapes of the size rule)."""
    return torch.rand(1, 1, H).to(dtype).expand(T, B, H)


def poisoned_grads(like: Tensor, state) -> tuple:
    """A scan backward's outputs as (view, buffer) pairs of poisoned_like: the two sequence
    gradients shaped like `like`, and the state's like `state` ((None, None) without one)."""
    return poisoned_like(like), poisoned_like(like), (poisoned_like(state) if state is not None else (None, None))


def random_grad(like: Tensor) -> Tensor:
    """An incoming gradient for `like`: normal values in its dtype."""
    return torch.randn(like.shape, dtype=torch.float64).to(like.dtype)


def assert_written(view: Tensor, buffer: Tensor, reference: Tensor, dtype, what: str) -> None:
    """An output the kernel wrote into `view` of the poisoned `buffer` (poisoned_like): close
    to `reference`, and nothing outside the view touched."""
    assert_close_to_reference(view, reference, dtype, what)
    assert_untouched_outside(view, buffer)


def make_inputs(T, B, H, dtype, device="cpu", *, batch_first=False, h0_dtype=None, layout="contiguous"):
    """Fresh random f in (0, 1), x and h0 normal (never zeros), in the given layout.

    Layouts (each one exercises a different kernel path):
      contiguous   plain tensors (widest vector loads when H allows)
      offset       x[..., 1:] of a one-wider buffer: misaligned rows, scalar loads
      tail         x[..., :H] of a buffer whose rows are a multiple of 16 units: aligned
                   rows whose last pack is partial
      strided_h    x[..., ::2]: hidden stride 2, scalar loads
      strided_t    every other time step of a twice-longer buffer
      expanded     f and x broadcast along batch (zero batch stride)
    """
    shape = (B, T, H) if batch_first else (T, B, H)
    t_dim = 1 if batch_first else 0

    def make(fn):
        if layout == "contiguous":
            return fn(shape)
        if layout == "offset":
            return fn(shape[:2] + (H + 1,))[..., 1:]
        if layout == "tail":
            return fn(shape[:2] + ((H // 16 + 2) * 16,))[..., :H]
        if layout == "strided_h":
            return fn(shape[:2] + (2 * H,))[..., ::2]
        if layout == "strided_t":
            wide = list(shape)
            wide[t_dim] *= 2
            return fn(tuple(wide))[(slice(None),) * t_dim + (slice(None, None, 2),)]
        if layout == "expanded":
            one = list(shape)
            one[1 - t_dim] = 1
            return fn(tuple(one)).expand(shape)
        raise ValueError(layout)

    f = make(lambda s: torch.rand(s, dtype=torch.float64, device=device).mul_(0.98).add_(0.01).to(dtype))
    x = make(lambda s: torch.randn(s, dtype=torch.float64, device=device).to(dtype))
    h0 = None
    if h0_dtype is not None:
        h0 = torch.randn(B, H, dtype=torch.float64, device=device).to(h0_dtype)
    return f, x, h0


def poisoned_like(t: Tensor, dtype=None) -> tuple[Tensor, Tensor]:
    """A NaN-filled view shaped like `t` inside a wider NaN buffer: (view, buffer). Every
    element of the view must be overwritten, and nothing outside it. The view starts 8
    elements into rows of a multiple of 16 elements, so it keeps 16-byte alignment and the
    kernels may use their widest loads on it."""
    dtype = t.dtype if dtype is None else dtype
    width = (t.shape[-1] // 16 + 2) * 16
    buffer = torch.full(t.shape[:-1] + (width,), float("nan"), dtype=dtype, device=t.device)
    return buffer[..., 8:8 + t.shape[-1]], buffer


def assert_untouched_outside(view: Tensor, buffer: Tensor) -> None:
    """Everything of `buffer` outside `view` (made by poisoned_like) is still NaN."""
    mask = torch.ones(buffer.shape, dtype=torch.bool, device=buffer.device)
    mask[..., 8:8 + view.shape[-1]] = False
    assert torch.isnan(buffer[mask]).all(), "the kernel wrote outside its output view"


def forward_reference(f, x, h0, batch_first=False) -> Tensor:
    """float64 forward on the (already rounded) inputs; differentiable when they require grad."""
    return forget_mult_reference(f.double(), x.double(), None if h0 is None else h0.double(),
                                 batch_first=batch_first)


def widest_pack(dtype, pack_bytes=16):
    """Elements of `dtype` in the widest vector access of `pack_bytes` bytes (at least 1)."""
    return max(1, pack_bytes // torch.empty(0, dtype=dtype).element_size())


# (dtype, layout, hidden) -> vector width of a scan's serial plan: the widest pack that every
# unit-stride array's alignment allows (strided arrays are read element by element and set no
# condition), with a scalar tail for a partial last pack; the same whether time runs forward
# or reversed.
EXPECTED_WIDTHS = [
    (torch.float16, "contiguous", 40, 8), (torch.float16, "contiguous", 44, 4),
    (torch.float16, "contiguous", 42, 2), (torch.float16, "contiguous", 37, 1),
    (torch.float16, "offset", 40, 1), (torch.float16, "tail", 38, 8), (torch.float16, "strided_h", 40, 8),
    (torch.float16, "strided_t", 40, 8), (torch.float16, "expanded", 40, 8),
    (torch.bfloat16, "contiguous", 40, 8), (torch.bfloat16, "contiguous", 42, 2),
    (torch.float32, "contiguous", 40, 4), (torch.float32, "contiguous", 42, 2),
    (torch.float32, "contiguous", 37, 1), (torch.float32, "tail", 38, 4), (torch.float32, "offset", 40, 1),
    (torch.float32, "strided_t", 40, 4),
    (torch.float64, "contiguous", 40, 2), (torch.float64, "contiguous", 37, 1),
    (torch.float64, "tail", 37, 2), (torch.float64, "offset", 40, 1),
]


def compiled_widths(dtype):
    """The vector widths the scan kernels are compiled for: 16, 8 and 4 bytes per pack (when
    that is more than one element) and single elements."""
    widest = widest_pack(dtype)
    return sorted({w for w in (widest, widest // 2, widest // 4) if w > 1} | {1})
