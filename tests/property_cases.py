"""Helpers of the property-based tests (hypothesis; tests/*/test_*_properties.py): random
shapes, memory layouts, dtypes and initial states, every case compared with the float64
reference. Each example draws a seed for its tensor contents, so a failure hypothesis
shrinks and prints is reproducible as is. Bounded (max_examples, no deadline) to stay fast.
"""

import torch
from hypothesis import HealthCheck, settings

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

LAYOUTS_3D = ["contiguous", "transposed", "sliced", "strided", "flipped", "expanded"]
LAYOUTS_2D = ["contiguous", "transposed", "strided", "expanded"]


def random_values(shape, kind, gen):
    if kind == "gate":
        return torch.rand(shape, generator=gen, dtype=torch.float64)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def make_tensor(shape, dtype, layout, kind, gen, expand_dim=0):
    """A tensor of `shape` with random contents stored in `layout`. Gaps of sliced and
    strided views hold NaN, so a kernel reading outside the view poisons its result."""
    shape = tuple(shape)
    nd = len(shape)
    if layout == "contiguous":
        return random_values(shape, kind, gen).to(dtype)
    if layout == "transposed":  # stored with the dims reversed, viewed back
        return random_values(shape[::-1], kind, gen).to(dtype).permute(*range(nd - 1, -1, -1))
    if layout in ("sliced", "strided"):
        big = torch.full([s * 2 + 3 for s in shape], float("nan"), dtype=dtype)
        if layout == "sliced":
            index = tuple(slice(1, 1 + s) for s in shape)
        else:
            index = tuple(slice(2, 2 + 2 * s, 2) for s in shape)
        big[index] = random_values(shape, kind, gen).to(dtype)
        return big[index]
    if layout == "flipped":  # a reversed (flip) copy of a padded buffer, sliced along the last dim
        padded = torch.full(shape[:-1] + (2 * shape[-1] + 1,), float("nan"), dtype=dtype)
        padded[..., 1:1 + shape[-1]] = random_values(shape, kind, gen).to(dtype)
        return padded.flip(0)[..., 1:1 + shape[-1]]
    if layout == "expanded":  # stride 0 along one dim
        small = list(shape)
        small[expand_dim] = 1
        return random_values(small, kind, gen).to(dtype).expand(shape)
    raise AssertionError(layout)


def describe(case):
    return " ".join(f"{k}={v}" for k, v in case.items())
