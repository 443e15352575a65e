// Runs the CUDA kernels of every family (cuda/<family>/kernels.cuh; the scan families' on the shared
// schedules of cuda/common/scan.cuh) on the CPU, compiled by the host C++
// compiler against the CUDA headers (whose half/bfloat16 conversions have host versions), so the kernels' indexing,
// vector and tail paths (every vector access checked for alignment), the chunked schedule's carry logic and the gate
// kernels' lengths/reverse walks are checked on machines without a GPU (the emulator fixture in tests/conftest.py
// builds this file; tests/<family>/test_<family>_cuda_emulated.py and _cuda_widths_emulated.py drive it).
//
// A grid runs one block at a time. In a chunked block every CUDA thread is a fiber
// (ucontext) with its own stack: each runs until it reaches __syncthreads, and when all
// have arrived they all go on; the fibers run in a shuffled order every phase, so a
// missing barrier shows as wrong results. A barrier that not every thread reaches is
// reported as an error instead of hanging.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace qrnn_emu {

uint3 thread_idx;
uint3 block_idx;
dim3 block_dim;

struct Fiber {
    ucontext_t context;
    uint3 index;
    bool waiting = false, done = false;
};

ucontext_t scheduler;
Fiber* running = nullptr;
const std::function<void()>* body = nullptr;

inline void sync_threads() {
    running->waiting = true;
    swapcontext(&running->context, &scheduler);
}

void fiber_main() {
    (*body)();
    running->done = true;  // then uc_link returns to the scheduler
}

// Runs `kernel_body` once per thread of a lanes x chunks block until every thread is done.
void run_block(int lanes, int chunks, const std::function<void()>& kernel_body, std::mt19937& rng) {
    constexpr size_t kStack = 256 * 1024;
    static std::vector<std::unique_ptr<char[]>> stacks;  // reused by every block (not zeroed)
    std::vector<Fiber> fibers(size_t(lanes) * chunks);
    while (stacks.size() < fibers.size()) stacks.emplace_back(new char[kStack]);
    body = &kernel_body;
    for (int chunk = 0; chunk < chunks; ++chunk) {
        for (int lane = 0; lane < lanes; ++lane) {
            Fiber& f = fibers[size_t(chunk) * lanes + lane];
            f.index = {unsigned(lane), unsigned(chunk), 0};
            getcontext(&f.context);
            f.context.uc_stack.ss_sp = stacks[size_t(chunk) * lanes + lane].get();
            f.context.uc_stack.ss_size = kStack;
            f.context.uc_link = &scheduler;
            makecontext(&f.context, fiber_main, 0);
        }
    }
    std::vector<Fiber*> order;
    for (Fiber& f : fibers) order.push_back(&f);
    for (;;) {
        std::shuffle(order.begin(), order.end(), rng);
        for (Fiber* f : order) {
            if (f->done || f->waiting) continue;
            running = f;
            thread_idx = f->index;
            swapcontext(&scheduler, &f->context);
        }
        size_t done = 0, waiting = 0;
        for (const Fiber& f : fibers) done += f.done, waiting += f.waiting;
        if (done == fibers.size()) return;
        if (done > 0) throw std::runtime_error("__syncthreads not reached by every thread of a block");
        for (Fiber& f : fibers) f.waiting = false;  // everyone arrived: the barrier opens
    }
}

}  // namespace qrnn_emu

namespace qrnn_emu {

// A GPU faults on a vector access not aligned to its size; x86 either does not or faults
// without saying where. Every vector load and store of the kernels (load_vector and
// store_vector, and every __ldg) is checked and done with memcpy, and the first
// misaligned one is reported when the grid is done (not thrown on the spot: a chunked
// block's threads run on their own stacks).
std::string misaligned;

inline void check_aligned(const void* ptr, size_t bytes, const char* what) {
    if (reinterpret_cast<uintptr_t>(ptr) % bytes == 0 || !misaligned.empty()) return;
    char text[160];
    std::snprintf(text, sizeof(text), "misaligned %zu-byte %s at address %p", bytes, what, ptr);
    misaligned = text;
}

// A load as the GPU makes it: faults (here: recorded) unless aligned to its own size.
template <typename R>
inline R checked_load(const R* p, const char* what) {
    check_aligned(p, sizeof(R), what);
    R r;
    std::memcpy(&r, p, sizeof(R));
    return r;
}

}  // namespace qrnn_emu

template <typename R>
inline R __ldg(const R* p) {
    return ::qrnn_emu::checked_load(p, "load (__ldg)");
}

#define QRNN_EMULATOR 1
namespace qrnn::cuda::kernels {
template <typename R>
inline R load_vector(const R* p) {
    return ::qrnn_emu::checked_load(p, "vector load");
}
template <typename R>
inline void store_vector(R* p, const R& r) {
    ::qrnn_emu::check_aligned(p, sizeof(R), "vector store");
    std::memcpy(p, &r, sizeof(R));
}
}  // namespace qrnn::cuda::kernels

#define threadIdx (::qrnn_emu::thread_idx)
#define blockIdx (::qrnn_emu::block_idx)
#define blockDim (::qrnn_emu::block_dim)
#define __syncthreads() ::qrnn_emu::sync_threads()
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef QRNN_WITH_CUDA
#define QRNN_WITH_CUDA 1
#endif

// #include "<family>/kernels.cuh" for every family of qrnn.ops.FAMILIES, written by the
// emulator fixture (tests/conftest.py) next to the library it builds.
#include "emulated_families.inc"
#include "common/kernel_args.hpp"

namespace qrnn::cuda::kernels {
alignas(16) unsigned char smem_bytes[1 << 16];  // the dynamic shared memory of the running block
}

namespace {

using namespace qrnn;
using namespace qrnn::cuda;
namespace args = qrnn::args;

template <typename Params>
void run_grid(void (*kernel)(Params, int64_t), const Params& p, const detail::LaunchShape& s) {
    if (s.shared_bytes > int64_t(sizeof(kernels::smem_bytes))) throw std::runtime_error("shared memory too large");
    std::mt19937 rng(12345);
    qrnn_emu::block_dim = dim3(unsigned(s.lanes), unsigned(s.chunks), 1);
    qrnn_emu::misaligned.clear();
    for (int64_t block = 0; block < s.blocks; ++block) {
        qrnn_emu::block_idx = {unsigned(block), 0, 0};
        if (s.chunks == 1) {  // serial kernels: no barriers, threads run one after another
            for (int lane = 0; lane < s.lanes; ++lane) {
                qrnn_emu::thread_idx = {unsigned(lane), 0, 0};
                kernel(p, s.vectors_per_row);
            }
            continue;
        }
        std::memset(kernels::smem_bytes, 0xff, sizeof(kernels::smem_bytes));  // NaN-ish: no stale summaries
        qrnn_emu::run_block(s.lanes, s.chunks, [&] { kernel(p, s.vectors_per_row); }, rng);
    }
    if (!qrnn_emu::misaligned.empty()) {
        const std::string what = qrnn_emu::misaligned;
        qrnn_emu::misaligned.clear();
        throw std::runtime_error(what + " (a GPU would fault)");
    }
}

// Runs `p` as the launcher of its dtype would launch it with `plan` (kernels::run_plan
// picks the kernel and grid).
template <typename Kernels, typename Params>
void run_plan(const Params& p, const LaunchPlan& plan) {
    if (int(p.dtype) < 0 || int(p.dtype) > 3) throw std::runtime_error("bad dtype");
    detail::by_dtype(p.dtype, [&](auto dtype) {
        kernels::run_plan<Kernels, kernels::Storage<decltype(dtype)::value>>(
            p, plan, [&](auto kernel, const detail::LaunchShape& s) { run_grid(kernel, p, s); });
    });
}

// Runs `body`, reporting an exception as 1 after printing it (ctypes sees no C++ exceptions).
template <typename Body>
int report(const char* what, Body&& body) {
    try {
        body();
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", what, e.what());
        return 1;
    }
}

}  // namespace

// The entry: `kernel` (a name of _C.kernel_fields()) with the numbers of its qrnn._C kernel
// entry point as kernel_args.hpp defines them (the integers, then the floats, in field
// order), read by the same reader qrnn._C uses; the launch plan (vector width, chunks)
// replaces the trailing stream and schedule (the gate kernels have no chunked schedule and
// ignore `chunks`). Returns 0, or 1 after printing an error.
extern "C" int qrnn_emulate(const char* kernel, const int64_t* ints, const double* reals, int vector_width,
                            int chunks) {
    const std::string name = kernel;
#define QRNN_EMULATE(list, Params, FIELDS)                                                                   \
    if (name == #list)                                                                                       \
        return report(#list, [&] {                                                                           \
            run_plan<kernels::TableOf<Params>::type>(args::list::read(ints, reals), {vector_width, chunks}); \
        });
    QRNN_KERNEL_ARG_LISTS(QRNN_EMULATE)
#undef QRNN_EMULATE
    std::fprintf(stderr, "qrnn_emulate: no kernel named %s\n", kernel);
    return 1;
}
