"""Bad-input sweep: every public entry point called with wrong types, shapes, dtypes,
devices, layouts, NaN/Inf values and empty tensors. Each call must raise a TypeError or
ValueError naming the argument, or propagate the values correctly; never crash or hang.

Calls that could take the interpreter down (fork, threads, huge sizes) run in a
subprocess with a timeout, so a crash fails one test instead of the whole run.
"""

import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import qrnn
from conftest import reference_grads
from qrnn.reference import forget_mult_reference

T, B, H = 4, 3, 5

NON_TENSORS = [None, 1, 1.5, "f", [1.0, 2.0], np.ones((T, B, H), dtype=np.float32), object()]
BAD_DTYPES = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
              torch.complex64, torch.complex128]
if hasattr(torch, "float8_e4m3fn"):
    BAD_DTYPES.append(torch.float8_e4m3fn)


def gates(shape=(T, B, H), dtype=torch.float32):
    return torch.rand(shape, dtype=torch.float64).to(dtype)


def values(shape=(T, B, H), dtype=torch.float32):
    return torch.randn(shape, dtype=torch.float64).to(dtype)


def tensor_of(dtype, shape=(T, B, H)):
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype)
    if dtype.is_floating_point:
        return torch.rand(shape).to(dtype)
    return torch.ones(shape, dtype=dtype)


# ---- wrong types ---------------------------------------------------------------------------

@pytest.mark.parametrize("bad", NON_TENSORS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("argument", ["f", "x"])
def test_forget_mult_non_tensor(argument, bad):
    args = {"f": gates(), "x": values()}
    args[argument] = bad
    with pytest.raises(TypeError, match=f"{argument} must be a torch.Tensor"):
        qrnn.forget_mult(args["f"], args["x"])


@pytest.mark.parametrize("bad", [1, 1.5, "h0", [0.0], np.zeros((B, H), dtype=np.float32)],
                         ids=lambda v: type(v).__name__)
def test_forget_mult_h0_non_tensor(bad):
    with pytest.raises(TypeError, match="h0 must be a torch.Tensor or None"):
        qrnn.forget_mult(gates(), values(), bad)


@pytest.mark.parametrize("bad", [None, 0, 1, "True", 1.0, torch.tensor(True)], ids=repr)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_forget_mult_batch_first_not_bool(bad, requires_grad):
    f = gates().requires_grad_(requires_grad)
    with pytest.raises(TypeError, match="batch_first must be a bool"):
        qrnn.forget_mult(f, values(), batch_first=bad)


def test_forget_mult_positional_batch_first_rejected():
    with pytest.raises(TypeError):
        qrnn.forget_mult(gates(), values(), None, True)


# ---- wrong dtypes --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", BAD_DTYPES, ids=str)
@pytest.mark.parametrize("path", ["direct", "autograd", "op"])
def test_forget_mult_bad_dtype(dtype, path):
    f, x = tensor_of(dtype), tensor_of(dtype)
    with pytest.raises(TypeError, match=str(dtype)):
        if path == "op":  # the registered op checks on its own, whoever calls it
            torch.ops.qrnn.forget_mult(f, x, None, False)
        elif path == "autograd":
            with torch.enable_grad():
                qrnn.forget_mult(f, gates().requires_grad_())
        else:
            qrnn.forget_mult(f, x)


@pytest.mark.parametrize("f_dtype, x_dtype", [(torch.float32, torch.float64), (torch.bfloat16, torch.float16),
                                              (torch.float16, torch.float32), (torch.float32, torch.int32)])
def test_forget_mult_mixed_dtypes(f_dtype, x_dtype):
    with pytest.raises(TypeError, match="x must have f's dtype"):
        qrnn.forget_mult(gates(dtype=f_dtype), tensor_of(x_dtype))


@pytest.mark.parametrize("f_dtype, h0_dtype", [
    (torch.float32, torch.float64), (torch.float32, torch.bfloat16), (torch.float64, torch.float32),
    (torch.bfloat16, torch.float16), (torch.float16, torch.float64), (torch.float32, torch.int64),
    (torch.float32, torch.bool), (torch.float32, torch.complex64)])
def test_forget_mult_h0_bad_dtype(f_dtype, h0_dtype):
    with pytest.raises(TypeError, match="h0 must have dtype"):
        qrnn.forget_mult(gates(dtype=f_dtype), values(dtype=f_dtype), tensor_of(h0_dtype, (B, H)))


# ---- wrong shapes --------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(), (5,), (4, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)], ids=str)
def test_forget_mult_not_3d(shape):
    with pytest.raises(ValueError, match="f must be 3-D"):
        qrnn.forget_mult(gates(shape), values(shape))


@pytest.mark.parametrize("x_shape", [(T + 1, B, H), (T, B + 1, H), (T, B, H - 1), (T, B), (1, B, H), (T, 1, H)],
                         ids=str)
@pytest.mark.parametrize("path", ["direct", "op"])
def test_forget_mult_x_shape_mismatch(x_shape, path):
    """Includes broadcastable shapes: x is never broadcast (and never read out of bounds)."""
    call = (lambda f, x: torch.ops.qrnn.forget_mult(f, x, None, False)) if path == "op" else qrnn.forget_mult
    with pytest.raises(ValueError, match="x must have f's shape"):
        call(gates(), values(x_shape))


@pytest.mark.parametrize("h0_shape", [(B,), (H,), (B, H, 1), (1, B, H), (H, B), (1, H), (B, 1), ()], ids=str)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("path", ["direct", "op"])
def test_forget_mult_h0_bad_shape(h0_shape, batch_first, path):
    shape = (B, T, H) if batch_first else (T, B, H)
    f, x, h0 = gates(shape), values(shape), values(h0_shape)
    with pytest.raises(ValueError, match="h0 must have shape"):
        if path == "op":
            torch.ops.qrnn.forget_mult(f, x, h0, batch_first)
        else:
            qrnn.forget_mult(f, x, h0, batch_first=batch_first)


@pytest.mark.parametrize("bad", ["grad_h_shape", "h_shape", "grad_h_dtype", "h_dtype"])
def test_forget_mult_backward_op_checks(bad):
    """The backward op, callable as torch.ops.qrnn.forget_mult_backward, checks its inputs
    (non-tensor arguments never reach it: the dispatcher's schema check rejects them)."""
    f, x = gates(), values()
    h, grad_h = values(), values()
    if bad == "grad_h_shape":
        grad_h, error = values((1, 1, 1)), ValueError
    elif bad == "h_shape":
        h, error = values((T, B, 1)), ValueError
    elif bad == "grad_h_dtype":
        grad_h, error = values(dtype=torch.float64), TypeError
    else:
        h, error = tensor_of(torch.int32), TypeError
    with pytest.raises(error, match=bad.rsplit("_", 1)[0]):
        torch.ops.qrnn.forget_mult_backward(grad_h, f, x, h, None, False)


# ---- devices and layouts ------------------------------------------------------------------

@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_forget_mult_meta_tensors_propagate_shape(requires_grad, with_h0):
    """Meta tensors (shape inference, deferred init) give a meta result of the right shape."""
    f = torch.empty(T, B, H, device="meta", requires_grad=requires_grad)
    x = torch.empty(T, B, H, device="meta")
    h0 = torch.empty(B, H, device="meta") if with_h0 else None
    h = qrnn.forget_mult(f, x, h0)
    assert h.device.type == "meta" and h.shape == (T, B, H) and h.dtype == torch.float32


@pytest.mark.parametrize("meta", ["x", "h0", "f"])
def test_forget_mult_mixed_devices(meta):
    args = {"f": gates(), "x": values(), "h0": values((B, H))}
    args[meta] = args[meta].to("meta")
    with pytest.raises(ValueError, match="must be on f's device"):
        qrnn.forget_mult(args["f"], args["x"], args["h0"])


@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "nested"])
@pytest.mark.parametrize("argument", ["f", "x", "h0"])
def test_forget_mult_non_dense(layout, argument):
    args = {"f": gates(), "x": values(), "h0": values((B, H))}
    t = args[argument]
    if layout == "sparse_coo":
        t = t.to_sparse()
    elif layout == "sparse_csr":
        t = t.to_sparse_csr()
    else:
        t = torch.nested.nested_tensor(list(t.unbind(0)))
    args[argument] = t
    with pytest.raises((TypeError, ValueError), match=argument):
        qrnn.forget_mult(args["f"], args["x"], args["h0"])


def test_forget_mult_negative_bit_view_is_read_as_its_values():
    """complex.conj().imag is a real view with the negative bit set: the kernel must see -v."""
    c = torch.randn(T, B, H, dtype=torch.complex128)
    x = c.conj().imag
    assert x.is_neg()
    f = gates(dtype=torch.float64)
    expected = forget_mult_reference(f, x.resolve_neg())
    torch.testing.assert_close(qrnn.forget_mult(f, x), expected)
    torch.testing.assert_close(qrnn.forget_mult(f, x, x[0]), forget_mult_reference(f, x.resolve_neg(),
                                                                                    x[0].resolve_neg()))


# ---- NaN and Inf ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("where", ["x", "f", "h0", "grad"])
def test_forget_mult_nan_inf_propagate(dtype, where):
    """Non-finite values flow through exactly as in the plain formula (same NaN positions)."""
    f, x, h0 = gates(dtype=dtype), values(dtype=dtype), values((B, H), dtype=dtype)
    grad = values(dtype=dtype)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=dtype)
    target = {"x": x, "f": f, "h0": h0, "grad": grad}[where]
    flat = target.view(-1)
    flat[:3] = specials
    if where == "f":
        flat[3:5] = torch.tensor([0.0, 1.0], dtype=dtype)  # f = 0 or 1 exactly: inf * 0 and friends
    for t in (f, x, h0):
        t.requires_grad_()
    h = qrnn.forget_mult(f, x, h0)
    h.backward(grad)
    f64, x64, h064 = f.detach().double(), x.detach().double(), h0.detach().double()
    ref_h = forget_mult_reference(f64, x64, h064)
    ref_df, ref_dx, ref_dh0 = reference_grads(grad, f, x, h, h0)
    if where != "grad":
        assert not torch.isfinite(h).all(), "the non-finite input vanished"
    for got, ref, name in ((h, ref_h, "h"), (f.grad, ref_df, "grad_f"), (x.grad, ref_dx, "grad_x"),
                           (h0.grad, ref_dh0, "grad_h0")):
        got = got.detach().double()
        # Same non-finite pattern (NaN where NaN, same-signed Inf where Inf) ...
        assert torch.equal(torch.isnan(got), torch.isnan(ref)), name
        assert torch.equal(got[torch.isinf(ref)], ref[torch.isinf(ref)]), name
        # ... and the finite elements close (16-bit inputs: same tolerance as everywhere).
        finite = torch.isfinite(ref)
        atol, rtol = {torch.float64: 1e-12, torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype], 2e-2
        torch.testing.assert_close(got[finite], ref[finite], atol=atol, rtol=rtol, msg=name)


# ---- empty tensors ------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, B, H), (T, 0, H), (T, B, 0), (0, 0, 0), (0, 1, 1)], ids=str)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_forget_mult_empty(shape, batch_first, dtype):
    f = gates(shape, dtype).requires_grad_()
    x = values(shape, dtype).requires_grad_()
    batch, hidden = (shape[0], shape[2]) if batch_first else (shape[1], shape[2])
    h0 = values((batch, hidden), dtype).requires_grad_()
    h = qrnn.forget_mult(f, x, h0, batch_first=batch_first)
    assert h.shape == shape and h.dtype == dtype
    h.sum().backward()
    assert f.grad.shape == shape and x.grad.shape == shape
    seq_len = shape[1] if batch_first else shape[0]
    if seq_len == 0:  # nothing reaches h: the gradient of h0 is exactly zero
        assert (h0.grad == 0).all()


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

def run_python(code, *args, timeout=120):
    """Run code (or `-m module` when args given) in a fresh interpreter; fail on a crash or hang."""
    cmd = [sys.executable] + (list(args) if args else ["-c", textwrap.dedent(code)])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for {timeout} s: {cmd}")
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr[-2000:]}"
    return proc


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
        from qrnn.reference import forget_mult_reference
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


# ---- qrnn.checkpoint -------------------------------------------------------------------------

from qrnn.checkpoint import AsyncCheckpointer, CheckpointError, CorruptCheckpointError  # noqa: E402
from qrnn.checkpoint import load as ckpt_load  # noqa: E402
from qrnn.checkpoint import verify as ckpt_verify  # noqa: E402


@pytest.mark.parametrize("kwargs, error, match", [
    ({"directory": 123}, TypeError, "PathLike"),
    ({"directory": None}, TypeError, "PathLike"),
    ({"keep_last": 0}, ValueError, "keep_last"),
    ({"keep_last": -2}, ValueError, "keep_last"),
    ({"keep_last": 1.5}, ValueError, "keep_last"),
    ({"keep_last": "3"}, ValueError, "keep_last"),
    ({"max_pending": 0}, ValueError, "max_pending"),
    ({"max_pending": "2"}, ValueError, "max_pending"),
    ({"copy_threads": 0}, ValueError, "copy_threads"),
    ({"copy_threads": 2.0}, ValueError, "copy_threads"),
    ({"prefix": ""}, ValueError, "prefix"),
    ({"prefix": "a/b"}, ValueError, "prefix"),
    ({"prefix": ".hidden"}, ValueError, "prefix"),
    ({"prefix": "a\0b"}, ValueError, "prefix"),
    ({"prefix": 5}, TypeError, "prefix"),
], ids=lambda v: repr(v)[:40])
def test_checkpointer_bad_arguments(tmp_path, kwargs, error, match):
    kwargs = {"directory": tmp_path, **kwargs}
    with pytest.raises(error, match=match):
        AsyncCheckpointer(**kwargs)


def test_checkpointer_directory_is_a_file(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(OSError):  # FileExistsError / NotADirectoryError: the OS says what is wrong
        AsyncCheckpointer(tmp_path / "file")


@pytest.mark.parametrize("step, error", [(-1, ValueError), (1.5, TypeError), ("1", TypeError), (None, TypeError),
                                         (torch.tensor(1.0), TypeError)], ids=repr)
def test_save_bad_step(tmp_path, step, error):
    with AsyncCheckpointer(tmp_path) as ckpt:
        with pytest.raises(error):
            ckpt.save({"a": torch.ones(2)}, step)
        assert ckpt.save({"a": torch.ones(2)}, 1).result()  # still usable


@pytest.mark.parametrize("overlap", [5, "adam", [torch.optim.SGD([torch.zeros(1, requires_grad=True)]), 3]],
                         ids=["int", "str", "list-with-int"])
def test_save_bad_overlap_with(tmp_path, overlap):
    with AsyncCheckpointer(tmp_path) as ckpt:
        with pytest.raises(TypeError):
            ckpt.save({"a": torch.ones(2)}, 1, overlap_with=overlap)


def test_save_unpicklable_state_leaves_checkpointer_usable(tmp_path):
    with AsyncCheckpointer(tmp_path) as ckpt:
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            ckpt.save({"f": lambda: 1}, 1)
        with pytest.raises(ValueError, match="different dtypes"):
            base = torch.randn(4)
            ckpt.save({"a": base, "b": base.view(torch.int32)}, 2)
        path = ckpt.save({"a": torch.ones(2)}, 3).result()
    assert torch.equal(ckpt_load(path)["a"], torch.ones(2))


def test_save_special_values_and_kinds_round_trip(tmp_path):
    """NaN/Inf bit patterns, empty and 0-d tensors, meta, sparse, conj/neg views, quantized,
    a bare tensor as the whole state and a self-referencing dict: saved as torch.save would."""
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45])
    complex_view = torch.randn(3, dtype=torch.complex64)
    with warnings.catch_warnings():  # newer torch warns that quantization is deprecated
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8)
    state = {"special": special, "empty": torch.empty(0, 3), "scalar": torch.tensor(2.5),
             "meta": torch.empty(3, device="meta"), "sparse": torch.rand(3, 3).to_sparse(),
             "conj": complex_view.conj(), "neg": torch.randn(3, dtype=torch.complex64).conj().imag,
             "quantized": quantized}
    recursive = {"name": "loop"}
    recursive["self"] = recursive
    with AsyncCheckpointer(tmp_path, keep_last=None) as ckpt:
        path = ckpt.save(state, 1).result()
        bare = ckpt.save(torch.arange(5), 2).result()
        loop = ckpt.save(recursive, 3).result()
    loaded = ckpt_load(path, weights_only=False)
    assert torch.equal(loaded["special"].view(torch.int32), special.view(torch.int32))
    assert loaded["empty"].shape == (0, 3) and loaded["scalar"].item() == 2.5
    assert loaded["meta"].device.type == "meta" and loaded["meta"].shape == (3,)
    assert torch.equal(loaded["sparse"].to_dense(), state["sparse"].to_dense())
    assert torch.equal(loaded["conj"].resolve_conj(), state["conj"].resolve_conj())
    assert torch.equal(loaded["neg"].resolve_neg(), state["neg"].resolve_neg())
    assert torch.equal(loaded["quantized"].int_repr(), quantized.int_repr())
    assert torch.equal(ckpt_load(bare), torch.arange(5))
    again = ckpt_load(loop)
    assert again["self"] is again
    for p in (path, bare, loop):
        assert ckpt_verify(p) is None


def test_save_after_close_and_double_close(tmp_path):
    ckpt = AsyncCheckpointer(tmp_path)
    ckpt.close()
    ckpt.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        ckpt.save({}, 1)


def test_save_into_vanished_directory_reports_error(tmp_path):
    import shutil
    folder = tmp_path / "gone"
    ckpt = AsyncCheckpointer(folder)
    shutil.rmtree(folder)
    with pytest.raises(CheckpointError) as caught:
        ckpt.save({"a": torch.ones(3)}, 1).result()
    assert caught.value.errno != 0
    ckpt.close()


@pytest.mark.parametrize("content", [b"", b"garbage" * 10, b"PK\x03\x04" + b"\0" * 60],
                         ids=["empty", "garbage", "zip-magic"])
def test_verify_and_load_reject_damaged_files(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError):
        ckpt_verify(path)
    with pytest.raises(Exception) as caught:  # torch.load's own error, never a crash
        ckpt_load(path)
    assert not isinstance(caught.value, SystemError)


@pytest.mark.parametrize("bad, error", [(5, TypeError), (None, TypeError)], ids=repr)
@pytest.mark.parametrize("fn", [ckpt_verify, ckpt_load], ids=["verify", "load"])
def test_verify_and_load_bad_path_types(fn, bad, error):
    with pytest.raises(error):
        fn(bad)


@pytest.mark.parametrize("fn", [ckpt_verify, ckpt_load], ids=["verify", "load"])
def test_verify_and_load_missing_or_directory(tmp_path, fn):
    with pytest.raises(FileNotFoundError):
        fn(tmp_path / "missing.pt")
    with pytest.raises(IsADirectoryError):
        fn(tmp_path)


def test_checkpointer_out_of_threads_raises_not_aborts():
    """A writer that cannot start its threads raises; it must not std::terminate the process."""
    proc = run_python("""
        import resource, tempfile, qrnn.checkpoint as c
        # Thread stacks come out of the address space: cap it so that thread 100-odd fails.
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        import os
        used = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30), hard))
        try:
            c.AsyncCheckpointer(tempfile.mkdtemp(), copy_threads=1000)
            print("made")  # the OS had room after all: fine too
        except (RuntimeError, MemoryError, OSError) as e:
            print("raised", type(e).__name__)
    """, timeout=60)
    assert proc.returncode == 0 and ("raised" in proc.stdout or "made" in proc.stdout), proc.stderr[-2000:]


# ---- qrnn.qrnn_gates ---------------------------------------------------------------------------

from qrnn import QRNN, QRNNLayer, QRNNState, qrnn_gates, qrnn_layer  # noqa: E402
from qrnn.reference import qrnn_gates_reference  # noqa: E402

G_T, G_B, G_H = 3, 2, 4


def gate_inputs(dtype=torch.float32):
    return torch.randn(G_T, G_B, 3 * G_H, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("call, error, match", [
    (lambda: qrnn_gates([1.0]), TypeError, "gates must be a torch.Tensor"),
    (lambda: qrnn_gates(torch.ones(G_T, G_B, 3 * G_H, dtype=torch.int32)), TypeError, "int32"),
    (lambda: qrnn_gates(torch.ones(G_T, G_B, 3 * G_H, dtype=torch.complex64)), TypeError, "complex64"),
    (lambda: qrnn_gates(torch.ones(G_T, G_B, 3 * G_H, dtype=torch.bool)), TypeError, "bool"),
    (lambda: qrnn_gates(torch.rand(G_T, 3 * G_H)), ValueError, "3-D"),
    (lambda: qrnn_gates(torch.rand(G_T, G_B, 3 * G_H + 1)), ValueError, "multiple of 3"),
    (lambda: qrnn_gates(torch.rand(G_T, G_B, 2 * G_H + 1), output_gate=False), ValueError, "multiple of 2"),
    (lambda: qrnn_gates(gate_inputs().to_sparse()), TypeError, "dense"),
    (lambda: qrnn_gates(gate_inputs(), "c0"), TypeError, "c0 must be"),
    (lambda: qrnn_gates(gate_inputs(), torch.rand(G_B, G_H + 1)), ValueError, "c0 must have shape"),
    (lambda: qrnn_gates(gate_inputs(), torch.rand(G_B, G_H, dtype=torch.float64)), TypeError, "c0 must have dtype"),
    (lambda: qrnn_gates(gate_inputs(), torch.rand(G_B, G_H, device="meta")), ValueError, "device"),
    (lambda: qrnn_gates(gate_inputs(), forget_mask=torch.ones(G_T, G_B, G_H + 1)), ValueError, "forget_mask"),
    (lambda: qrnn_gates(gate_inputs(), forget_mask=torch.ones(G_T, G_B, G_H, dtype=torch.int64)), TypeError,
     "forget_mask"),
    (lambda: qrnn_gates(gate_inputs(), forget_scale=float("nan")), ValueError, "forget_scale"),
    (lambda: qrnn_gates(gate_inputs(), forget_scale=1.5), ValueError, "forget_scale"),
    (lambda: qrnn_gates(gate_inputs(), forget_scale=torch.tensor(0.5)), ValueError, "forget_scale"),
    (lambda: qrnn_gates(gate_inputs(), lengths=[1, 1]), ValueError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), lengths=torch.tensor([1, 1], dtype=torch.int32)), ValueError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), lengths=torch.tensor([G_T + 1, 1])), ValueError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), lengths=torch.tensor([-1, 1])), ValueError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), lengths=torch.tensor([1, 1, 1])), ValueError, "lengths"),
    (lambda: qrnn_gates(gate_inputs(), batch_first="yes"), TypeError, "batch_first"),
    (lambda: qrnn_gates(gate_inputs(), output_gate=1), TypeError, "output_gate"),
    (lambda: qrnn_gates(gate_inputs(), reverse=None), TypeError, "reverse"),
    # The registered ops check on their own: a smaller c0 / mask / gradient is never read out of bounds.
    (lambda: torch.ops.qrnn.qrnn_gates(torch.rand(30, 30, 90), torch.rand(1, 1), None, None, 1.0, True, False,
                                       False), ValueError, "c0"),
    (lambda: torch.ops.qrnn.qrnn_gates(torch.rand(30, 30, 90), None, torch.rand(1, 1, 1), None, 1.0, True, False,
                                       False), ValueError, "forget_mask"),
    (lambda: torch.ops.qrnn.qrnn_gates_backward(torch.rand(1, 1, 1), None, torch.rand(30, 30, 90),
                                                torch.rand(30, 30, 30), None, None, None, 1.0, True, False, False),
     ValueError, "grad_output"),
    (lambda: torch.ops.qrnn.qrnn_gates_backward(torch.rand(30, 30, 30), None, torch.rand(30, 30, 90),
                                                torch.rand(1, 1, 1), None, None, None, 1.0, True, False, False),
     ValueError, "states"),
    (lambda: torch.ops.qrnn.qrnn_gates_backward(None, torch.rand(1, 1), torch.rand(30, 30, 90),
                                                torch.rand(30, 30, 30), None, None, None, 1.0, True, False, False),
     ValueError, "grad_c_n"),
], ids=lambda v: None)
def test_qrnn_gates_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_qrnn_gates_meta_negative_bit_nan_and_empty():
    # meta: shape propagation, with and without autograd
    for requires_grad in (False, True):
        out, c_n = qrnn_gates(torch.empty(G_T, G_B, 3 * G_H, device="meta", requires_grad=requires_grad))
        assert out.device.type == "meta" and out.shape == (G_T, G_B, G_H) and c_n.shape == (G_B, G_H)
    # a negative-bit view is read as its values
    gates = torch.randn(G_T, G_B, 3 * G_H, dtype=torch.complex128).conj().imag
    assert gates.is_neg()
    torch.testing.assert_close(qrnn_gates(gates)[0], qrnn_gates_reference(gates.resolve_neg())[0])
    # NaN and Inf propagate as in the reference
    gates = gate_inputs(torch.float64)
    gates[0, 0, 0], gates[1, 1, G_H] = float("nan"), float("inf")
    out, c_n = qrnn_gates(gates)
    ref_out, ref_cn = qrnn_gates_reference(gates)
    torch.testing.assert_close(out, ref_out, equal_nan=True)
    torch.testing.assert_close(c_n, ref_cn, equal_nan=True)
    assert out[:, 0, 0].isnan().all()
    # empty: zero steps keep c0, zero batch or hidden give empty results
    c0 = torch.randn(G_B, G_H)
    out, c_n = qrnn_gates(torch.rand(0, G_B, 3 * G_H), c0)
    assert out.shape == (0, G_B, G_H) and torch.equal(c_n, c0)
    for shape in ((G_T, 0, 3 * G_H), (G_T, G_B, 0)):
        gates = torch.rand(shape, requires_grad=True)
        out, c_n = qrnn_gates(gates)
        (out.sum() + c_n.sum()).backward()
        assert gates.grad.shape == shape


# ---- qrnn.QRNN, QRNNLayer, qrnn_layer --------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(input_size=0, hidden_size=3), "input_size"),
    (dict(input_size="3", hidden_size=3), "input_size"),
    (dict(input_size=3, hidden_size=-1), "hidden_size"),
    (dict(input_size=3, hidden_size=3, num_layers=1.5), "num_layers"),
    (dict(input_size=3, hidden_size=3, num_layers=True), "num_layers"),
    (dict(input_size=3, hidden_size=3, num_layers=2, window=[1]), "window"),
    (dict(input_size=3, hidden_size=3, window=0), "window"),
    (dict(input_size=3, hidden_size=3, zoneout=1.0), "zoneout"),
    (dict(input_size=3, hidden_size=3, zoneout=float("nan")), "zoneout"),
    (dict(input_size=3, hidden_size=3, dropout=-0.1), "dropout"),
], ids=lambda v: repr(v)[:50])
def test_qrnn_constructor_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        QRNN(**kwargs)


@pytest.mark.parametrize("call, match", [
    (lambda m: m([1, 2, 3]), "input must be"),
    (lambda m: m(torch.rand(2, 2, 2, 3)), "3-D"),
    (lambda m: m(torch.rand(2, 2, 4)), "input_size"),
    (lambda m: m(torch.ones(2, 2, 3, dtype=torch.int64)), "type"),
    (lambda m: m(torch.rand(2, 2, 3, dtype=torch.float64)), "type"),
    (lambda m: m(torch.rand(2, 2, 3).bfloat16()), "type"),
    (lambda m: m(torch.rand(2, 2, 3), torch.rand(2, 2, 3)), "hx must have shape"),
    (lambda m: m(torch.rand(2, 2, 3), [1]), "hx must be"),
    (lambda m: m(torch.rand(2, 2, 3), torch.rand(1, 2, 3, device="meta")), "device"),
    (lambda m: m(torch.rand(2, 2, 3), lengths=torch.tensor([3, 1])), "lengths"),
    (lambda m: m(torch.rand(2, 2, 3), lengths=torch.tensor([1.0, 1.0])), "lengths"),
    (lambda m: m(torch.rand(2, 2, 3), lengths=torch.tensor([1, 1, 1])), "lengths"),
    (lambda m: m(torch.rand(2, 2, 3), QRNNState("c")), "hx.c"),
    (lambda m: m(torch.rand(2, 2, 3), QRNNState(None, (None, None))), "x_tails"),
], ids=lambda v: None)
def test_qrnn_forward_bad_arguments(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call(QRNN(3, 3))


@pytest.mark.parametrize("call, match", [
    (lambda: QRNNLayer(3)(torch.rand(2, 2, 4)), "input_size"),
    (lambda: QRNNLayer(3)(torch.rand(2, 2, 3), torch.rand(5)), "hx"),
    (lambda: QRNNLayer(3)(torch.rand(2, 2, 3), "x"), "hx"),
    (lambda: QRNNLayer(3)(torch.rand(2, 2, 3, dtype=torch.float64)), "type"),
    (lambda: QRNNLayer(3, window=2)(torch.rand(2, 2, 3), QRNNState(None, (torch.rand(5, 5, 5),))), "x_tails"),
    (lambda: QRNNLayer(0), "input_size"),
    (lambda: qrnn_layer(torch.rand(2, 2, 3), torch.rand(9, 3), window=0), "window"),
    (lambda: qrnn_layer(torch.rand(2, 2, 3), torch.rand(9, 3), zoneout=1.5, training=True), "zoneout"),
    (lambda: qrnn_layer(torch.rand(2, 2, 3), torch.rand(5, 3)), "multiple of 3"),
], ids=lambda v: None)
def test_qrnn_layer_bad_arguments(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_qrnn_meta_nan_and_empty():
    # A model built on the meta device infers shapes.
    model = QRNN(3, 4, num_layers=2, bidirectional=True, device="meta")
    out, h_n = model(torch.empty(5, 2, 3, device="meta"))
    assert out.shape == (5, 2, 8) and h_n.shape == (4, 2, 4) and out.device.type == "meta"
    # NaN in one sequence stays in that sequence.
    model = QRNN(3, 4)
    x = torch.rand(4, 2, 3)
    x[0, 0, 0] = float("nan")
    out, h_n = model(x)
    assert out[:, 0].isnan().all() and not out[:, 1].isnan().any()
    # Empty time, batch, or both, bidirectional and stacked.
    model = QRNN(3, 4, num_layers=2, bidirectional=True)
    for shape in ((0, 2, 3), (2, 0, 3), (0, 0, 3)):
        x = torch.rand(shape, requires_grad=True)
        out, h_n = model(x)
        assert out.shape == shape[:2] + (8,) and h_n.shape == (4, shape[1], 4)
        (out.sum() + h_n.sum()).backward()
        assert x.grad.shape == shape


# ---- qrnn.train: Trainer and the qrnn-train command -----------------------------------------

from qrnn.train import Trainer, choose_precision  # noqa: E402
from qrnn.train import main as train_main  # noqa: E402


@pytest.mark.parametrize("argv, message", [
    (["--seed", "abc"], "--seed: expected an int"),
    (["--seed", str(2**80)], "--seed: expected an int in"),
    (["--lr", "nan"], "--lr: expected a positive float"),
    (["--lr", "-1"], "--lr: expected a positive float"),
    (["--clip", "inf"], "--clip: expected a positive float"),
    (["--time-budget", "inf"], "--time-budget"),
    (["--layers", "0"], "--layers"),
    (["--hidden", "1.5"], "--hidden"),
    (["--keep-last", "0"], "--keep-last"),
    (["--sample-length", "-1"], "--sample-length"),
    (["--level", "byte"], "--level"),
    (["--optimizer", "lbfgs"], "--optimizer"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_train_command_bad_flags(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize("device, message", [("bogus", "is not a device"), ("meta", "cpu or cuda")]
                         + ([] if torch.cuda.is_available() else [("cuda", "no CUDA device")]))
def test_train_command_bad_device(tmp_path, device, message, capsys):
    data = tmp_path / "text.txt"
    data.write_text("hello world " * 200)
    assert train_main(["--device", device, "--data", str(data), "--no-progress",
                       "--checkpoint-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_trainer_bad_arguments():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.mse_loss
    with pytest.raises(TypeError, match="model"):
        Trainer(None, opt, loss)
    with pytest.raises(TypeError, match="optimizer"):
        Trainer(model, "sgd", loss)
    with pytest.raises(TypeError, match="loss_fn"):
        Trainer(model, opt, 3)
    with pytest.raises(ValueError, match="precision"):
        Trainer(model, opt, loss, precision="fp8")
    with pytest.raises(ValueError, match="precision"):
        choose_precision("int8", torch.device("cpu"))


def test_trainer_nan_loss_propagates_and_empty_data_is_no_op():
    model = torch.nn.Linear(2, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.mse_loss,
                      precision="fp32", progress=False, log=lambda message: None)
    history = trainer.fit([(torch.full((3, 2), float("nan")), torch.rand(3, 2))], epochs=1)
    assert len(history) == 1 and any(isinstance(v, float) and v != v for v in history[0].values())
    assert trainer.fit([], epochs=2) is not None
