"""The layout of qrnn.ops: imports run one way (the op families import the backends and the
shared helpers, never the reverse), and the former module names keep working."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

import qrnn
import qrnn.kernel_args
import qrnn.ops_cuda
from qrnn import ops
from qrnn.ops import cuda as cuda_backend
from qrnn.ops import kernel_args

OPS = Path(ops.__file__).parent
FAMILIES = {"qrnn.ops", "qrnn.ops.forget_mult", "qrnn.ops.qrnn_gates", "qrnn.ops._testing"}
BELOW_FAMILIES = ["cpu", "cuda", "fallback", "checks", "kernel_args", "_outputs", "_dispatch"]


def _imports(path: Path, package: str) -> set[str]:
    """Absolute names of the modules `path` imports (a from-import of a submodule counts as it)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module
            names.add(base)
            if base.startswith("qrnn") and hasattr(importlib.import_module(base), "__path__"):  # a package
                names.update(f"{base}.{alias.name}" for alias in node.names
                             if importlib.util.find_spec(f"{base}.{alias.name}") is not None)
    return names


@pytest.mark.parametrize("module", BELOW_FAMILIES)
def test_backends_and_helpers_never_import_a_family(module):
    imported = _imports(OPS / f"{module}.py", "qrnn.ops")
    assert not imported & FAMILIES, f"qrnn.ops.{module} imports {sorted(imported & FAMILIES)}"


def test_former_names_are_the_same_objects():
    for name in qrnn.ops_cuda.__all__:
        assert getattr(qrnn.ops_cuda, name) is getattr(cuda_backend, name), name
    for name in qrnn.kernel_args.__all__:
        assert getattr(qrnn.kernel_args, name) is getattr(kernel_args, name), name
    assert ops.FORWARD_KERNELS is ops.FORGET_MULT_FORWARD_KERNELS
    assert ops.BACKWARD_KERNELS is ops.FORGET_MULT_BACKWARD_KERNELS
    assert qrnn.forget_mult is ops.forget_mult and qrnn.qrnn_gates is ops.qrnn_gates
