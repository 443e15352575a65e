"""A separate CMake project finds the installed qrnn package, links qrnn::qrnn and runs."""

import os
import subprocess
from pathlib import Path

import qrnn


def test_include_dir_has_headers():
    assert Path(qrnn.include_dir(), "qrnn", "forget_mult.hpp").is_file()


def test_forget_mult_consumer(consumer_build):
    exe = consumer_build / "forget_mult_consumer"
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "forget_mult consumer ok" in proc.stdout
