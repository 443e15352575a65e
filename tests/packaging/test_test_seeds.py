"""The suite's own rule for random inputs (tests/seeds.py): a failing test prints its seed,
and --seed N or QRNN_TEST_SEED=N reruns it with the same inputs."""

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

FAILING = '''
import torch

def test_draws():
    value = torch.rand(1).item()
    print(f"drew {value!r}")
    assert value > 2
'''


def _run(folder, *args, env=None):
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", *args,
                             str(folder / "test_draws.py")], capture_output=True, text=True, timeout=300,
                            cwd=folder, env=dict(os.environ, PYTHONPATH=str(TESTS), **(env or {})))
    assert result.returncode == 1, result.stdout + result.stderr  # the test failed, as written
    drew = re.search(r"drew ([0-9.e-]+)", result.stdout).group(1)
    return drew, result.stdout


def test_a_failure_prints_the_seed_that_reproduces_it(tmp_path):
    (tmp_path / "conftest.py").write_text("from seeds import _fresh_seed, pytest_addoption, "
                                          "pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_draws.py").write_text(FAILING)
    drew, out = _run(tmp_path)
    seed = re.search(r"rerun with pytest --seed (\d+) 'test_draws.py::test_draws'", out)
    assert seed, out
    assert _run(tmp_path, "--seed", seed.group(1))[0] == drew
    assert _run(tmp_path, env={"QRNN_TEST_SEED": seed.group(1)})[0] == drew
    assert _run(tmp_path)[0] != drew  # without a seed, fresh inputs each run
