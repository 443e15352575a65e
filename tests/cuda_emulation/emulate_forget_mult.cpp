// Runs the CUDA ForgetMult kernels of cuda/forget_mult_kernels.cuh on the CPU, compiled
// by the host C++ compiler against the CUDA headers (whose half/bfloat16 conversions
// have host versions). A grid runs one block at a time; in a chunked block every CUDA
// thread is a std::thread and __syncthreads a barrier, so the kernels' indexing, vector
// and tail paths and the chunked schedule's carry logic are checked on machines without
// a GPU (tests/test_forget_mult_cuda_emulated.py builds and drives this file). A barrier
// that not every thread reaches aborts with a message instead of hanging.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace qrnn_emu {

thread_local uint3 thread_idx;
uint3 block_idx;
dim3 block_dim;

class Barrier {
public:
    explicit Barrier(int count) : count_(count) {}
    void arrive_and_wait() {
        std::unique_lock<std::mutex> lock(mutex_);
        const long generation = generation_;
        if (++arrived_ == count_) {
            arrived_ = 0;
            ++generation_;
            cv_.notify_all();
            return;
        }
        if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return generation_ != generation; })) {
            std::fprintf(stderr, "emulate_forget_mult: __syncthreads not reached by every thread of block %u\n",
                         block_idx.x);
            std::abort();
        }
    }

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    int count_, arrived_ = 0;
    long generation_ = 0;
};

Barrier* block_barrier = nullptr;
inline void sync_threads() { block_barrier->arrive_and_wait(); }

}  // namespace qrnn_emu

template <typename R>
inline R __ldg(const R* p) { return *p; }

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

#include "forget_mult_kernels.cuh"

namespace qrnn::cuda::kernels {
alignas(16) unsigned char smem_bytes[1 << 16];  // the dynamic shared memory of the running block
}

namespace {

using namespace qrnn;
using namespace qrnn::cuda;

template <typename Params>
void run_grid(void (*kernel)(Params, int64_t), const Params& p, const detail::LaunchShape& s) {
    if (s.shared_bytes > int64_t(sizeof(kernels::smem_bytes))) throw std::runtime_error("shared memory too large");
    qrnn_emu::block_dim = dim3(unsigned(s.lanes), unsigned(s.chunks), 1);
    for (int64_t block = 0; block < s.blocks; ++block) {
        qrnn_emu::block_idx = {unsigned(block), 0, 0};
        if (s.chunks == 1) {  // serial kernels: no barriers, threads run one after another
            for (int lane = 0; lane < s.lanes; ++lane) {
                qrnn_emu::thread_idx = {unsigned(lane), 0, 0};
                kernel(p, s.vectors_per_row);
            }
            continue;
        }
        qrnn_emu::Barrier barrier(s.lanes * s.chunks);
        qrnn_emu::block_barrier = &barrier;
        std::vector<std::thread> threads;
        for (int chunk = 0; chunk < s.chunks; ++chunk)
            for (int lane = 0; lane < s.lanes; ++lane)
                threads.emplace_back([=] {
                    qrnn_emu::thread_idx = {unsigned(lane), unsigned(chunk), 0};
                    kernel(p, s.vectors_per_row);
                });
        for (auto& t : threads) t.join();
    }
}

template <typename T, int V>
void forward_width(const ForgetMultForwardParams& p, int chunks) {
    constexpr int U = detail::forward_steps(int(sizeof(T)) * V);
    const auto s = detail::launch_shape(p.batch, p.hidden, V, chunks, sizeof(kernels::Math<T>));
    if (s.chunks == 1) return run_grid(kernels::forward_serial<T, V, U>, p, s);
    if constexpr (V <= detail::chunked_max_width(int(sizeof(T))))
        return run_grid(kernels::forward_chunked<T, V, U>, p, s);
    throw std::runtime_error("no chunked kernel for this width");
}

template <typename T, int V>
void backward_width(const ForgetMultBackwardParams& p, int chunks) {
    constexpr int U = detail::backward_steps(int(sizeof(T)) * V);
    const auto s = detail::launch_shape(p.batch, p.hidden, V, chunks, sizeof(kernels::Math<T>));
    if (s.chunks == 1) return run_grid(kernels::backward_serial<T, V, U>, p, s);
    if constexpr (V <= detail::chunked_max_width(int(sizeof(T))))
        return run_grid(kernels::backward_chunked<T, V, U>, p, s);
    throw std::runtime_error("no chunked kernel for this width");
}

// The widths the CUDA build compiles: 16, 8, 4 bytes per pack (when over one element), 1.
template <typename T, typename Fn>
void by_width(int width, Fn&& fn) {
    constexpr int widest = 16 / int(sizeof(T));
    if (width == widest) return fn(std::integral_constant<int, widest>{});
    if constexpr (widest / 2 > 1)
        if (width == widest / 2) return fn(std::integral_constant<int, widest / 2>{});
    if constexpr (widest / 4 > 1)
        if (width == widest / 4) return fn(std::integral_constant<int, widest / 4>{});
    if (width == 1) return fn(std::integral_constant<int, 1>{});
    throw std::runtime_error("no kernel for this vector width");
}

template <typename Fn>
void by_dtype(int dtype, Fn&& fn) {
    switch (DType(dtype)) {
        case DType::float32: return fn(float{});
        case DType::float64: return fn(double{});
        case DType::bfloat16: return fn(__nv_bfloat16{});
        case DType::float16: return fn(__half{});
    }
    throw std::runtime_error("bad dtype");
}

ConstView3 cview(const void* p, const int64_t* s) { return {p, s[0], s[1], s[2]}; }
View3 mview(void* p, const int64_t* s) { return {p, s[0], s[1], s[2]}; }

}  // namespace

extern "C" {

// Same arguments as qrnn._C.cuda_forget_mult_forward (strides as int64[3] / int64[2])
// with the plan in place of stream and schedule. Returns 0, or 1 after printing an error.
int qrnn_emulate_forward(int dtype, int64_t T, int64_t B, int64_t H, const void* f, const int64_t* sf,
                         const void* x, const int64_t* sx, const void* h0, const int64_t* sh0, int h0_dtype,
                         void* h, const int64_t* sh, int vector_width, int chunks) {
    try {
        ForgetMultForwardParams p;
        p.seq_len = T, p.batch = B, p.hidden = H, p.dtype = DType(dtype);
        p.f = cview(f, sf), p.x = cview(x, sx), p.h = mview(h, sh);
        p.h0 = {h0, sh0[0], sh0[1]}, p.h0_dtype = DType(h0_dtype);
        by_dtype(dtype, [&](auto t) {
            using TT = decltype(t);
            by_width<TT>(vector_width, [&](auto v) { forward_width<TT, decltype(v)::value>(p, chunks); });
        });
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "qrnn_emulate_forward: %s\n", e.what());
        return 1;
    }
}

int qrnn_emulate_backward(int dtype, int64_t T, int64_t B, int64_t H, const void* f, const int64_t* sf,
                          const void* x, const int64_t* sx, const void* h, const int64_t* sh, const void* h0,
                          const int64_t* sh0, int h0_dtype, const void* grad_h, const int64_t* sgh, void* grad_f,
                          const int64_t* sgf, void* grad_x, const int64_t* sgx, void* grad_h0, const int64_t* sgh0,
                          int vector_width, int chunks) {
    try {
        ForgetMultBackwardParams p;
        p.seq_len = T, p.batch = B, p.hidden = H, p.dtype = DType(dtype);
        p.f = cview(f, sf), p.x = cview(x, sx), p.h = cview(h, sh);
        p.h0 = {h0, sh0[0], sh0[1]}, p.h0_dtype = DType(h0_dtype);
        p.grad_h = cview(grad_h, sgh), p.grad_f = mview(grad_f, sgf), p.grad_x = mview(grad_x, sgx);
        p.grad_h0 = {grad_h0, sgh0[0], sgh0[1]};
        by_dtype(dtype, [&](auto t) {
            using TT = decltype(t);
            by_width<TT>(vector_width, [&](auto v) { backward_width<TT, decltype(v)::value>(p, chunks); });
        });
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "qrnn_emulate_backward: %s\n", e.what());
        return 1;
    }
}

}  // extern "C"
