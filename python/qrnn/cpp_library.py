"""``qrnn.torch_library()``: libqrnn_torch, the qrnn:: operators for C++ programs.

An AOTInductor package or exported program of a qrnn model calls ``qrnn::qrnn_gates`` (and
``qrnn::forget_mult``, ``qrnn::linear_scan``; the forward operators: inference graphs hold
no others, with the schemas of the C++ manifests, as Python defines them) through
PyTorch's dispatcher; in a process without Python those operators come from this library.
It uses only PyTorch's stable C ABI (torch >= 2.9: no libtorch C++ API), but it needs
torch's headers to compile, which an isolated ``pip install`` does not see: so it is
compiled here, once, on first use, from the source the package ships, against the installed
torch and core library, and cached per (source, core library, torch version, compiler).
Loading it into a process where ``import qrnn`` already registered the operators registers
nothing.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch.torch_version import TorchVersion

from . import _C  # type: ignore[attr-defined, unused-ignore]  # compiled, no stub

__all__ = ["torch_library", "MINIMUM_TORCH", "MINIMUM_TORCH_TEXT", "TorchLibraryError"]

MINIMUM_TORCH = (2, 9)  # the first torch with the stable ABI's operator registration
MINIMUM_TORCH_TEXT = "2.9"
# Only the stable ABI of MINIMUM_TORCH is used, whichever torch compiles it.
_TARGET_VERSION = f"0x{MINIMUM_TORCH[0]:02x}{MINIMUM_TORCH[1]:02x}000000000000"
_LIBRARY_NAME = "libqrnn_torch.so"


class TorchLibraryError(RuntimeError):
    """libqrnn_torch cannot be built here (torch too old, no C++ compiler, or it failed)."""


def _package_dir() -> Path:
    return Path(_C.__file__).parent  # where the wheel's lib/, include/ and src/ are


def _cache_root() -> Path:
    if os.environ.get("QRNN_CACHE_DIR"):
        return Path(os.environ["QRNN_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch-qrnn"


def _compile_command(source: Path, output: Path, compiler: str) -> list[str]:
    package = _package_dir()
    torch_dir = Path(torch.__file__).parent
    # With a CUDA core library the CUDA kernels are registered too (no CUDA headers needed).
    cuda = ["-DQRNN_WITH_CUDA"] if _C.build_info()["cuda"] else []
    return [*shlex.split(compiler), "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden",
            f"-DTORCH_TARGET_VERSION={_TARGET_VERSION}", *cuda,
            f"-I{torch_dir / 'include'}", f"-I{package / 'include'}",
            str(source), f"-L{package / 'lib'}", "-lqrnn", f"-Wl,-rpath,{package / 'lib'}",
            # libtorch_cpu for its stable C functions only: Python loads torch's libraries
            # privately (RTLD_LOCAL), so they must be named; a C++ program's libtorch, loaded
            # first under the same name, serves them there.
            f"-L{torch_dir / 'lib'}", "-ltorch_cpu", f"-Wl,-rpath,{torch_dir / 'lib'}", "-ldl", "-o", str(output)]


def torch_library() -> str:
    """Path of libqrnn_torch.so for this torch, compiled on the first call (seconds) and cached.

    Link it into a C++ program that runs an exported qrnn model (CMake:
    ``find_package(qrnn COMPONENTS torch)``, target ``qrnn::torch``), or load it with
    ``torch.ops.load_library``. Needs torch >= 2.9 and a C++17 compiler (``$CXX``, else
    ``c++``). The cache folder is ``$QRNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/torch-qrnn``,
    else ``~/.cache/torch-qrnn``; one library per qrnn version, torch version, compiler and
    source, and concurrent first calls are safe.

    Returns:
        The absolute path of the library (a str).

    Raises:
        TorchLibraryError: (a RuntimeError) torch is older than 2.9, the installed source is
            missing, the compiler is not on PATH, or compiling failed (its errors included).
    """
    if TorchVersion(torch.__version__) < MINIMUM_TORCH_TEXT:
        raise TorchLibraryError(f"qrnn's C++ torch library needs torch >= {MINIMUM_TORCH_TEXT} "
                                f"(the stable C ABI for operators); this is torch {torch.__version__}")
    source = _package_dir() / "src" / "torch_ops.cpp"
    if not source.is_file():
        raise TorchLibraryError(f"this install of torch-qrnn has no {source.name} (installed files missing)")
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(shlex.split(compiler)[0]) is None:
        raise TorchLibraryError(f"building qrnn's C++ torch library needs a C++17 compiler: {compiler!r} is not on "
                                "PATH (set CXX)")
    key = hashlib.sha256("\0".join([source.read_text(), str((_package_dir() / "lib" / "libqrnn.so").resolve()),
                                    torch.__version__, compiler]).encode()).hexdigest()[:16]
    folder = _cache_root() / f"torch_library-{_C.build_info()['version']}-torch{torch.__version__}-{key}"
    library = folder / _LIBRARY_NAME
    if library.is_file():
        return str(library)
    folder.mkdir(parents=True, exist_ok=True)
    # Compiled beside its final name, then renamed: concurrent first calls never see half a file.
    fd, partial = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
    os.close(fd)
    try:
        proc = subprocess.run(_compile_command(source, Path(partial), compiler), capture_output=True, text=True)
        if proc.returncode != 0:
            raise TorchLibraryError(f"compiling qrnn's C++ torch library failed:\n{proc.stderr[-4000:]}")
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return str(library)
