"""libqrnn_torch (qrnn.torch_library()): a C++ program without Python runs AOTInductor
packages of a QRNN and of a linear_scan model and matches Python; loading the library is
harmless where Python registered the operators; its build fails clearly."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import qrnn
from conftest import CONSUMER, _cmake, run_python
from qrnn import cpp_library

pytestmark = pytest.mark.skipif(
    torch.__version__ < cpp_library.MINIMUM_TORCH_TEXT,
    reason=f"libqrnn_torch needs torch >= {cpp_library.MINIMUM_TORCH_TEXT} (the stable C ABI), "
           f"this is {torch.__version__}")

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "deployment.md"
INPUT, HIDDEN, BATCH = 16, 32, 3
LENGTHS = (35, 11)  # the exported example's sequence length, and a new one


@pytest.fixture(scope="module")
def cache_dir(torch_library_cache):
    """The session's fresh library cache (the CMake package's Python call inherits it)."""
    return torch_library_cache


def qrnn_ops(exported) -> set:
    return {str(n.target) for n in exported.graph.nodes if n.op == "call_function" and "qrnn" in str(n.target)}


def export(model, example, dynamic_shapes):
    with torch.no_grad():
        return torch.export.export(model.eval(), (example,), dynamic_shapes=dynamic_shapes)


def make_package(folder, model):
    """folder/qrnn.pt2 of `model` with a dynamic sequence length, the inputs of both lengths
    and Python's outputs on them, in the layout the consumer reads (any package taking one
    (seq_len, BATCH, INPUT) input and returning two tensors runs there)."""
    model.eval()
    exported = export(model, torch.randn(LENGTHS[0], BATCH, INPUT), ({0: torch.export.Dim("seq", min=2, max=4096)},))
    torch._inductor.aoti_compile_and_package(exported, package_path=str(folder / "qrnn.pt2"))
    expected = {}
    for length in LENGTHS:
        x = torch.randn(length, BATCH, INPUT)
        with torch.no_grad():
            expected[length] = model(x)
        x.numpy().tofile(folder / f"input_{length}.bin")
    return folder, qrnn_ops(exported), expected


class ReverseScan(torch.nn.Module):
    """linear_scan as a layer uses it: decays and inputs from projections of x, run backwards
    in time from a learned h0, on batch-first views of the time-major input."""

    def __init__(self):
        super().__init__()
        self.decay, self.input = torch.nn.Linear(INPUT, HIDDEN), torch.nn.Linear(INPUT, HIDDEN)
        self.h0 = torch.nn.Parameter(torch.randn(BATCH, HIDDEN))

    def forward(self, x):
        x = x.transpose(0, 1)
        h = qrnn.linear_scan(torch.sigmoid(self.decay(x)), self.input(x), self.h0, reverse=True, batch_first=True)
        return h.transpose(0, 1), h[:, 0]  # every state, time-major; the last one computed


@pytest.fixture(scope="module")
def scan_package(tmp_path_factory):
    return make_package(tmp_path_factory.mktemp("aoti-scan"), ReverseScan())


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """The deployment guide's model: a 2-layer bidirectional QRNN."""
    return make_package(tmp_path_factory.mktemp("aoti"), qrnn.QRNN(INPUT, HIDDEN, num_layers=2, bidirectional=True))


def readme_snippet() -> str:
    """The C++ block of the deployment guide's "C++: a trained model without Python"."""
    section = GUIDE.read_text().split("## C++: a trained model without Python", 1)[1]
    return re.search(r"^```cpp\n(.*?)^```", section, flags=re.S | re.M).group(1)


@pytest.fixture(scope="module")
def aoti_consumer(tmp_path_factory, cache_dir):
    """tests/cpp_consumer/aoti/ built against torch's libtorch and the qrnn CMake package's
    qrnn::torch, around the deployment guide's snippet."""
    cmake = _cmake()
    build = tmp_path_factory.mktemp("aoti-consumer")
    (build / "run_qrnn.inc").write_text(readme_snippet())
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    # A CUDA build of torch: its CMake package wants the CUDA toolkit it was built with, which
    # a GPU-less machine may lack; a CPU package needs only torch's own libraries.
    cpu_only = ([f"-DTORCH_PACKAGE_DIR={Path(torch.__file__).parent}",
                 f"-DTORCH_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"] if torch.version.cuda else [])
    configure = subprocess.run(
        [cmake, "-S", str(CONSUMER / "aoti"), "-B", str(build / "build"), *generator, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-Dqrnn_DIR={qrnn.cmake_dir()}",
         f"-DPython_EXECUTABLE={sys.executable}", f"-DQRNN_GUIDE_SNIPPET_DIR={build}", *cpu_only],
        capture_output=True, text=True)
    assert configure.returncode == 0, configure.stdout + configure.stderr
    proc = subprocess.run([cmake, "--build", str(build / "build")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return build / "build" / "aoti_consumer"


def test_the_package_calls_only_qrnn_gates(package):
    assert package[1] == {"qrnn.qrnn_gates.default"}  # what libqrnn_torch must serve


class LanguageModel(torch.nn.Module):
    """The shape of qrnn.train's language model: embedding, QRNN, linear decoder."""

    def __init__(self, vocabulary=50):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocabulary, INPUT)
        self.rnn = qrnn.QRNN(INPUT, HIDDEN, num_layers=2)
        self.decoder = torch.nn.Linear(HIDDEN, vocabulary)

    def forward(self, tokens):
        output, _ = self.rnn(self.embedding(tokens))
        return self.decoder(output)


def test_a_language_model_graph_calls_the_same_operator():
    exported = export(LanguageModel(), torch.randint(0, 50, (35, BATCH)), ({0: torch.export.Dim("seq", max=4096)},))
    assert qrnn_ops(exported) == {"qrnn.qrnn_gates.default"}


def run_consumer(aoti_consumer, package):
    """Runs the consumer on each length's input; the largest difference from Python's outputs."""
    folder, _, expected = package
    proc = subprocess.run([str(aoti_consumer), str(folder), str(BATCH), str(INPUT), *map(str, LENGTHS)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "aoti consumer ok" in proc.stdout, proc.stdout + proc.stderr
    for length in LENGTHS:
        output, h_n = expected[length]
        got_output = np.fromfile(folder / f"cpp_output_{length}.bin", dtype=np.float32).reshape(output.shape)
        got_h_n = np.fromfile(folder / f"cpp_h_n_{length}.bin", dtype=np.float32).reshape(h_n.shape)
        difference = max(np.abs(got_output - output.numpy()).max(), np.abs(got_h_n - h_n.numpy()).max())
        print(f"seq_len {length}: max |C++ - Python| = {difference:.2e}")
        assert difference <= 1e-5, (length, difference)


def test_cpp_runs_the_package_as_python_does(package, aoti_consumer):
    run_consumer(aoti_consumer, package)


def test_cpp_runs_a_linear_scan_package_as_python_does(scan_package, aoti_consumer):
    assert scan_package[1] == {"qrnn.linear_scan.default"}  # served by libqrnn_torch: reverse, batch_first, h0
    run_consumer(aoti_consumer, scan_package)


def test_loading_after_import_or_twice_registers_nothing(cache_dir):
    proc = run_python("""
        import ctypes, torch, qrnn
        path = qrnn.torch_library()
        torch.ops.load_library(path)
        ctypes.CDLL(path)                      # a second handle: no second registration
        m = qrnn.QRNN(4, 5).eval()
        with torch.no_grad():
            out, _ = m(torch.randn(3, 2, 4))
        try:  # Python's registration still answers: its ValueError naming the argument
            torch.ops.qrnn.qrnn_gates(torch.randn(3, 2, 7), None, None, None, 1.0, True, False, False)
        except ValueError as e:
            print("python checks:", e)
        print(tuple(out.shape))
    """)
    assert proc.returncode == 0, proc.stderr
    assert "python checks: qrnn_gates: gates must be 3-D" in proc.stdout and "(3, 2, 5)" in proc.stdout


def test_loading_before_import_makes_the_import_say_what_to_do(cache_dir):
    path = qrnn.torch_library()
    proc = run_python(f"""
        import torch
        torch.ops.load_library({path!r})
        out, c_n, states = torch.ops.qrnn.qrnn_gates(torch.randn(5, 2, 9), None, None, None, 1.0, True, False, False)
        print(tuple(out.shape), tuple(c_n.shape), tuple(states.shape))
        f, x = torch.rand(2, 6, 4, dtype=torch.float64), torch.randn(2, 6, 4, dtype=torch.float64)
        state = torch.randn(2, 4, dtype=torch.float64)
        h = torch.ops.qrnn.forget_mult(f, x, state, True)  # batch_first
        for t in range(6):  # the float64 recurrence, inline: qrnn.reference cannot be imported here
            state = f[:, t] * x[:, t] + (1 - f[:, t]) * state
            assert (h[:, t] - state).abs().max() < 1e-12
        print("forget_mult matches")
        print("CUDA kernels:", torch._C._dispatch_has_kernel_for_dispatch_key("qrnn::qrnn_gates", "CUDA"))
        for bad in (torch.randn(5, 2, 8), torch.randn(5, 2, 9).int()):  # the library's checks, not a crash
            try:
                torch.ops.qrnn.qrnn_gates(bad, None, None, None, 1.0, True, False, False)
            except (ValueError, RuntimeError) as e:  # torch 2.13: ValueError, 2.15: RuntimeError
                print("checked:", e)
        import qrnn
    """)
    assert "(5, 2, 3) (2, 3) (5, 2, 3)" in proc.stdout and "forget_mult matches" in proc.stdout, proc.stderr
    # CUDA kernels are registered where the core library has them (run on a GPU only there)
    assert f"CUDA kernels: {qrnn.build_info()['cuda']}" in proc.stdout
    assert "checked: qrnn_gates: gates must be 3-D with the last size a multiple of 3" in proc.stdout
    assert "checked: qrnn_gates: gates must be float32, float64, bfloat16 or float16" in proc.stdout
    assert proc.returncode != 0 and "ImportError" in proc.stderr and "import qrnn first" in proc.stderr


def test_the_command_prints_the_cached_library(cache_dir):
    proc = run_python(None, "-m", "qrnn", "--torch-library")
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path == Path(qrnn.torch_library()) and path.is_file() and cache_dir in path.parents


def test_build_failures_are_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("QRNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")
    with pytest.raises(cpp_library.TorchLibraryError, match=r"needs torch >= 2\.9 .* this is torch 2\.8\.0"):
        qrnn.torch_library()
    monkeypatch.undo()
    monkeypatch.setenv("QRNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(cpp_library.TorchLibraryError, match="needs a C\\+\\+17 compiler: 'no-such-compiler-here'"):
        qrnn.torch_library()
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with pytest.raises(cpp_library.TorchLibraryError, match="compiling qrnn's C\\+\\+ torch library failed"):
        qrnn.torch_library()
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # no partial file left
    monkeypatch.setattr(cpp_library, "_package_dir", lambda: tmp_path)
    with pytest.raises(cpp_library.TorchLibraryError, match="has no torch_ops.cpp"):
        qrnn.torch_library()


def test_the_cli_reports_a_failed_build(monkeypatch, capsys):
    from qrnn.__main__ import main
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    monkeypatch.setenv("QRNN_CACHE_DIR", "unused")
    assert main(["--torch-library"]) == 1
    assert "python -m qrnn: building qrnn's C++ torch library needs" in capsys.readouterr().err


def test_the_cache_defaults_to_the_user_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("QRNN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cpp_library._cache_root() == tmp_path / "torch-qrnn"
