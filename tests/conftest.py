"""Shared test fixtures: per-dtype tolerances, fresh random inputs, device parametrisation."""

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import qrnn
from qrnn import ops, ops_cuda
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


# ---- The CUDA kernels emulated on the CPU (test_*_cuda_emulated.py) ----------------------

REPO = Path(__file__).resolve().parents[1]


def _cuda_include():
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    if shutil.which("nvcc"):  # nvcc names its own installation (it may be a wrapper script)
        dry = subprocess.run(["nvcc", "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                             capture_output=True, text=True)
        roots += [line.split("TOP=", 1)[1].strip() for line in (dry.stdout + dry.stderr).splitlines()
                  if "TOP=" in line]
    for root in roots:
        if root and (Path(root) / "include" / "cuda_fp16.h").is_file():
            return Path(root) / "include"
    return None


class Emulator:
    """ctypes front of tests/cuda_emulation/emulate_kernels.cpp: the integers of qrnn._C's
    CUDA launchers (built by qrnn.ops_cuda / qrnn.ops) and a launch plan or vector width."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        for fn in (lib.qrnn_emulate_forward, lib.qrnn_emulate_backward):
            fn.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int]
        for fn in (lib.qrnn_emulate_gates_forward, lib.qrnn_emulate_gates_backward):
            fn.argtypes = [ctypes.c_double, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
        self.lib = lib

    @staticmethod
    def _ints(args):
        return (ctypes.c_int64 * len(args))(*args)

    def forward(self, h, f, x, h0, batch_first, plan):
        args = ops._forward_args(h, f, x, h0, batch_first)
        assert len(args) == 20
        assert self.lib.qrnn_emulate_forward(self._ints(args), *plan) == 0

    def backward(self, grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first, plan):
        args = ops._backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
        assert len(args) == 35
        assert self.lib.qrnn_emulate_backward(self._ints(args), *plan) == 0

    def gates_forward(self, args: tuple, width: int):
        """`args`: ops._gates_forward_args (forget_scale, then 33 integers)."""
        assert len(args) == 34
        assert self.lib.qrnn_emulate_gates_forward(args[0], self._ints(args[1:]), width) == 0

    def gates_backward(self, args: tuple, width: int):
        """`args`: ops._gates_backward_args (forget_scale, then 41 integers)."""
        assert len(args) == 42
        assert self.lib.qrnn_emulate_gates_backward(args[0], self._ints(args[1:]), width) == 0


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    if not ops_cuda.AVAILABLE:
        pytest.skip("qrnn was built without its CUDA kernels")
    include = _cuda_include()
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if include is None or cxx is None:
        pytest.skip("needs the CUDA headers (CUDA_HOME or nvcc on PATH) and a C++ compiler")
    out = tmp_path_factory.mktemp("cuda_emulation") / "emulate_kernels.so"
    # QRNN_EMULATOR_CXXFLAGS adds flags, e.g. "-fsanitize=address" (then run pytest with
    # LD_PRELOAD set to the compiler's libasan) to catch any access outside the tensors.
    extra = os.environ.get("QRNN_EMULATOR_CXXFLAGS", "").split()
    source = REPO / "tests" / "cuda_emulation" / "emulate_kernels.cpp"
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-shared", "-fPIC", "-pthread", *extra, f"-I{include}",
           f"-I{REPO / 'cpp' / 'include'}", f"-I{REPO / 'cuda'}", str(source), "-o", str(out)]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, f"building the kernel emulator failed:\n{built.stderr[-4000:]}"
    return Emulator(out)
