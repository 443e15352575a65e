"""The layout of qrnn.ops: imports run one way (the op families import the backends and the
shared helpers, never the reverse)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

import qrnn
from qrnn import ops

OPS = Path(ops.__file__).parent
FAMILIES = {"qrnn.ops", "qrnn.ops.forget_mult", "qrnn.ops.qrnn_gates", "qrnn.ops._testing"}
BELOW_FAMILIES = ["cpu", "cuda", "fallback", "checks", "kernel_args", "_outputs", "_dispatch", "sharding"]


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


def test_package_front_names_are_the_ops():
    assert qrnn.forget_mult is ops.forget_mult and qrnn.qrnn_gates is ops.qrnn_gates
