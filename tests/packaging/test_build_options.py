"""QRNN_CUDA=AUTO, the default of `pip install .`, compiles the CUDA kernels only where they
can run: nvcc found AND an NVIDIA GPU visible. A machine without a GPU takes the CPU path
on its own (minutes of nvcc saved), and says so. CMake is configured here, nothing built."""

import glob
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CMAKE = shutil.which("cmake")
pytestmark = pytest.mark.skipif(CMAKE is None or sys.platform != "linux", reason="needs cmake, on Linux")


def configure(build: Path, *defines: str) -> str:
    proc = subprocess.run([CMAKE, "-S", str(REPO), "-B", str(build), "-DQRNN_BUILD_PYTHON=OFF", *defines],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _gpu_visible() -> bool:
    if glob.glob("/dev/nvidia[0-9]*"):
        return True
    smi = shutil.which("nvidia-smi")
    return bool(smi) and subprocess.run([smi, "-L"], capture_output=True).returncode == 0


@pytest.mark.skipif(_gpu_visible(), reason="this machine has a GPU")
def test_auto_without_a_gpu_builds_cpu_kernels_only(tmp_path):
    out = configure(tmp_path, "-DQRNN_CUDA=AUTO", "-DQRNN_NVIDIA_SMI=/bin/false")
    assert "no NVIDIA GPU on this machine" in out and "QRNN_CUDA=ON compiles them anyway" in out
    assert "CPU kernels only" in out and "compiling the CUDA kernels" not in out


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="a GPU device node decides before nvidia-smi")
def test_auto_with_nvcc_and_a_gpu_compiles_cuda(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-0)"\n')
    smi.chmod(0o755)
    out = configure(tmp_path / "build", "-DQRNN_CUDA=AUTO", f"-DQRNN_NVIDIA_SMI={smi}")
    assert "compiling the CUDA kernels" in out


def test_off_never_compiles_cuda(tmp_path):
    out = configure(tmp_path, "-DQRNN_CUDA=OFF")
    assert "CPU kernels only (QRNN_CUDA=OFF" in out
