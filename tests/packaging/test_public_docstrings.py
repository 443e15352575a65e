"""Every public name is documented where the API reference is generated from: its docstring.

The reference (mkdocstrings) renders each name in the ``__all__`` of the public modules
below. For each such name:

- a function, class or other callable has a non-empty docstring of its own (not one
  inherited from its type, as a ``torch.library.custom_op`` object would show), and every
  named parameter (of the function, or of the class's ``__init__``) appears in it as a word,
  except ``self``, ``*args``/``**kwargs`` and names starting with ``_``; a dataclass field
  counts as documented when its metadata carries a ``help`` text (``qrnn.train.Settings``);
- a class's own public methods and properties have docstrings too;
- a value (``__version__``, ``FAMILIES``, ``registered``) is assigned at the top level of
  its module and followed by a string literal, the attribute docstring the reference shows.

And the allowlist ``import qrnn`` and ``import torchqrnn`` add for
``torch.load(weights_only=True)`` is listed, name by name, in their module docstrings.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
import textwrap

import pytest

MODULES = ["qrnn", "qrnn.ops", "qrnn.checkpoint", "qrnn.train", "qrnn.onnx", "torchqrnn"]


def _module(name: str):
    if name == "qrnn.onnx":
        pytest.importorskip("onnxscript", reason="qrnn.onnx needs onnxscript")
    return importlib.import_module(name)


def _own_doc(obj) -> str:
    """The docstring ``obj`` itself carries (a class's own, not its base's; an instance's
    only if it differs from its type's)."""
    if inspect.isclass(obj):
        return vars(obj).get("__doc__") or ""
    doc = getattr(obj, "__doc__", None) or ""
    if not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.ismethod(obj)) and doc == type(obj).__doc__:
        return ""
    return doc


def _parameters(obj) -> list[str]:
    """The named parameters a docstring must mention."""
    target = obj
    if inspect.isclass(obj):
        if "__init__" not in vars(obj):
            if not dataclasses.is_dataclass(obj):
                return []
        else:
            target = obj.__init__
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    documented_fields = set()
    if dataclasses.is_dataclass(obj):
        documented_fields = {f.name for f in dataclasses.fields(obj) if f.metadata.get("help")}
    return [name for name, p in signature.parameters.items()
            if name != "self" and not name.startswith("_") and name not in documented_fields
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _attribute_docstrings(module) -> dict[str, str]:
    """{name: docstring} of the module's top-level assignments followed by a string literal."""
    tree = ast.parse(inspect.getsource(module))
    found: dict[str, str] = {}
    for statement, following in zip(tree.body, tree.body[1:]):
        targets = statement.targets if isinstance(statement, ast.Assign) else (
            [statement.target] if isinstance(statement, ast.AnnAssign) else [])
        if (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = following.value.value
    return found


def _is_routine(value) -> bool:
    return inspect.isfunction(value) or isinstance(value, (property, staticmethod, classmethod))


def _routine_doc(value) -> str:
    return inspect.getdoc(value.fget if isinstance(value, property) else value) or ""


def _public_names():
    for module_name in MODULES:
        yield from ((module_name, name) for name in _exported(module_name))


def _exported(module_name: str) -> list[str]:
    # Collected without importing qrnn.onnx's onnxscript: read its __all__ from the source.
    spec = importlib.util.find_spec(module_name)
    assert spec is not None and spec.origin is not None, module_name
    with open(spec.origin) as fh:
        tree = ast.parse(fh.read())
    for statement in tree.body:
        if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                     for t in statement.targets):
            return list(ast.literal_eval(statement.value))
    raise AssertionError(f"{module_name} defines no __all__")


@pytest.mark.parametrize("module_name, name", list(_public_names()), ids=lambda v: v)
def test_public_name_is_documented(module_name, name):
    module = _module(module_name)
    obj = getattr(module, name)
    where = f"{module_name}.{name}"
    if inspect.isclass(obj) or callable(obj):
        doc = _own_doc(obj)
        assert doc.strip(), f"{where} has no docstring of its own"
        missing = [p for p in _parameters(obj) if not re.search(rf"\b{re.escape(p)}\b", doc)]
        assert not missing, f"{where}'s docstring does not mention its parameters {missing}"
        if inspect.isclass(obj):
            undocumented = [attr for attr, value in vars(obj).items()
                            if not attr.startswith("_") and _is_routine(value) and not _routine_doc(value).strip()]
            assert not undocumented, f"{where} has public methods without docstrings: {undocumented}"
    else:
        docs = _attribute_docstrings(module)
        assert docs.get(name, "").strip(), (
            f"{where} is a value without an attribute docstring (a string literal right after its "
            f"assignment in {module.__file__})")


ALLOWLIST_PROBE = textwrap.dedent("""
    import json, sys, torch
    before = {id(g) for g in torch.serialization.get_safe_globals()}
    import {module}
    added = [g for g in torch.serialization.get_safe_globals() if id(g) not in before]
    names = []
    for g in added:
        g = g[0] if isinstance(g, tuple) else g
        names.append([g.__module__, g.__qualname__])
    print(json.dumps(names))
""")


def _public_path(module: str, qualname: str) -> str:
    """How a docstring names a safe global: by the public path a user writes."""
    if module == "builtins":
        return qualname
    if module.startswith("torch.nn."):
        return f"torch.nn.{qualname}"
    if module == "qrnn.pytorch_qrnn":
        return f"torchqrnn.{qualname}"
    if module.startswith("qrnn."):
        return f"qrnn.{qualname}"
    return f"{module}.{qualname}"


@pytest.mark.parametrize("module_name", ["qrnn", "torchqrnn"])
def test_the_weights_only_allowlist_is_listed_in_the_module_docstring(module_name):
    import json

    import torch

    if not hasattr(torch.serialization, "get_safe_globals"):
        pytest.skip("this torch cannot list its safe globals")
    probe = subprocess.run([sys.executable, "-c", ALLOWLIST_PROBE.replace("{module}", module_name)],
                           capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    added = [_public_path(*pair) for pair in json.loads(probe.stdout.strip().splitlines()[-1])]
    assert added, f"import {module_name} adds no safe globals"
    doc = importlib.import_module(module_name).__doc__ or ""
    unlisted = [name for name in added if f"``{name}``" not in doc]
    assert not unlisted, f"import {module_name} adds {unlisted} to torch's safe globals; its docstring does not say so"
