"""What the first run on a GPU depends on, checked on the CPU: the CUDA glue only names
things that exist, tools/gpu_check.sh reports every part even when some fail, and the
launchers' driver check explains itself."""

from __future__ import annotations

import ast
import ctypes
import importlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from qrnn import _C, ops
from qrnn.ops.core import cuda as cuda_backend
from qrnn.ops.forget_mult import kernels as forget_mult_kernels

REPO = Path(__file__).resolve().parents[2]


def _attributes_of(module_path: Path, name: str) -> set[str]:
    tree = ast.parse(module_path.read_text())
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name}


def _modules_imported_by(module_path: Path, package: str) -> dict:
    """{name: module} of the qrnn modules that `module_path` (in `package`) binds to a name."""
    modules = {}
    for node in ast.walk(ast.parse(module_path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = importlib.import_module(importlib.util.resolve_name("." * node.level + (node.module or ""), package))
            for alias in node.names:
                value = getattr(base, alias.name)
                if isinstance(value, types.ModuleType):
                    modules[alias.asname or alias.name] = value
    return modules


@pytest.mark.parametrize("module_path", ["core/cuda.py"] + [f"{family}/kernels.py" for family in ops.FAMILIES])
def test_cuda_glue_names_exist(module_path):
    """The CUDA backend's GPU-only code paths never run without a GPU, so a misspelt
    attribute of a module it reads at call time (_C, or any qrnn module it imports) would
    first show as an AttributeError on the GPU."""
    path = REPO / "python" / "qrnn" / "ops" / module_path
    package = "qrnn.ops." + module_path.rpartition("/")[0]
    modules = _modules_imported_by(path, package)
    assert modules.get("_C") is _C
    for name, module in modules.items():
        if module is _C and not cuda_backend.AVAILABLE:
            continue
        missing = sorted(a for a in _attributes_of(path, name) if not hasattr(module, a))
        assert not missing, f"ops/{module_path} uses {name}.{missing}, which {module.__name__} does not define"
    if cuda_backend.AVAILABLE:  # launchers named as strings (looked up at the call)
        named = re.findall(r'launch_by_name\(\s*"(\w+)"', path.read_text())
        assert [n for n in named if not hasattr(_C, n)] == []


GPU_CHECK = REPO / "tools" / "gpu_check.sh"
PARTS = ["env", "build", "library", "smoke", "resources", "tests", "bench-fm", "bench-layer", "memcheck",
         "racecheck", "synccheck"]


def _gpu_check(tmp_path, dry_run=True, **env):
    run_env = dict(os.environ, OUT_DIR=str(tmp_path), PYTHON=sys.executable,
                   QRNN_GPU_CHECK_DRY_RUN="1" if dry_run else "0", **env)
    proc = subprocess.run(["bash", str(GPU_CHECK)], capture_output=True, text=True, env=run_env, timeout=120)
    table = proc.stdout[proc.stdout.index("== gpu_check results"):]
    rows = {line.split()[0]: line.split()[1] for line in table.splitlines()[2:] if line.split()[0] in PARTS}
    return proc.returncode, table, rows


def test_gpu_check_reports_every_part_when_one_fails(tmp_path):
    """A failing part neither stops the script nor hides the parts after it: every part
    gets a row of the table, printed last, and the exit status says something failed."""
    rc, table, rows = _gpu_check(tmp_path, QRNN_GPU_CHECK_FAIL="smoke bench-fm")
    assert rc == 1, table
    assert list(rows) == PARTS, table
    assert rows["smoke"] == "FAIL" and rows["bench-fm"] == "FAIL"
    assert all(rows[p] == "DRY" for p in PARTS if p not in ("smoke", "bench-fm")), table
    assert table.rstrip().endswith(f"FAILED (logs under {tmp_path})")
    assert (tmp_path / "summary.txt").read_text().strip() == table.strip()


def test_gpu_check_skips_what_needs_a_failed_build(tmp_path):
    rc, table, rows = _gpu_check(tmp_path, QRNN_GPU_CHECK_FAIL="build")
    assert rc == 1
    assert rows["env"] == "DRY" and rows["build"] == "FAIL"
    assert all(rows[p] == "SKIP" for p in PARTS[2:]), table


def test_gpu_check_reports_a_part_that_really_fails(tmp_path):
    """Not a dry run: the resource report of a folder with no build fails (exit 2), and the
    table still comes, with the tool's reason."""
    rc, table, rows = _gpu_check(tmp_path, dry_run=False, QRNN_GPU_CHECK_PARTS="resources")
    assert rc == 1 and rows == {"resources": "FAIL"}, table
    assert "exit 2; no CUDA compiler reports" in table
    assert "no CUDA compiler reports" in (tmp_path / "resources.log").read_text()


def test_gpu_check_passes_with_nothing_failed(tmp_path):
    rc, table, rows = _gpu_check(tmp_path, QRNN_GPU_CHECK_PARTS="env smoke tests")
    assert rc == 0, table
    assert rows == {"env": "DRY", "smoke": "DRY", "tests": "DRY"}


@pytest.fixture(scope="module")
def runtime_messages(tmp_path_factory):
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    exe = tmp_path_factory.mktemp("runtime_messages") / "runtime_messages"
    built = subprocess.run([cxx, "-std=c++17", "-Wall", "-Werror", f"-I{REPO / 'cuda'}",
                            str(REPO / "tests" / "cuda_emulation" / "runtime_messages.cpp"), "-o", str(exe)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr

    def run(*args):
        return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, check=True).stdout
    return run


@pytest.mark.parametrize("driver,runtime,ok", [
    (13000, 13000, True), (13020, 13000, True), (12080, 13000, False), (0, 13000, False),
    (12020, 12080, True),  # minor version compatibility within CUDA 12
    (11080, 12040, False),
])
def test_driver_check_decides_by_major_release(runtime_messages, driver, runtime, ok):
    assert runtime_messages("driver", driver, runtime).splitlines()[0] == str(int(ok))


def test_driver_too_old_message_names_both_versions(runtime_messages):
    text = runtime_messages("driver", 12040, 13000).splitlines()[1]
    assert "supports CUDA 12.4 at most" in text and "cudaDriverGetVersion returned 12040" in text
    assert "CUDA 13.0 runtime" in text and "CUDART_VERSION 13000" in text
    assert "driver for CUDA 13.0 or newer" in text and "580.65.06" in text
    assert "CUDA toolkit of at most 12.4" in text
    missing = runtime_messages("driver", 0, 12080).splitlines()[1]
    assert missing.startswith("no NVIDIA driver was found") and "CUDA 12.8 runtime" in missing
    assert "driver for CUDA 12.0 or newer" in missing and "525.60.13" in missing


def test_capture_before_load_message(runtime_messages):
    text = runtime_messages("capture", 1, 12020)
    assert "device 1" in text and "CUDA 12.2" in text and "older than CUDA 12.3" in text
    assert "CUDA_MODULE_LOADING=EAGER" in text and "once on this device before capturing" in text


def _driver_version() -> int:
    """The driver's CUDA version (cuDriverGetVersion), 0 if there is none."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    version = ctypes.c_int(0)
    return version.value if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0 else 0


CAPTURE_FIRST = """
import torch, qrnn
f = torch.rand(8, 2, 16, device="cuda")
x = torch.randn(8, 2, 16, device="cuda")
graph = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(graph):  # the process's first qrnn launch
        h = qrnn.forget_mult(f, x)
except RuntimeError as e:
    print(e)
    raise SystemExit(3)
graph.replay()
torch.cuda.synchronize()
assert torch.allclose(h.cpu(), qrnn.forget_mult(f.cpu(), x.cpu()), atol=1e-5, rtol=1e-5)
print("ok")
"""


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels")
def test_first_launch_inside_a_capture():
    """A fresh process whose first qrnn launch is being captured: a driver >= 12.3 loads
    the kernels during the capture and the graph replays correctly; an older one raises
    the error that says to warm up first or set CUDA_MODULE_LOADING=EAGER."""
    proc = subprocess.run([sys.executable, "-c", CAPTURE_FIRST], capture_output=True, text=True, timeout=300)
    if _driver_version() >= 12030:
        assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
    else:
        assert proc.returncode == 3 and "CUDA_MODULE_LOADING=EAGER" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.cuda
@pytest.mark.skipif(not cuda_backend.AVAILABLE, reason="qrnn was built without its CUDA kernels")
def test_launch_leaves_the_current_device_alone():
    """The launcher makes the tensors' device current for the launch and restores the
    previous one (with one GPU: the same device, checked before and after)."""
    import torch
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    f, x = torch.rand(5, 2, 8, device=last), torch.randn(5, 2, 8, device=last)
    with torch.cuda.device(0):
        h = forget_mult_kernels.forward_into(torch.empty_like(f), f, x)
        assert torch.cuda.current_device() == 0
    torch.testing.assert_close(h.cpu(), ops.forget_mult_op(f.cpu(), x.cpu(), None, False))


def test_current_stream_lookup_asks_for_the_launch_device(monkeypatch):
    """The stream handle comes from torch's raw getter for the launch's device or, on a torch
    without that getter, from torch.cuda.current_stream of that device (GPU-only code: the
    lookups are stood in for here)."""
    asked = []
    monkeypatch.setattr(cuda_backend, "_raw_stream", lambda index: asked.append(("raw", index)) or 0x1234)
    assert cuda_backend.current_stream_handle(3) == 0x1234 and asked == [("raw", 3)]

    class Stream:
        cuda_stream = 0x5678

    monkeypatch.setattr(cuda_backend, "_raw_stream", None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: asked.append(("stream", index)) or Stream())
    assert cuda_backend.current_stream_handle(2) == 0x5678 and asked[-1] == ("stream", 2)
