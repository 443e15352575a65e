"""``python -m qrnn``: build info and a self-check of the kernels on this machine.

It names the CPU kernels' instruction-set level (``QRNN_SIMD`` caps it) and, per op family,
what its contiguous rows run on there: a hand-written vector layer (``avx512``, ``avx2``,
``neon``) or ``generic`` (plain loops, vectorised by the compiler as it can).

``--cmake-dir`` / ``--include-dir`` print the folders a C++ project needs; ``--torch-library``
the path of libqrnn_torch (the qrnn:: operators for C++ programs), compiled on first use.
"""

import argparse
import sys
import time

import torch

import qrnn
from qrnn.cpp_library import TorchLibraryError
from qrnn.ops.forget_mult.reference import forget_mult_reference
from qrnn.ops.linear_scan.reference import linear_scan_reference
from qrnn.ops.qrnn_gates.reference import qrnn_gates_reference


def _gates_op(g, x, h0):
    return qrnn.qrnn_gates(g, h0)[0]


def _gates_reference(g, x, h0):
    return qrnn_gates_reference(g, h0)[0]


def self_check() -> int:
    info = qrnn.build_info()
    print(f"torch-qrnn {info['version']} | torch {torch.__version__} | {info['compiler']}")
    print(f"CPU kernels: {info['simd']} | CUDA kernels: "
          f"{'yes (' + info['cuda_architectures'] + ')' if info['cuda'] else 'not built'}")
    rows = info["simd_rows"]
    print("CPU rows per family: " + ", ".join(f"{name} {level}" for name, level in rows.items()))
    devices = ["cpu"] + (["cuda"] if info["cuda"] and torch.cuda.is_available() else [])
    failures = 0
    # Each family's op against its float64 loop; the decays of linear_scan are 1 - f, the
    # fused gates take Z, F and O pre-activations (3H wide).
    ops = (("forget_mult", qrnn.forget_mult, forget_mult_reference, lambda f: f),
           ("linear_scan", qrnn.linear_scan, linear_scan_reference, lambda f: 1 - f),
           ("qrnn_gates", _gates_op, _gates_reference, lambda f: 4 * torch.cat([f, -f, f - 0.5], -1)))
    for device in devices:
        for name, op, reference, first in ops:
            for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)):
                T, B, H = 70, 20, 1550  # the AWD-QRNN shape
                f = first(torch.rand(T, B, H, device=device)).to(dtype)
                x = torch.randn(T, B, H, device=device).to(dtype)
                h0 = torch.randn(B, H, device=device)
                start = time.perf_counter()
                h = op(f, x, h0.to(dtype) if dtype == torch.float32 else h0)
                if device == "cuda":
                    torch.cuda.synchronize()
                ms = (time.perf_counter() - start) * 1e3
                ref = reference(f.double().cpu(), x.double().cpu(), h0.double().cpu())  # float64 loop
                err = (h.double().cpu() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
                ok = err <= tol
                failures += not ok
                where = f"{device} ({rows[name]} rows)" if device == "cpu" else device
                print(f"  {name:11} {where:18} {str(dtype):15} {T}x{B}x{H}: "
                      f"{ms:7.2f} ms, max error vs float64 {err:.1e} {'ok' if ok else 'FAILED'}")
    print("self-check passed" if not failures else f"self-check FAILED ({failures})")
    return 1 if failures else 0


def main(argv=None) -> int:
    # The docstring's reStructuredText literals (``...``) read as plain text in a terminal.
    parser = argparse.ArgumentParser(prog="python -m qrnn", description=(__doc__ or "").replace("``", ""))
    parser.add_argument("--cmake-dir", action="store_true", help="print the folder to pass as qrnn_DIR")
    parser.add_argument("--include-dir", action="store_true", help="print the C++ include folder")
    parser.add_argument("--torch-library", action="store_true",
                        help="print the path of libqrnn_torch (compiled against this torch on first use)")
    args = parser.parse_args(argv)
    if args.torch_library:
        try:
            print(qrnn.torch_library())
        except TorchLibraryError as error:
            print(f"python -m qrnn: {error}", file=sys.stderr)
            return 1
        return 0
    if args.cmake_dir:
        print(qrnn.cmake_dir())
        return 0
    if args.include_dir:
        print(qrnn.include_dir())
        return 0
    return self_check()


if __name__ == "__main__":
    sys.exit(main())
