"""qrnn.checkpoint.lightning's import rules, with or without Lightning installed."""

import subprocess
import sys


def test_import_qrnn_never_imports_lightning():
    code = "import sys, qrnn, qrnn.checkpoint; print(sorted(m for m in sys.modules if 'lightning' in m))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_without_lightning_the_import_error_says_what_to_install():
    code = ("import sys; sys.modules['lightning'] = None; sys.modules['pytorch_lightning'] = None\n"
            "try:\n    import qrnn.checkpoint.lightning\nexcept ImportError as e:\n    print(e)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "needs PyTorch Lightning: pip install lightning" in result.stdout
