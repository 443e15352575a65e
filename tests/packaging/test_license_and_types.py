"""The package ships its license and its type information: LICENSE in the wheel's metadata,
py.typed beside the code, and a type checker that sees a QRNN call's result as tensors."""

import importlib.metadata
import importlib.resources
import importlib.util
import inspect
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

import qrnn


def test_license_is_bsd_3_clause_in_the_distribution():
    dist = importlib.metadata.distribution("torch-qrnn")
    licenses = [f for f in dist.files or [] if f.name == "LICENSE"]
    assert licenses, "the installed distribution carries no LICENSE file"
    assert licenses[0].read_text().startswith("BSD 3-Clause License")
    assert "BSD-3-Clause" in (dist.metadata["License"] or "")


def test_py_typed_is_shipped():
    assert (importlib.resources.files("qrnn") / "py.typed").is_file()


@pytest.mark.skipif(sys.version_info < (3, 10), reason="mypy (a test extra) needs Python >= 3.10")
def test_type_checker_sees_qrnn_calls_as_tensors(tmp_path):
    if shutil.which("mypy") is None and importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed")
    (tmp_path / "user.py").write_text(textwrap.dedent("""
        import torch
        import qrnn

        rnn = qrnn.QRNN(4, 8, num_layers=2)
        output, h_n = rnn(torch.randn(3, 2, 4))
        reveal_type(output)
        reveal_type(h_n)
        reveal_type(qrnn.QRNNLayer(4, 8)(torch.randn(3, 2, 4)))
        reveal_type(qrnn.forget_mult(torch.rand(3, 2, 4), torch.rand(3, 2, 4)))
    """))
    env = dict(os.environ)
    package_dir = pathlib.Path(qrnn.__file__).parent
    if "site-packages" not in package_dir.parts:
        # An editable install reaches the source through an import hook mypy cannot follow.
        env["MYPYPATH"] = str(package_dir.parent)
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent",
                             "user.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    revealed = [line.split("Revealed type is ", 1)[1] for line in result.stdout.splitlines()
                if "Revealed type is" in line]
    assert len(revealed) == 4, result.stdout + result.stderr
    assert revealed[0] == revealed[1] == revealed[3] == '"torch._tensor.Tensor"', result.stdout
    assert "Tensor" in revealed[2] and "Any" not in revealed[2], result.stdout


def test_public_signatures_show_real_defaults():
    """help() and inspect show the defaults, not a sentinel object."""
    import torchqrnn

    text = str(inspect.signature(qrnn.QRNNLayer)) + str(inspect.signature(torchqrnn.QRNNLayer))
    assert "object at 0x" not in text
    for shown in ("window: 'int' = 1", "output_gate: 'bool' = True", "zoneout: 'float' = 0.0",
                  "save_prev_x: 'bool' = False"):
        assert shown in text, text
    # A default that is shown is still told apart from the same value passed by position.
    with pytest.raises(TypeError, match="multiple values for argument 'window'"):
        qrnn.QRNNLayer(4, 8, 1, window=1)
