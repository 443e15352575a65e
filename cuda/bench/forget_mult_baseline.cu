// Benchmark baseline only (qrnn.bench._baseline, not part of the library): the design of
// the original pytorch-qrnn CUDA kernels, rewritten here so the GPU benchmark can measure
// the library's kernels against it in the same run (python -m qrnn.bench cuda). Deliberately
// kept as that design was: float32 only, one thread per (batch, hidden) column, 32-bit offsets,
// an output buffer of seq_len + 1 rows (row 0 = h0) from which h[t-1] is re-read every
// step, no __restrict__, no loads kept in flight, a double running gradient backward.
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "bench/forget_mult_baseline.hpp"
#include "common/check.hpp"

namespace qrnn::cuda::bench {
namespace {

constexpr int kMaxThreads = 512;

__global__ void baseline_forward_kernel(float* h, const float* f, const float* x, int seq_len, int batch, int hidden) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int b = blockIdx.y;
    if (j >= hidden || b >= batch) return;
    for (int t = 1; t <= seq_len; ++t) {
        const int in = (t - 1) * hidden * batch + b * hidden + j;
        const int out = t * hidden * batch + b * hidden + j;
        const int prev = (t - 1) * hidden * batch + b * hidden + j;
        h[out] = f[in] * x[in];
        h[out] += (1 - f[in]) * h[prev];
    }
}

__global__ void baseline_backward_kernel(const float* h, const float* f, const float* x, const float* grad_h,
                                         float* grad_f, float* grad_x, float* grad_h0, int seq_len, int batch,
                                         int hidden) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int b = blockIdx.y;
    if (j >= hidden || b >= batch) return;
    double running = 0;
    for (int t = seq_len; t >= 1; --t) {
        const int in = (t - 1) * hidden * batch + b * hidden + j;
        const int prev = (t - 1) * hidden * batch + b * hidden + j;
        running += grad_h[in];
        grad_x[in] = f[in] * running;
        grad_f[in] = (x[in] - h[prev]) * running;
        running = running - f[in] * running;
    }
    grad_h0[b * hidden + j] = running;
}

void check_sizes(int64_t seq_len, int64_t batch, int64_t hidden) {
    qrnn::detail::check_size("seq_len", seq_len);
    qrnn::detail::check_size("batch", batch);
    qrnn::detail::check_size("hidden", hidden);
    const int64_t buffer = qrnn::detail::checked_numel(seq_len + 1, batch, hidden, "baseline_forget_mult");
    if (buffer > INT32_MAX || batch > 65535)
        qrnn::detail::fail(
            "baseline_forget_mult: the original design uses 32-bit offsets and a batch grid "
            "dimension; this shape does not fit");
}

dim3 grid_of(int64_t batch, int64_t hidden, int threads) {
    return dim3(unsigned((hidden + threads - 1) / threads), unsigned(batch));
}

void check(cudaError_t error, const char* what) {
    if (error != cudaSuccess)
        throw std::runtime_error(std::string(what) + ": CUDA error " + cudaGetErrorName(error) + ": " +
                                 cudaGetErrorString(error));
}

// Makes `device` current for one launch (torch may have another current in this runtime).
class OnDevice {
public:
    OnDevice(int device, const char* what) {
        check(cudaGetDevice(&previous_), what);
        if (device != previous_)
            check(cudaSetDevice(device), what);
        else
            previous_ = -1;
    }
    ~OnDevice() {
        if (previous_ >= 0) cudaSetDevice(previous_);
    }
    OnDevice(const OnDevice&) = delete;
    OnDevice& operator=(const OnDevice&) = delete;

private:
    int previous_ = -1;
};

}  // namespace

void baseline_forget_mult_forward(const float* f, const float* x, float* h_with_h0, int64_t seq_len, int64_t batch,
                                  int64_t hidden, void* stream, int device) {
    constexpr const char* what = "qrnn::cuda::bench::baseline_forget_mult_forward";
    check_sizes(seq_len, batch, hidden);
    if (seq_len * batch * hidden == 0) return;
    const int threads = int(hidden < kMaxThreads ? hidden : kMaxThreads);
    const OnDevice on(device, what);
    baseline_forward_kernel<<<grid_of(batch, hidden, threads), threads, 0, static_cast<cudaStream_t>(stream)>>>(
        h_with_h0, f, x, int(seq_len), int(batch), int(hidden));
    check(cudaGetLastError(), what);
}

void baseline_forget_mult_backward(const float* f, const float* x, const float* h_with_h0, const float* grad_h,
                                   float* grad_f, float* grad_x, float* grad_h0, int64_t seq_len, int64_t batch,
                                   int64_t hidden, void* stream, int device) {
    constexpr const char* what = "qrnn::cuda::bench::baseline_forget_mult_backward";
    check_sizes(seq_len, batch, hidden);
    if (batch * hidden == 0) return;
    const int threads = int(hidden < kMaxThreads ? hidden : kMaxThreads);
    const OnDevice on(device, what);
    baseline_backward_kernel<<<grid_of(batch, hidden, threads), threads, 0, static_cast<cudaStream_t>(stream)>>>(
        h_with_h0, f, x, grad_h, grad_f, grad_x, grad_h0, int(seq_len), int(batch), int(hidden));
    check(cudaGetLastError(), what);
}

}  // namespace qrnn::cuda::bench
