// qrnn.bench._baseline: the benchmark-only baseline kernels (cuda/bench/), a module of their
// own so that neither the library nor qrnn._C carries them. Tensors cross as integers (data
// pointers), the stream as a cudaStream_t integer.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "bench/forget_mult_baseline.hpp"

namespace {

const float* in(uintptr_t p) { return reinterpret_cast<const float*>(p); }
float* out(uintptr_t p) { return reinterpret_cast<float*>(p); }
void* stream_of(uintptr_t p) { return reinterpret_cast<void*>(p); }

}  // namespace

PYBIND11_MODULE(_baseline, m) {
    namespace bench = qrnn::cuda::bench;
    m.doc() = "the original one-thread-per-column float32 ForgetMult design, for the GPU benchmark only";
    m.def(
        "forget_mult_forward",
        [](uintptr_t f, uintptr_t x, uintptr_t h_with_h0, int64_t T, int64_t B, int64_t H, uintptr_t stream,
           int device) {
            bench::baseline_forget_mult_forward(in(f), in(x), out(h_with_h0), T, B, H, stream_of(stream), device);
        },
        "forget_mult_forward(f, x, h_with_h0, T, B, H, stream, device): h_with_h0 is (T + 1, B, H), row 0 = h0");
    m.def(
        "forget_mult_backward",
        [](uintptr_t f, uintptr_t x, uintptr_t h_with_h0, uintptr_t grad_h, uintptr_t grad_f, uintptr_t grad_x,
           uintptr_t grad_h0, int64_t T, int64_t B, int64_t H, uintptr_t stream, int device) {
            bench::baseline_forget_mult_backward(in(f), in(x), in(h_with_h0), in(grad_h), out(grad_f), out(grad_x),
                                                 out(grad_h0), T, B, H, stream_of(stream), device);
        },
        "forget_mult_backward(f, x, h_with_h0, grad_h, grad_f, grad_x, grad_h0, T, B, H, stream, device)");
}
