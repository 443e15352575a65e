#!/usr/bin/env python3
"""Registers, stack and spills of every CUDA kernel of a build; fails if any kernel spills.

The CMake build keeps nvcc's --resource-usage report of each CUDA object beside it
(<object>.log, written by cmake/keep_compiler_log.sh). This reads those reports under a
build folder, prints one row per kernel with its registers for every GPU architecture,
and exits 1 if any kernel spills registers or uses a stack frame (local memory), 2 if
the folder holds no reports (not built with CUDA?), 0 otherwise.

    python tools/cuda_resource_usage.py [BUILD_DIR ...]     (default: build)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")


def parse(log: Path) -> list[dict]:
    """One dict per (kernel, architecture) compiled into the object."""
    kernels, current = [], None
    for line in log.read_text(errors="replace").splitlines():
        if m := ENTRY.search(line):
            current = {"object": log.name[: -len(".o.log")], "kernel": m.group(1), "arch": m.group(2),
                       "registers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0, "smem": 0}
            kernels.append(current)
        elif current is None:
            continue
        elif m := FRAME.search(line):
            current["stack"], current["spill_stores"], current["spill_loads"] = map(int, m.groups())
        elif m := USED.search(line):
            current["registers"] = int(m.group(1))
            if s := SMEM.search(line):
                current["smem"] = int(s.group(1))
    return kernels


def demangle(names: list[str]) -> dict:
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    prefix = r"\bqrnn::cuda::(kernels::|bench::)?(\(anonymous namespace\)::)?"
    short = [re.sub(r"^void |\(.*\)$", "", re.sub(prefix, "", d)) for d in out]
    return dict(zip(names, short)) if len(short) == len(names) else {n: n for n in names}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dirs", nargs="*", default=["build"], help="build folders to search (default: build)")
    args = parser.parse_args(argv)
    logs = sorted(log for d in args.build_dirs for log in Path(d).rglob("*.cu.o.log")
                  if log.with_suffix("").exists())  # a report whose object is gone is stale: skipped
    if not logs:
        print(f"no CUDA compiler reports (*.cu.o.log) under {', '.join(args.build_dirs)}: "
              "was the package built with its CUDA kernels (QRNN_CUDA=ON or AUTO with nvcc)?")
        return 2
    kernels = [k for log in logs for k in parse(log)]
    names = demangle(sorted({k["kernel"] for k in kernels}))
    archs = sorted({k["arch"] for k in kernels}, key=lambda a: int(re.sub(r"\D", "", a)))
    table: dict = {}
    for k in kernels:
        table.setdefault((k["object"], names[k["kernel"]]), {})[k["arch"]] = k

    width = max(len(n) for _, n in table) + 2
    print(f"{'kernel (registers per architecture; S = spills or stack)':<{width}}" +
          "".join(f"{a:>8}" for a in archs))
    bad = []
    for (obj, name), per_arch in sorted(table.items()):
        cells = []
        for arch in archs:
            k = per_arch.get(arch)
            if k is None:
                cells.append(f"{'-':>8}")
                continue
            spills = k["spill_stores"] or k["spill_loads"] or k["stack"]
            cells.append(f"{k['registers']:>7}{'S' if spills else ' '}")
            if spills:
                bad.append(f"{name} [{arch}, {obj}]: {k['stack']} bytes stack, {k['spill_stores']} bytes spill "
                           f"stores, {k['spill_loads']} bytes spill loads")
        print(f"{name:<{width}}" + "".join(cells))
    print(f"{len(table)} kernels, {len(kernels)} compilations, {len(logs)} objects")
    if bad:
        print("kernels that spill or use local memory:\n  " + "\n  ".join(bad))
        return 1
    print("no kernel spills")
    return 0


if __name__ == "__main__":
    sys.exit(main())
