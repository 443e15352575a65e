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


def test_installed_package_holds_one_copy_of_the_library():
    """Wheels cannot hold symlinks: a versioned soname would ship the library three times."""
    lib = Path(qrnn.cmake_dir()).parents[1]
    copies = sorted(p.name for p in lib.iterdir() if p.name.startswith("libqrnn"))
    assert len(copies) == 1, copies
