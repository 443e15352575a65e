"""Static estimate of the AArch64 NEON rows' inner loops with llvm-mca: no Arm machine needed.

    python tools/llvm_mca_estimate.py [--mca llvm-mca-19] [--cpus neoverse-v2,apple-m1]

Compiles each family's neon translation unit (each row function of cpp/src/<family>/
kernels.hpp in a noinline wrapper, built as cpu_neon.cpp builds it) to assembly with the
cross compiler (g++-aarch64-linux-gnu, -O3 as the build), finds in each wrapper the
innermost loop with the most vector instructions (the row's whole-vector loop), and asks
llvm-mca for its cycles per iteration on each CPU model. One iteration is one vector of 4
float32 lanes: cycles per element are a quarter of that.

These are llvm-mca's scheduling-model estimates for code in L1, labelled as such: not a
measurement, and no claim about memory. Each cell gives the simulated cycles per element
(200 iterations: latency chains included) and, in brackets, the bound from the model's
execution resources alone (Block RThroughput / 4). The "bytes per cycle" column is what the loop
would have to stream to keep up with its own arithmetic: where a core streams less from
memory than that, the kernel is memory-bound there, otherwise arithmetic-bound.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANES = 4  # float32 lanes of a NEON vector

# Per family: the translation unit's wrappers (each row function alone in a noinline
# function, so its loop is easy to find), and per wrapper a label and the bytes each element
# moves in memory: the forward reads its inputs and writes its outputs, the backward
# likewise; the state and running-gradient rows stay in L1.
WRAPPERS = {
    "forget_mult": """
        void mca_fm_fwd_f32(const float* f, const float* x, float* s, float* h, int64_t n) {
            vector_forward_row(f, x, s, h, n); }
        void mca_fm_fwd_bf16(const bfloat16* f, const bfloat16* x, float* s, bfloat16* h, int64_t n) {
            vector_forward_row(f, x, s, h, n); }
        void mca_fm_bwd_f32(const float* f, const float* x, const float* hp, const float* dh, float* df, float* dx,
                            float* g, int64_t n) { vector_backward_row(f, x, hp, dh, df, dx, g, n); }
    """,
    "linear_scan": """
        void mca_ls_fwd_f32(const float* a, const float* b, float* s, float* h, int64_t n) {
            vector_step(a, b, s, h, n); }
        void mca_ls_fwd_bf16(const bfloat16* a, const bfloat16* b, float* s, bfloat16* h, int64_t n) {
            vector_step(a, b, s, h, n); }
        void mca_ls_bwd_f32(const float* a, const float* hp, const float* dh, float* da, float* db, float* g,
                            int64_t n) { vector_adjoint(a, hp, dh, da, db, g, n); }
    """,
    "qrnn_gates": """
        template <typename T>
        __attribute__((always_inline)) inline void fwd(const T* g, const float* keep, float* c, T* h, T* st,
                                                       int64_t n, int64_t ahead) {
            forward_row<T, true>(g, g + n, g + 2 * n, ahead, keep, 0.9f, c, h, st, n); }
        template <typename T>
        __attribute__((always_inline)) inline void bwd(const T* g, const float* keep, const T* cp, const T* dh,
                                                       float* grad, T* dg, int64_t n, int64_t ahead) {
            backward_row<T, T, true>(g, g + n, g + 2 * n, ahead, keep, 0.9f, cp, dh, cp + ahead, dh + ahead, grad,
                                     dg, dg + n, dg + 2 * n, n); }
        void mca_gates_fwd_f32(const float* g, const float* k, float* c, float* h, float* s, int64_t n, int64_t a) {
            fwd(g, k, c, h, s, n, a); }
        void mca_gates_fwd_bf16(const bfloat16* g, const float* k, float* c, bfloat16* h, bfloat16* s, int64_t n,
                                int64_t a) { fwd(g, k, c, h, s, n, a); }
        void mca_gates_bwd_f32(const float* g, const float* k, const float* cp, const float* dh, float* gr, float* dg,
                               int64_t n, int64_t a) { bwd(g, k, cp, dh, gr, dg, n, a); }
        void mca_gates_bwd_bf16(const bfloat16* g, const float* k, const bfloat16* cp, const bfloat16* dh, float* gr,
                                bfloat16* dg, int64_t n, int64_t a) { bwd(g, k, cp, dh, gr, dg, n, a); }
    """,
}
KERNELS = [
    ("forget_mult", "forward, float32", "mca_fm_fwd_f32", 12),
    ("forget_mult", "forward, bfloat16", "mca_fm_fwd_bf16", 6),
    ("forget_mult", "backward, float32", "mca_fm_bwd_f32", 24),
    ("linear_scan", "forward, float32", "mca_ls_fwd_f32", 12),
    ("linear_scan", "forward, bfloat16", "mca_ls_fwd_bf16", 6),
    ("linear_scan", "backward, float32", "mca_ls_bwd_f32", 20),
    ("qrnn_gates", "forward, float32", "mca_gates_fwd_f32", 20),
    ("qrnn_gates", "forward, bfloat16", "mca_gates_fwd_bf16", 10),
    ("qrnn_gates", "backward, float32", "mca_gates_bwd_f32", 32),
    ("qrnn_gates", "backward, bfloat16", "mca_gates_bwd_bf16", 16),
]

VECTOR = re.compile(r"\bv\d+\.[48][sh]\b|\bq\d+\b")
LABEL = re.compile(r"^(\.L\w+):")
BRANCH = re.compile(r"^\s*(b|b\.?(?:eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le)|cbn?z|tbn?z)\s+"
                    r"(?:\w+,\s*)*(?:#\d+,\s*)?(\.L\w+)\s*$")


def functions(asm: str) -> dict:
    """Mangled symbol -> its lines."""
    out, name, lines = {}, None, []
    for line in asm.splitlines():
        m = re.match(r"^([_A-Za-z][\w.$]*):\s*$", line)
        if m and not line.startswith(".L"):
            if name:
                out[name] = lines
            name, lines = m.group(1), []
        elif name:
            lines.append(line)
    if name:
        out[name] = lines
    return out


def hottest_loop(lines: list) -> list:
    """The innermost loop (a backward branch's span holding no other one) with the most vector
    instructions."""
    where = {}
    spans = []
    for i, line in enumerate(lines):
        m = LABEL.match(line)
        if m:
            where[m.group(1)] = i
        b = BRANCH.match(line)
        if b and b.group(2) in where:
            spans.append((where[b.group(2)], i))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    best, best_count = [], -1
    for lo, hi in inner:
        body = [x for x in lines[lo + 1:hi + 1] if x.strip() and not x.strip().startswith((".", "//"))
                and not LABEL.match(x)]
        count = sum(bool(VECTOR.search(x)) for x in body)
        if count > best_count:
            best, best_count = body, count
    return best


def mca(body: list, cpu: str, tool: str) -> tuple:
    """llvm-mca's simulated cycles per iteration over 200 iterations, and its Block
    RThroughput (the bound from the CPU model's execution resources alone)."""
    text = "\n".join(body) + "\n"
    out = subprocess.run([tool, "-mtriple=aarch64-linux-gnu", f"-mcpu={cpu}", "-iterations=200"], input=text,
                         capture_output=True, text=True, check=True).stdout
    total = re.search(r"Total Cycles:\s+(\d+)", out)
    bound = re.search(r"Block RThroughput:\s+([\d.]+)", out)
    assert total and bound, out
    return int(total.group(1)) / 200, float(bound.group(1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mca", default="llvm-mca", help="the llvm-mca to run (neoverse-v2 needs LLVM >= 16)")
    parser.add_argument("--cpus", default="neoverse-v2,apple-m1")
    parser.add_argument("--cxx", default="aarch64-linux-gnu-g++")
    args = parser.parse_args(argv)
    cpus = args.cpus.split(",")
    version = subprocess.run([args.mca, "--version"], capture_output=True, text=True).stdout
    compiler = subprocess.run([args.cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    llvm = re.search(r"LLVM version ([\w.]+)", version)
    print(f"llvm-mca: LLVM {llvm.group(1) if llvm else '?'}; compiler: {compiler}; -O3")
    asm_of = {}
    with tempfile.TemporaryDirectory() as tmp:
        for family in sorted({k[0] for k in KERNELS}):
            source, out = Path(tmp) / f"{family}.cpp", Path(tmp) / f"{family}.s"
            source.write_text(f"#define QRNN_ISA neon\n#define QRNN_ISA_NEON 1\n#include \"{family}/kernels.hpp\"\n"
                              "namespace qrnn::cpu::neon {\n#define W __attribute__((noinline))\n"
                              + re.sub(r"(\n\s*)void ", r"\1W void ", WRAPPERS[family]) + "\n}\n")
            subprocess.run([args.cxx, "-O3", "-std=c++17", "-S", "-DQRNN_HAVE_NEON_KERNELS",
                            f"-I{ROOT / 'cpp/include'}", f"-I{ROOT / 'cpp/src'}", str(source), "-o", str(out)],
                           check=True)
            asm_of[family] = out.read_text()
    header = "| family | loop | instructions per vector | " + " | ".join(
        f"{c}: cycles per element, simulated (resource bound); bytes per cycle to keep up" for c in cpus) + " |"
    print(header)
    print("|" + "---|" * (3 + len(cpus)))
    for family, label, wrapper, nbytes in KERNELS:
        funcs = functions(asm_of[family])
        demangled = subprocess.run(["c++filt"], input="\n".join(funcs), capture_output=True, text=True,
                                   check=True).stdout.splitlines()
        match = [m for m, d in zip(funcs, demangled) if f"::{wrapper}(" in d]
        if not match:
            print(f"| {family} | {label} | not found | " + " | ".join("-" for _ in cpus) + " |")
            continue
        body = hottest_loop(funcs[match[0]])
        if not body:  # the row's loop (for_each_vector) kept out of line: the function it calls
            called = [c.group(1) for c in (re.match(r"^\s*bl?\s+(\w+)\s*$", x) for x in funcs[match[0]]) if c]
            body = next((b for b in (hottest_loop(funcs.get(c, [])) for c in called) if b), [])
        cells = []
        for cpu in cpus:
            simulated, bound = mca(body, cpu, args.mca)
            per_element = simulated / LANES
            cells.append(f"{per_element:.2f} ({bound / LANES:.2f}); {nbytes / per_element:.1f} B")
        print(f"| {family} | {label} | {len(body)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
