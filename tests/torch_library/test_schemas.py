"""The qrnn:: op schemas are written once, in the families' C++ manifests (QRNN_FAMILY_SCHEMAS
in qrnn/families.hpp, exported by qrnn._C.op_schemas()): the ops Python defines, the ops the
C++ operator library (libqrnn_torch) registers and the documentation site's list (generated
from the manifest when the site is built, docs/hooks.py) all show those very strings."""

import json

import pytest
import torch

import qrnn
from conftest import run_python, site_page
from qrnn import _C, cpp_library

SCHEMAS = _C.op_schemas()  # {name: "name(args) -> returns"}
FORWARD = sorted(name for name in SCHEMAS if not name.endswith("_backward"))


def registered_qrnn_ops() -> list:
    return sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("qrnn::"))


def test_the_manifest_holds_every_family():
    assert FORWARD == ["forget_mult", "linear_scan", "qrnn_gates"]
    assert sorted(SCHEMAS) == sorted(FORWARD + [f"{name}_backward" for name in FORWARD])
    for name, schema in SCHEMAS.items():
        assert schema.startswith(name + "("), schema


def test_python_defines_exactly_the_manifest_ops():
    assert registered_qrnn_ops() == sorted(SCHEMAS)  # no qrnn:: op defined from another string


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_python_registers_the_manifest_schema(name):
    assert str(getattr(torch.ops.qrnn, name).default._schema) == "qrnn::" + SCHEMAS[name]


def test_the_cpp_library_registers_the_manifest_schemas(torch_library_cache):
    """The forward ops only (inference graphs hold no others), in a process without `import
    qrnn`: Python and the library cannot both own the ops in one process."""
    try:
        path = qrnn.torch_library()
    except cpp_library.TorchLibraryError as e:  # torch < 2.9, or no C++ compiler
        pytest.skip(str(e))
    proc = run_python(f"""
        import json, sys, torch
        torch.ops.load_library({path!r})
        assert "qrnn" not in sys.modules
        names = sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("qrnn::"))
        print(json.dumps({{name: str(getattr(torch.ops.qrnn, name).default._schema) for name in names}}))
    """)
    assert proc.returncode == 0, proc.stderr
    registered = json.loads(proc.stdout.strip().splitlines()[-1])
    assert registered == {name: "qrnn::" + SCHEMAS[name] for name in FORWARD}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_documentation_shows_each_schema(name):
    assert f"`qrnn::{SCHEMAS[name]}`" in site_page("guide/kernels.md"), f"the site lacks qrnn::{SCHEMAS[name]}"
