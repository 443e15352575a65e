#!/usr/bin/env python3
"""Are two builds of torch-qrnn bit-identical on the CPU? Runs the same ops on the same inputs
in two Python environments and compares every output and gradient with torch.equal.

    python tools/compare_builds.py PYTHON_A PYTHON_B [--keep DIR]

e.g. ``python tools/compare_builds.py old-env/bin/python .venv/bin/python`` after a
kernel refactor. The inputs are drawn once, here, and handed to both sides in a file, so
the two environments may even differ in torch version. Covered: ``qrnn.forget_mult`` and
``qrnn.qrnn_gates`` (and ``qrnn.linear_scan`` where both builds have it) in float32,
float64, bfloat16 and float16; time-major and batch_first; contiguous and strided inputs;
with and without an initial state; the gates also with reverse, lengths, a zoneout mask and
without an output gate; and at the benchmarks' shape (T=70 B=20 H=1550). Forward outputs
and the gradients of every input. Exit status 0 when every tensor is equal on both sides, 1
otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _strided(t: torch.Tensor, strided: bool) -> torch.Tensor:
    """t itself, or a view of t's values with a stride of 2 in the last dimension (the base
    stays the leaf whose gradient is compared)."""
    if not strided:
        return t
    base = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    base[..., ::2] = t
    return base


def _view(base: torch.Tensor, strided: bool) -> torch.Tensor:
    return base[..., ::2] if strided else base


def make_cases(seed: int = 0) -> list:
    """Each case: (name, op, tensors, options). Tensors are leaves; `strided` ones are read
    through a stride-2 view."""
    gen = torch.Generator().manual_seed(seed)
    T, B, H = 13, 3, 37  # an odd hidden size: vector bodies and scalar tails both run
    cases = []

    def rand(*shape, dtype, kind="normal"):
        v = torch.rand(*shape, generator=gen) if kind == "uniform" else torch.randn(*shape, generator=gen)
        return v.to(dtype)

    for dname, dtype in DTYPES.items():
        state_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        for batch_first in (False, True):
            shape = (B, T, H) if batch_first else (T, B, H)
            for strided in (False, True):
                for with_h0 in (False, True):
                    tag = f"{dname} {'batch_first' if batch_first else 'time-major'}" \
                          f"{' strided' if strided else ''}{' h0' if with_h0 else ''}"
                    opts = {"batch_first": batch_first, "strided": strided}
                    for op in ("forget_mult", "linear_scan"):
                        tensors = {"a": _strided(rand(*shape, dtype=dtype, kind="uniform"), strided),
                                   "b": _strided(rand(*shape, dtype=dtype), strided),
                                   "grad": rand(*shape, dtype=dtype)}
                        if with_h0:
                            tensors["h0"] = rand(B, H, dtype=state_dtype)
                        cases.append((f"{op} {tag}", op, tensors, opts))
                    for variant in ("", "no-output-gate", "reverse+lengths", "mask"):
                        blocks = 2 if variant == "no-output-gate" else 3
                        gshape = shape[:-1] + (blocks * H,)
                        tensors = {"gates": _strided(rand(*gshape, dtype=dtype), strided),
                                   "grad": rand(*shape, dtype=dtype), "grad_c": rand(B, H, dtype=state_dtype)}
                        if with_h0:
                            tensors["c0"] = rand(B, H, dtype=state_dtype)
                        o = dict(opts, output_gate=variant != "no-output-gate")
                        if variant == "reverse+lengths":
                            o["reverse"] = True
                            tensors["lengths"] = torch.tensor([T, T - 4, 1])
                        if variant == "mask":
                            tensors["forget_mask"] = (torch.rand(*shape, generator=gen) > 0.3).to(dtype)
                            o["forget_scale"] = 1.0
                        cases.append((f"qrnn_gates {tag}{' ' + variant if variant else ''}", "qrnn_gates", tensors, o))
    # The benchmarks' shape: rows split into blocks and over threads as in real use.
    T, B, H = 70, 20, 1550
    for dname, dtype in DTYPES.items():
        state_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
        opts = {"batch_first": False, "strided": False}
        for op in ("forget_mult", "linear_scan"):
            cases.append((f"{op} {dname} T={T} B={B} H={H} h0", op,
                          {"a": rand(T, B, H, dtype=dtype, kind="uniform"), "b": rand(T, B, H, dtype=dtype),
                           "grad": rand(T, B, H, dtype=dtype), "h0": rand(B, H, dtype=state_dtype)}, opts))
        cases.append((f"qrnn_gates {dname} T={T} B={B} H={H} c0", "qrnn_gates",
                      {"gates": rand(T, B, 3 * H, dtype=dtype), "grad": rand(T, B, H, dtype=dtype),
                       "grad_c": rand(B, H, dtype=state_dtype), "c0": rand(B, H, dtype=state_dtype)},
                      dict(opts, output_gate=True)))
    return cases


def run_cases(cases: list) -> dict:
    """name -> {tensor name: value} of outputs and gradients; ops this build lacks are skipped."""
    import qrnn

    results = {}
    for name, op, tensors, opts in cases:
        if not hasattr(qrnn, op):
            continue
        leaves = {k: v.clone().requires_grad_(v.is_floating_point() and k not in ("grad", "grad_c", "forget_mask"))
                  for k, v in tensors.items()}
        strided, batch_first = opts["strided"], opts["batch_first"]
        out = {}
        if op in ("forget_mult", "linear_scan"):
            fn = getattr(qrnn, op)
            h = fn(_view(leaves["a"], strided), _view(leaves["b"], strided), leaves.get("h0"),
                   batch_first=batch_first)
            h.backward(leaves["grad"])
            out["h"] = h.detach()
        else:
            extra = {k: v for k, v in opts.items() if k in ("output_gate", "reverse", "forget_scale")}
            output, c_n = qrnn.qrnn_gates(_view(leaves["gates"], strided), leaves.get("c0"),
                                          forget_mask=leaves.get("forget_mask"), lengths=leaves.get("lengths"),
                                          batch_first=batch_first, **extra)
            torch.autograd.backward([output, c_n], [leaves["grad"], leaves["grad_c"]])
            out["output"], out["c_n"] = output.detach(), c_n.detach()
        for k, v in leaves.items():
            if v.requires_grad:
                out[f"grad_{k}"] = v.grad
        results[name] = out
    return results


def compare(a: dict, b: dict) -> tuple:
    """(rows, all_equal): one row per case in both, listing tensors that differ."""
    rows, ok = [], True
    for name in a:
        if name not in b:
            continue
        differ = [k for k in a[name] if not torch.equal(a[name][k], b[name][k])]
        ok &= not differ
        rows.append((name, "identical" if not differ else "DIFFER: " + ", ".join(differ)))
    return rows, ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pythons", nargs="*", metavar="PYTHON", help="two Python executables")
    parser.add_argument("--keep", metavar="DIR", help="keep the inputs and both sides' results in DIR")
    parser.add_argument("--run", nargs=2, metavar=("INPUTS", "RESULTS"), help=argparse.SUPPRESS)  # one side
    args = parser.parse_args(argv)
    if args.run:
        torch.save(run_cases(torch.load(args.run[0])), args.run[1])
        return 0
    if len(args.pythons) != 2:
        parser.error("give two Python executables")
    folder = args.keep or tempfile.mkdtemp(prefix="compare_builds_")
    os.makedirs(folder, exist_ok=True)
    inputs = os.path.join(folder, "inputs.pt")
    torch.save(make_cases(), inputs)
    results = []
    for i, python in enumerate(args.pythons):
        python = os.path.abspath(python) if os.sep in python else python  # the sides run in `folder`
        path = os.path.join(folder, f"results_{i}.pt")
        version = subprocess.run([python, "-c", "import torch, qrnn; print(torch.__version__, qrnn.__file__)"],
                                 check=True, capture_output=True, text=True, cwd=folder).stdout.strip()
        print(f"side {i}: {python} (torch, qrnn: {version})")
        # cwd=folder: each side imports its own installed qrnn, not a checkout's python/ folder.
        subprocess.run([python, os.path.abspath(__file__), "--run", inputs, path], check=True, cwd=folder)
        results.append(torch.load(path))
    rows, ok = compare(*results)
    skipped = sorted(set(results[0]) ^ set(results[1]))
    width = max(len(r[0]) for r in rows)
    for name, status in rows:
        print(f"{name.ljust(width)}  {status}")
    tensors = sum(len(results[0][name]) for name, _ in rows)
    print(f"\n{len(rows)} cases, {tensors} tensors compared with torch.equal: "
          f"{'all identical' if ok else 'SOME DIFFER'}"
          + (f"; {len(skipped)} cases run on one side only (an op the other build lacks)" if skipped else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
