"""torch-qrnn: Quasi-Recurrent Neural Networks for PyTorch.

``qrnn.forget_mult`` is the ForgetMult recurrence and ``qrnn.linear_scan`` the diagonal
linear recurrence h = a h + b, on CPU (and CUDA when built with it);
``qrnn.build_info()`` says what this build contains; ``qrnn.cmake_dir()`` and
``qrnn.include_dir()`` point C++ projects at the installed headers and CMake package;
``qrnn.torch_library()`` builds (once) and returns libqrnn_torch, the qrnn:: operators for
C++ programs that run an exported model.
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

__all__ = ["forget_mult", "build_info", "cmake_dir", "include_dir", "torch_library", "__version__",
           "QRNN", "QRNNLayer", "QRNNState", "qrnn_layer", "qrnn_gates", "linear_scan"]


def __getattr__(name: str):
    # qrnn.onnx imports onnxscript: loaded on first use, never by `import qrnn`.
    if name == "onnx":
        import importlib
        return importlib.import_module(".onnx", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_info() -> dict:
    """Version, compiler, SIMD level, and whether (and for which GPUs) CUDA was built."""
    return dict(_C.build_info())


def cmake_dir() -> str:
    """Folder holding qrnnConfig.cmake: pass it as ``qrnn_DIR`` to ``find_package(qrnn)``."""
    return str(_Path(__file__).parent / "lib" / "cmake" / "qrnn")


def include_dir() -> str:
    """Folder holding the public C++ headers (``#include <qrnn/forget_mult.hpp>``)."""
    return str(_Path(__file__).parent / "include")
