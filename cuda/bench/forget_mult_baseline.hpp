// Benchmark baseline only, never used by the ops and not part of the library: the
// original pytorch-qrnn ForgetMult design, built into qrnn.bench._baseline so the GPU
// benchmark (python -m qrnn.bench cuda) measures the library's kernels against it in the
// same run. One thread per (batch, hidden) column, float32 only, 32-bit offsets, an output
// buffer of seq_len + 1 rows whose row 0 holds h0 and from which h[t-1] is re-read every
// step. Contiguous time-major arrays; `h_with_h0` is (seq_len + 1, batch, hidden). The
// backward writes grad_f, grad_x and grad_h0 (batch, hidden) from grad_h, carrying the
// running gradient in double. Launches on `stream` (a cudaStream_t) of `device`, made
// current for the launch.
#pragma once

#include <cstdint>

namespace qrnn::cuda::bench {

void baseline_forget_mult_forward(const float* f, const float* x, float* h_with_h0, int64_t seq_len, int64_t batch,
                                  int64_t hidden, void* stream, int device);
void baseline_forget_mult_backward(const float* f, const float* x, const float* h_with_h0, const float* grad_h,
                                   float* grad_f, float* grad_x, float* grad_h0, int64_t seq_len, int64_t batch,
                                   int64_t hidden, void* stream, int device);

}  // namespace qrnn::cuda::bench
