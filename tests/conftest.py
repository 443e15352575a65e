"""Shared test fixtures: per-dtype tolerances, fresh random inputs, device parametrisation."""

import contextlib
import ctypes
import io
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import qrnn
from qrnn import _C
from qrnn.ops._testing import native_kernels
from qrnn.ops.core import cuda as cuda_backend
from qrnn.ops.forget_mult import kernels as forget_mult_kernels
from qrnn.ops.forget_mult.reference import forget_mult_backward_reference
from qrnn.ops.linear_scan import kernels as linear_scan_kernels
from qrnn.ops.qrnn_gates import kernels as gate_kernels

# Fresh random inputs for every test; a failure prints its seed, --seed N replays it.
from seeds import _fresh_seed, pytest_addoption, pytest_runtest_makereport  # noqa: F401

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


def weights_only_reads(dtype) -> bool:
    """Whether this torch saves `dtype` and reads it back with weights_only=True (torch 2.4
    does neither for uint16/32/64)."""
    buffer = io.BytesIO()
    try:
        torch.save(torch.zeros(1, dtype=dtype), buffer)
        buffer.seek(0)
        torch.load(buffer, weights_only=True)
        return True
    except (pickle.UnpicklingError, KeyError):
        return False
CPU_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
# Tests of the CUDA backend's host side (emulated kernels, plans) need only a CUDA build.
needs_cuda_build = pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels")


def dtype_id(dtype) -> str:
    return str(dtype)[6:]  # "float16" for torch.float16


def pytest_collection_modifyitems(config, items):
    """`cuda` tests are skipped (never failed) on machines without an NVIDIA GPU."""
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:  # not item.keywords: it holds folder names
            item.add_marker(skip)


def assert_close_to_reference(actual, expected, dtype, what="", scale=1.0):
    """Compare with the tolerance of `dtype`, reporting the worst element on failure. `scale`
    (at least 1) multiplies the absolute tolerance, for values whose error grows with the
    size of the whole tensor rather than of the element (16-bit gradients of long scans)."""
    atol, rtol = TOLERANCES[dtype]
    atol *= max(1.0, float(scale))
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{what} ({dtype}): {m}")


def reference_grads(grad_h, f, x, h_saved, h0=None, batch_first=False):
    """float64 (grad_f, grad_x, grad_h0) of ForgetMult, given the forward output `h_saved` that
    autograd hands the backward op. With 16-bit storage that output is rounded, and
    grad_f = grad_c * (x - h[t-1]) inherits its rounding times |grad_c| (which sums over many
    steps): no backward kernel can undo that, so the exact reference of the backward is the
    one fed the same stored h. The forward is checked against the float64 recurrence itself."""
    def as64(t):
        return None if t is None else t.detach().double()

    return forget_mult_backward_reference(as64(grad_h), as64(f), as64(x), as64(h_saved), as64(h0),
                                          batch_first=batch_first)



def assert_forget_mult_grads(h, grad_h, f, x, h0, batch_first, dtype, what=""):
    """Backpropagate grad_h from h (computed from the leaves f, x and h0) and compare each
    gradient with the float64 backward of the stored h; h0's gradient keeps h0's dtype."""
    h.backward(grad_h)
    ref_f, ref_x, ref_h0 = reference_grads(grad_h, f, x, h, h0, batch_first)
    assert_close_to_reference(f.grad, ref_f, dtype, f"grad_f {what}")
    assert_close_to_reference(x.grad, ref_x, dtype, f"grad_x {what}")
    if h0 is not None:
        assert h0.grad.dtype == h0.dtype
        assert_close_to_reference(h0.grad, ref_h0, dtype, f"grad_h0 {what}")



def docs_hooks():
    """docs/hooks.py, the documentation site's generators, loaded as a module."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "docs" / "hooks.py"
    spec = importlib.util.spec_from_file_location("qrnn_docs_hooks", path)
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def site_page(relative: str) -> str:
    """docs/`relative` as the site shows it: its markers rendered by docs/hooks.py."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    return docs_hooks().render((docs / relative).read_text(), str(Path(relative).parent).strip("."))


def run_python(code, *args, timeout=120):
    """Run code (or `-m module` when args given) in a fresh interpreter; fail on a crash or hang."""
    cmd = [sys.executable] + (list(args) if args else ["-c", textwrap.dedent(code)])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout} s: {cmd}")
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    return proc


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


@pytest.fixture(scope="session")
def torch_library_cache(tmp_path_factory):
    """A fresh libqrnn_torch cache ($QRNN_CACHE_DIR) shared by the session's tests: the library
    is compiled once for all of them, never into the user's cache."""
    previous = os.environ.get("QRNN_CACHE_DIR")
    os.environ["QRNN_CACHE_DIR"] = str(tmp_path_factory.mktemp("qrnn-cache"))
    yield Path(os.environ["QRNN_CACHE_DIR"])
    if previous is None:
        os.environ.pop("QRNN_CACHE_DIR", None)
    else:
        os.environ["QRNN_CACHE_DIR"] = previous


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
    """ctypes front of tests/cuda_emulation/emulate_kernels.cpp. Each method takes the
    argument tuple a family's kernels module builds for qrnn._C's CUDA launchers (the very numbers
    a GPU call passes) and the launch plan (vector width, chunks) the launch would use."""

    def __init__(self, path: Path):
        self._entry = ctypes.CDLL(str(path)).qrnn_emulate
        self._entry.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_double),
                                ctypes.c_int, ctypes.c_int]
        self.fields = _C.kernel_fields()

    def status(self, kernel: str, args: tuple, vector_width: int, chunks: int = 1) -> int:
        """Runs `kernel` on `args` (the fields of _C.kernel_fields()[kernel], nothing after):
        0, or 1 after the emulator printed its error to stderr."""
        kinds = [kind for kind, _ in self.fields[kernel]]
        expected = sum(4 if k.endswith("view3") else 3 if k.endswith("view2") else 1 for k in kinds)
        assert len(args) == expected, f"{kernel}: {len(args)} numbers, its fields take {expected}"
        reals = [a for a in args if isinstance(a, float)]
        ints = [a for a in args if not isinstance(a, float)]
        assert len(reals) == kinds.count("real")
        return self._entry(kernel.encode(), (ctypes.c_int64 * len(ints))(*ints),
                           (ctypes.c_double * (len(reals) + 1))(*reals), vector_width, chunks)

    def run(self, kernel: str, args: tuple, vector_width: int, chunks: int = 1) -> None:
        """As status(), asserting success."""
        assert self.status(kernel, args, vector_width, chunks) == 0, \
            f"the emulated {kernel} failed (its error is on stderr)"

    def forward(self, h, f, x, h0, batch_first, plan):
        self.run("forget_mult_forward", forget_mult_kernels.forward_args(h, f, x, h0, batch_first), *plan)

    def backward(self, grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first, plan):
        args = forget_mult_kernels.backward_args(grad_f, grad_x, grad_h0, grad_h, f, x, h, h0, batch_first)
        self.run("forget_mult_backward", args, *plan)

    def gates_forward(self, args: tuple, width: int):
        self.run("qrnn_gates_forward", args, width)

    def gates_backward(self, args: tuple, width: int):
        self.run("qrnn_gates_backward", args, width)


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    if not cuda_backend.AVAILABLE:
        pytest.skip("qrnn was built without its CUDA kernels")
    include = _cuda_include()
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if include is None or cxx is None:
        pytest.skip("needs the CUDA headers (CUDA_HOME or nvcc on PATH) and a C++ compiler")
    out = tmp_path_factory.mktemp("cuda_emulation") / "emulate_kernels.so"
    (out.parent / "emulated_families.inc").write_text(
        "".join(f'#include "{family}/kernels.cuh"\n' for family in qrnn.ops.FAMILIES))
    # QRNN_EMULATOR_CXXFLAGS adds flags, e.g. "-fsanitize=address" (then run pytest with
    # LD_PRELOAD set to the compiler's libasan) to catch any access outside the tensors.
    extra = os.environ.get("QRNN_EMULATOR_CXXFLAGS", "").split()
    source = REPO / "tests" / "cuda_emulation" / "emulate_kernels.cpp"
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-shared", "-fPIC", "-pthread", *extra, f"-I{include}", f"-I{out.parent}",
           f"-I{REPO / 'cpp' / 'include'}", f"-I{REPO / 'cpp' / 'src'}", f"-I{REPO / 'cuda'}", str(source),
           "-o", str(out)]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, f"building the kernel emulator failed:\n{built.stderr[-4000:]}"
    return Emulator(out)


# ---- The CUDA backend (qrnn.ops.core.cuda) on CPU tensors, launching the emulated kernels ----------


class EmulatedLaunchers:
    """qrnn._C as qrnn.ops.core.cuda sees it, with each CUDA launcher running the emulated
    kernel on the numbers the launch received (and the plan the real build computes from
    them). Every launch is recorded: (kernel, stream, device, plan)."""

    def __init__(self, real, emulator: Emulator):
        self._real, self._emulator = real, emulator
        self.launches: list = []

    def __getattr__(self, name):
        """cuda_<kernel> launchers run emulated; plans, widths, everything else: the real module."""
        real = getattr(self._real, name)
        kernel = name[len("cuda_"):]
        if not name.startswith("cuda_") or kernel not in self._emulator.fields:
            return real
        if hasattr(self._real, f"{name}_plan"):  # a scan family: (fields, stream, schedule, device)
            def launch(*args):
                *fields, stream, schedule, device = args
                self._run(kernel, fields, stream, device, getattr(self._real, f"{name}_plan")(*fields, schedule))
        else:  # the gates: (fields, stream, device), a vector width and no schedule
            def launch(*args):
                *fields, stream, device = args
                self._run(kernel, fields, stream, device, getattr(self._real, f"{name}_width")(*fields))
        return launch

    def _run(self, kernel, fields, stream, device, plan):
        self._emulator.run(kernel, tuple(fields), *plan)
        self.launches.append((kernel, stream, device, tuple(plan)))


class EmulatedRuntime:
    """Stands in for the CUDA lookups of qrnn.ops.core.cuda: CPU tensors are taken to live on
    device `device_index`, whose current stream is STREAM."""

    STREAM = 0x5EED  # a recognisable stream handle: launches must pass what the lookup gave

    def __init__(self):
        self.device_index = 0

    def index(self, device):
        return self.device_index

    def stream(self, index):
        assert index == self.device_index, "the stream must be looked up on the launch's device"
        return self.STREAM


@pytest.fixture
def emulated_cuda(emulator, monkeypatch):
    """A context manager factory: inside ``with emulated_cuda() as launches:``, CPU tensors
    take the CUDA path of qrnn (the ops -> each family's kernels -> qrnn.ops.core.cuda ->
    qrnn._C's launchers) with the launchers running the emulated kernels; ``launches`` is the
    EmulatedLaunchers recording them."""

    @contextlib.contextmanager
    def enable():
        launchers, runtime = EmulatedLaunchers(_C, emulator), EmulatedRuntime()
        cuda_kernels = ((forget_mult_kernels.cuda_forward, forget_mult_kernels.cuda_backward),
                        (gate_kernels.cuda_forward, gate_kernels.cuda_backward))
        scan = (linear_scan_kernels.cuda_forward, linear_scan_kernels.cuda_backward)
        with monkeypatch.context() as m, native_kernels("cpu", *cuda_kernels, linear_scan=scan):
            m.setattr(cuda_backend, "_C", launchers)
            m.setattr(cuda_backend, "runtime", runtime)
            launchers.runtime = runtime
            yield launchers

    return enable


# ---- One path against another (CUDA glue vs CPU kernels, fallback vs kernels) ---------------


def outputs_and_grads(fn, inputs, **kwargs) -> list:
    """fn(*inputs, **kwargs)'s outputs, then the gradients of a fixed random projection of
    them with respect to each input that is not None (fresh leaves, inputs untouched)."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None for t in inputs]
    outputs = fn(*leaves, **kwargs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    gen = torch.Generator().manual_seed(7)
    loss = sum((o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64)).sum() for o in outputs)
    grads = torch.autograd.grad(loss, [t for t in leaves if t is not None])
    return [o.detach() for o in outputs] + list(grads)


def scan_bad_inputs(fn, op: str, one: str, two: str) -> list:
    """(call, error, message) of the argument errors both scan families report alike (their
    checks are ops/core/checks.py's): `fn` is the public function of `op`, `one` and `two`
    its sequences' names."""
    return [
        (lambda: fn([1.0], torch.rand(2, 2, 2)), TypeError, f"{op}: {one} must be a torch.Tensor"),
        (lambda: fn(torch.rand(2, 2, 2), None), TypeError, f"{op}: {two} must be a torch.Tensor"),
        (lambda: fn(torch.rand(2, 2, 2), torch.rand(2, 2, 2, dtype=torch.float64)), TypeError,
         f"{two} must have {one}'s dtype"),
        (lambda: fn(torch.rand(2, 2), torch.rand(2, 2)), ValueError, f"{one} must be 3-D"),
        (lambda: fn(torch.rand(2, 3, 4), torch.rand(2, 3, 5)), ValueError, f"{two} must have {one}'s shape"),
        (lambda: fn(torch.rand(2, 3, 4), torch.rand(2, 3, 4), torch.rand(4, 3)), ValueError, "h0 must have shape"),
        (lambda: fn(torch.rand(2, 3, 4), torch.rand(2, 3, 4, device="meta")), ValueError,
         f"{two} must be on {one}'s device"),
    ]


def assert_threads_agree(fn, *args) -> None:
    """``fn(*args)`` is the same, bit for bit, on one thread as on several: the result does
    not depend on how many threads split the work."""
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = fn(*args)
        torch.set_num_threads(max(2, old))
        many = fn(*args)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, many)


def assert_all_close(actual, expected, dtype, what="") -> None:
    """Pairwise: same dtype and shape, values within twice `dtype`'s tolerance (both sides
    round their own 16-bit outputs)."""
    atol, rtol = TOLERANCES[dtype]
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, f"{what}[{i}]: {a.dtype} {a.shape} vs {e.dtype} {e.shape}"
        torch.testing.assert_close(a.double(), e.double(), atol=2 * atol, rtol=2 * rtol,
                                   msg=lambda m, i=i: f"{what}[{i}] ({dtype}): {m}")


# dtype x h0 present x layout: the cases two ForgetMult paths are compared on.
FORGET_MULT_CASES = [pytest.param(dtype, h0, batch_first, id=f"{str(dtype)[6:]}-{'h0' if h0 else 'no_h0'}-"
                                  f"{'batch_first' if batch_first else 'time_major'}")
                     for dtype in CPU_DTYPES for h0 in (False, True) for batch_first in (False, True)]


def random_forget_mult_inputs(T, B, H, dtype, h0, batch_first):
    """f in (0, 1), x and (when h0) a state in the kernels' state dtype, never zeros."""
    shape = (B, T, H) if batch_first else (T, B, H)
    f = torch.rand(shape, dtype=torch.float64).to(dtype)
    x = torch.randn(shape, dtype=torch.float64).to(dtype)
    state = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    return f, x, (torch.randn(B, H, dtype=torch.float64).to(state) if h0 else None)


def assert_same_training_state(a, b):
    """Two qrnn-train checkpoints hold the same training state, bit for bit."""
    assert a["progress"] == b["progress"]
    for key in ("loss_sum", "tokens"):  # the epoch in progress (its seconds are a clock's)
        assert a["epoch_so_far"][key] == b["epoch_so_far"][key], key
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for pa, pb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        for key in pa:
            assert torch.equal(torch.as_tensor(pa[key]), torch.as_tensor(pb[key])), key
    assert a["scaler"] == b["scaler"]
    assert a["scheduler"] == b["scheduler"]
