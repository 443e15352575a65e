"""Shared test fixtures: per-dtype tolerances, fresh random inputs, device parametrisation."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import qrnn
from qrnn.reference import forget_mult_backward_reference

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


def reference_grads(grad_h, f, x, h_saved, h0=None, batch_first=False):
    """float64 (grad_f, grad_x, grad_h0) of ForgetMult, given the forward output `h_saved` that
    autograd hands the backward op. With 16-bit storage that output is rounded, and
    grad_f = grad_c * (x - h[t-1]) inherits its rounding times |grad_c| (which sums over many
    steps): no backward kernel can undo that, so the exact reference of the backward is the
    one fed the same stored h. The forward is checked against the float64 recurrence itself."""
    as64 = lambda t: None if t is None else t.detach().double()
    return forget_mult_backward_reference(as64(grad_h), as64(f), as64(x), as64(h_saved), as64(h0),
                                          batch_first=batch_first)


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """Fresh random inputs each run (never a fixed seed), printed on failure to reproduce."""
    seed = torch.seed() % (2**31)
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield


CONSUMER = Path(__file__).parent / "cpp_consumer"


def _cmake():
    exe = shutil.which("cmake")
    if exe is None:
        pytest.skip("cmake is not installed (pip install cmake)")
    return exe


@pytest.fixture(scope="session")
def consumer_build(tmp_path_factory):
    build = tmp_path_factory.mktemp("consumer")
    cmake = _cmake()
    cmake_dir = subprocess.run([sys.executable, "-m", "qrnn", "--cmake-dir"], check=True,
                               capture_output=True, text=True).stdout.strip()
    assert cmake_dir == qrnn.cmake_dir() and Path(cmake_dir, "qrnnConfig.cmake").is_file()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run([cmake, "-S", str(CONSUMER), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                    f"-Dqrnn_DIR={cmake_dir}"], check=True, capture_output=True, text=True)
    proc = subprocess.run([cmake, "--build", str(build)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build
