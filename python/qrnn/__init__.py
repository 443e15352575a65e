"""torch-qrnn: Quasi-Recurrent Neural Networks for PyTorch.

``qrnn.forget_mult`` is the ForgetMult recurrence and ``qrnn.linear_scan`` the diagonal
linear recurrence h = a h + b, on CPU (and CUDA when built with it);
``qrnn.build_info()`` says what this build contains; ``qrnn.cmake_dir()`` and
``qrnn.include_dir()`` point C++ projects at the installed headers and CMake package;
``qrnn.torch_library()`` builds (once) and returns libqrnn_torch, the qrnn:: operators for
C++ programs that run an exported model.

Importing ``qrnn`` adds these classes to ``torch.serialization``'s safe globals, so that
``torch.load(..., weights_only=True)`` rebuilds whole pickled models holding qrnn layers:
``qrnn.QRNN``, ``qrnn.QRNNLayer``, ``qrnn.QRNNState``, ``torch.nn.ModuleList``,
``torch.nn.Linear`` and the builtin ``set`` (every ``nn.Module`` pickles one, and torch
before 2.5 does not allow it by default). Importing ``torchqrnn`` adds its own three
classes (see :mod:`torchqrnn`).
"""

from pathlib import Path as _Path

from . import _C  # type: ignore[attr-defined]  # compiled extension, no stub: mypy looks for an attribute
from . import checkpoint as checkpoint  # qrnn.checkpoint: non-blocking, crash-safe saves
from .cpp_library import torch_library
from .functional import qrnn_layer
from .modules import QRNN, QRNNLayer, QRNNState
from .ops.forget_mult import forget_mult
from .ops.linear_scan import linear_scan
from .ops.qrnn_gates import qrnn_gates

__version__ = _C.build_info()["version"]
"""The package version, as the compiled core reports it (written once: ``project(qrnn VERSION ...)`` in
CMakeLists.txt, which the build and the wheel's metadata both read)."""

__all__ = ["forget_mult", "build_info", "cmake_dir", "include_dir", "torch_library", "__version__",
           "QRNN", "QRNNLayer", "QRNNState", "qrnn_layer", "qrnn_gates", "linear_scan"]


def __getattr__(name: str):
    # qrnn.onnx imports onnxscript: loaded on first use, never by `import qrnn`.
    if name == "onnx":
        import importlib
        return importlib.import_module(".onnx", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_info() -> dict:
    """What this build of qrnn contains.

    Returns:
        A new dict (changing it changes nothing) with the keys ``version`` (str),
        ``compiler`` (the C++ compiler and its version), ``build_type`` (CMake's, e.g.
        ``"Release"``), ``simd`` (the CPU kernels' instruction-set level chosen for this
        CPU: ``"generic"``, ``"avx2"``, ``"avx512"``, ``"avx512_bf16"`` or ``"neon"``), ``cuda``
        (bool: whether the CUDA kernels were built) and ``cuda_architectures`` (CMake's
        ``CUDA_ARCHITECTURES`` list of the build, ``""`` without CUDA) and ``simd_rows``
        (a dict: per op family, ``"forget_mult"``, ``"qrnn_gates"``, ``"linear_scan"``, what
        its contiguous rows run on at that level: ``"avx512"``, ``"avx2"``, ``"neon"`` or
        ``"generic"``).
    """
    return dict(_C.build_info())


def cmake_dir() -> str:
    """The installed CMake package of the C++ core library.

    Returns:
        The folder holding ``qrnnConfig.cmake`` (a str): pass it as ``qrnn_DIR`` (or in
        ``CMAKE_PREFIX_PATH``) to ``find_package(qrnn)``, which defines ``qrnn::qrnn``.
    """
    return str(_Path(__file__).parent / "lib" / "cmake" / "qrnn")


def include_dir() -> str:
    """The installed public C++ headers of the core library.

    Returns:
        The include folder (a str) under which ``#include <qrnn/forget_mult.hpp>`` resolves.
    """
    return str(_Path(__file__).parent / "include")
