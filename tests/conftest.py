"""Shared test fixtures: per-dtype tolerances, fresh random inputs, device parametrisation."""

import pytest
import torch

# (atol, rtol) of a kernel's output against the float64 reference, per storage dtype.
# 16-bit storage rounds every stored element (bf16: 8 mantissa bits, fp16: 11); the state
# itself is carried in float32, so errors do not grow with sequence length.
TOLERANCES = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (2e-5, 2e-5),
    torch.bfloat16: (3e-2, 2e-2),
    torch.float16: (4e-3, 3e-3),
}

HAS_CUDA = torch.cuda.is_available()
CPU_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def pytest_collection_modifyitems(config, items):
    """`cuda` tests are skipped (never failed) on machines without an NVIDIA GPU."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:  # not item.keywords: it holds folder names
            item.add_marker(skip)


def assert_close_to_reference(actual, expected, dtype, what=""):
    """Compare with the tolerance of `dtype`, reporting the worst element on failure."""
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{what} ({dtype}): {m}")


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """Fresh random inputs each run (never a fixed seed), printed on failure to reproduce."""
    seed = torch.seed() % (2**31)
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield
