"""The layout of qrnn.ops: one package per op family (``op``, ``kernels``, ``checks``, ``onnx``,
``reference``), and ``core`` with what they share; imports run one way (a family imports the
core, the core never imports a family)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

import qrnn
from qrnn import ops

OPS = Path(ops.__file__).parent
FAMILY_MODULES = ("__init__", "op", "kernels", "checks", "reference", "onnx", "sharding")


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


@pytest.mark.parametrize("module", sorted(p.stem for p in (OPS / "core").glob("*.py")))
def test_core_never_imports_a_family(module):
    imported = _imports(OPS / "core" / f"{module}.py", "qrnn.ops.core")
    families = {name for name in imported for family in ops.FAMILIES if name.startswith(f"qrnn.ops.{family}")}
    assert not families and "qrnn.ops" not in imported, f"qrnn.ops.core.{module} imports {sorted(families)}"


@pytest.mark.parametrize("family", ops.FAMILIES)
def test_every_family_has_the_same_modules(family):
    """A newcomer adds a family by copying one family's folder: each holds the same modules."""
    present = {p.stem for p in (OPS / family).glob("*.py")}
    assert present == set(FAMILY_MODULES), f"qrnn.ops.{family}: {sorted(present)}"


def test_package_front_names_are_the_ops():
    assert qrnn.forget_mult is ops.forget_mult and qrnn.qrnn_gates is ops.qrnn_gates
    assert qrnn.linear_scan is ops.linear_scan
