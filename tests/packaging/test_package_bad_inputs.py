"""Bad-input sweep of the package-level entry points: build information, the command lines,
and calls that could take the interpreter down (fork, threads, absurd sizes), run in a
subprocess with a timeout so that a crash fails one test instead of the whole run.
"""

from pathlib import Path

import pytest

import qrnn
from conftest import run_python

# ---- other public functions ----------------------------------------------------------------

def test_build_info_and_dirs():
    info = qrnn.build_info()
    assert {"version", "compiler", "build_type", "simd", "cuda", "cuda_architectures"} <= set(info)
    info["version"] = "changed"  # a copy: callers cannot corrupt it
    assert qrnn.build_info()["version"] == qrnn.__version__
    assert (Path(qrnn.cmake_dir()) / "qrnnConfig.cmake").is_file()
    assert (Path(qrnn.include_dir()) / "qrnn" / "forget_mult.hpp").is_file()


@pytest.mark.parametrize("fn", [qrnn.build_info, qrnn.cmake_dir, qrnn.include_dir], ids=lambda f: f.__name__)
def test_no_argument_functions_reject_arguments(fn):
    with pytest.raises(TypeError):
        fn(1)
    with pytest.raises(TypeError):
        fn(bogus=True)


# ---- in a subprocess: command lines, fork, threads, absurd sizes ----------------------------

@pytest.mark.parametrize("args", [["-m", "qrnn", "--bogus"], ["-m", "qrnn.bench", "no-such-area"],
                                  ["-m", "qrnn.bench", "--quick", "--no-such-flag"]], ids=" ".join)
def test_command_lines_reject_bad_arguments(args):
    proc = run_python(None, *args)
    assert proc.returncode == 2, proc.stderr  # argparse's usage error, no traceback
    assert "Traceback" not in proc.stderr


def test_empty_sequence_over_huge_batch_and_hidden_returns():
    """(0, 2^31, 2^31) has no elements; forward and backward must not walk 2^62 of them."""
    proc = run_python("""
        import torch, qrnn
        f = torch.empty(0, 2**31, 2**31, requires_grad=True)
        h = qrnn.forget_mult(f, f.detach())
        h.sum().backward()
        print("ok", tuple(f.grad.shape))
    """, timeout=60)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_fork_after_threads_and_threads_from_python():
    """The kernel thread pool survives a fork (DataLoader workers) and concurrent Python threads.

    The comparison uses numpy: torch's own OpenMP pool is not fork-safe, so the child runs
    no multi-threaded torch op (only qrnn's kernel, on its own pool, with 4 threads)."""
    proc = run_python("""
        import os, threading, numpy as np, torch, qrnn
        from qrnn.ops.forget_mult.reference import forget_mult_reference
        torch.set_num_threads(4)
        f, x = torch.rand(64, 8, 1100), torch.randn(64, 8, 1100)
        ref = forget_mult_reference(f.double(), x.double()).numpy()
        def check():
            assert np.allclose(qrnn.forget_mult(f, x).numpy(), ref, atol=2e-5, rtol=2e-5)
        check()  # the pool's threads now exist in the parent
        pid = os.fork()
        if pid == 0:
            try:
                check()
                os._exit(0)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        errors = []
        def worker():
            try:
                for _ in range(3):
                    check()
            except BaseException as e:
                errors.append(e)
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        print("ok")
    """, timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
