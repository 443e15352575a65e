"""numpy is the 'train' extra's dependency only: the library (ops, layers, checkpoints) works in
a Python where numpy cannot be imported, as after `pip install torch-qrnn` without extras."""

import subprocess
import sys
import textwrap


def test_library_runs_without_numpy(tmp_path):
    script = textwrap.dedent(f"""
        import sys, warnings
        sys.modules["numpy"] = None  # `import numpy` raises ImportError from here on
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch's own
        import torch, qrnn
        model = qrnn.QRNN(4, 8, num_layers=2)
        out, hidden = model(torch.randn(5, 3, 4))
        out.sum().backward()
        h = qrnn.linear_scan(torch.rand(5, 3, 8), torch.randn(5, 3, 8), cu_seqlens=None)
        qrnn.checkpoint.async_save(model.state_dict(), {str(tmp_path / 'model.pt')!r})
        qrnn.checkpoint.wait_all()
        state = qrnn.checkpoint.load({str(tmp_path / 'model.pt')!r})
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
        print("numpy loaded:", "numpy" in sys.modules and sys.modules["numpy"] is not None)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "numpy loaded: False"
