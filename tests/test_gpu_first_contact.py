"""What the first run on a GPU depends on, checked on the CPU: the CUDA glue only names
things that exist, tools/gpu_check.sh reports every part even when some fail, and the
launchers' driver check explains itself."""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest

from qrnn import _C, ops, ops_cuda

REPO = Path(__file__).resolve().parents[1]


def _attributes_of(module_path: Path, name: str) -> set[str]:
    tree = ast.parse(module_path.read_text())
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == name}


def test_cuda_glue_names_exist():
    """ops_cuda's GPU-only code paths never run without a GPU, so a misspelt ops.* or
    _C.* name would first show as an AttributeError on the GPU."""
    path = REPO / "python" / "qrnn" / "ops_cuda.py"
    missing = sorted(a for a in _attributes_of(path, "ops") if not hasattr(ops, a))
    assert not missing, f"ops_cuda.py uses ops.{missing}, which qrnn.ops does not define"
    if ops_cuda.AVAILABLE:
        missing = sorted(a for a in _attributes_of(path, "_C") if not hasattr(_C, a))
        assert not missing, f"ops_cuda.py uses _C.{missing}, which this CUDA build does not define"
