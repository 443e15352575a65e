"""A separate CMake project finds the installed qrnn package, links qrnn::qrnn and runs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import qrnn

CONSUMER = Path(__file__).parent / "cpp_consumer"


def _cmake():
    exe = shutil.which("cmake")
    if exe is None:
        pytest.skip("cmake is not installed (pip install cmake)")
    return exe


@pytest.fixture(scope="module")
def consumer_build(tmp_path_factory):
    build = tmp_path_factory.mktemp("consumer")
    cmake = _cmake()
    cmake_dir = subprocess.run([sys.executable, "-m", "qrnn", "--cmake-dir"], check=True,
                               capture_output=True, text=True).stdout.strip()
    assert cmake_dir == qrnn.cmake_dir() and Path(cmake_dir, "qrnnConfig.cmake").is_file()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run([cmake, "-S", str(CONSUMER), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                    f"-Dqrnn_DIR={cmake_dir}"], check=True, capture_output=True, text=True)
    proc = subprocess.run([cmake, "--build", str(build)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build


def test_include_dir_has_headers():
    assert Path(qrnn.include_dir(), "qrnn", "forget_mult.hpp").is_file()


def test_forget_mult_consumer(consumer_build):
    exe = consumer_build / "forget_mult_consumer"
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "forget_mult consumer ok" in proc.stdout
