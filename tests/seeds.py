"""Fresh random inputs for every test, and a failure that can be replayed: each test runs
under a new seed (torch, Python's random, NumPy), a failing test prints its seed and the
command that reruns it, and ``--seed N`` (or ``QRNN_TEST_SEED=N``) runs under that seed.
Loaded by tests/conftest.py."""

import os
import random

import numpy as np
import pytest
import torch

ENVIRONMENT = "QRNN_TEST_SEED"


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=None, metavar="N",
                     help=f"run every test under this random seed (also {ENVIRONMENT}=N): the seed a failing "
                          "test printed reproduces it")


def chosen_seed(config):
    """The seed of this run, or None for a fresh one per test."""
    seed = config.getoption("--seed")
    if seed is None and os.environ.get(ENVIRONMENT, "").strip():
        seed = int(os.environ[ENVIRONMENT])
    return seed


@pytest.fixture(autouse=True)
def _fresh_seed(request):
    """Fresh random inputs each run (never a fixed seed) unless --seed names one."""
    seed = chosen_seed(request.config)
    if seed is None:
        seed = torch.seed() % (2**31)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seed = dict(item.user_properties).get("seed")
    if report.failed and seed is not None:
        report.sections.append(("random seed", f"seed {seed}: rerun with pytest --seed {seed} '{item.nodeid}' "
                                               f"(or {ENVIRONMENT}={seed})"))
