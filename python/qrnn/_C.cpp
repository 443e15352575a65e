// The one binding file: exposes the torch-free core to Python with pybind11.
// Tensors cross as (data pointer, strides) integers; this module never links libtorch,
// so one wheel serves every torch release. Every kernel call releases the GIL.
// std::invalid_argument from the core arrives in Python as ValueError.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>

#include "qrnn/build_info.hpp"
#include "qrnn/forget_mult.hpp"
#include "qrnn/forget_mult_cuda.hpp"

namespace py = pybind11;
using Strides3 = std::array<int64_t, 3>;  // element strides in (time, batch, hidden) order
using Strides2 = std::array<int64_t, 2>;  // (batch, hidden)

namespace {

const void* cptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
void* mptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
qrnn::ConstView3 cview(uintptr_t p, const Strides3& s) { return {cptr(p), s[0], s[1], s[2]}; }
qrnn::View3 mview(uintptr_t p, const Strides3& s) { return {mptr(p), s[0], s[1], s[2]}; }

qrnn::DType to_dtype(int code) {
    if (code < 0 || code > 3) throw std::invalid_argument("dtype code must be 0..3, got " + std::to_string(code));
    return static_cast<qrnn::DType>(code);
}

qrnn::ForgetMultForwardParams forward_params(int dtype, int64_t T, int64_t B, int64_t H,
                                             uintptr_t f, const Strides3& sf, uintptr_t x, const Strides3& sx,
                                             uintptr_t h0, const Strides2& sh0, int h0_dtype,
                                             uintptr_t h, const Strides3& sh) {
    qrnn::ForgetMultForwardParams p;
    p.seq_len = T;
    p.batch = B;
    p.hidden = H;
    p.dtype = to_dtype(dtype);
    p.f = cview(f, sf);
    p.x = cview(x, sx);
    p.h0 = {cptr(h0), sh0[0], sh0[1]};
    p.h0_dtype = to_dtype(h0_dtype);
    p.h = mview(h, sh);
    return p;
}

#if defined(QRNN_WITH_CUDA)
// ---- CUDA kernels (same argument order as the CPU functions, then stream and schedule) ----
qrnn::ForgetMultBackwardParams backward_params(int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f,
                                               const Strides3& sf, uintptr_t x, const Strides3& sx, uintptr_t h,
                                               const Strides3& sh, uintptr_t h0, const Strides2& sh0, int h0_dtype,
                                               uintptr_t grad_h, const Strides3& sgh, uintptr_t grad_f,
                                               const Strides3& sgf, uintptr_t grad_x, const Strides3& sgx,
                                               uintptr_t grad_h0, const Strides2& sgh0) {
    qrnn::ForgetMultBackwardParams p;
    p.seq_len = T;
    p.batch = B;
    p.hidden = H;
    p.dtype = to_dtype(dtype);
    p.f = cview(f, sf);
    p.x = cview(x, sx);
    p.h = cview(h, sh);
    p.h0 = {cptr(h0), sh0[0], sh0[1]};
    p.h0_dtype = to_dtype(h0_dtype);
    p.grad_h = cview(grad_h, sgh);
    p.grad_f = mview(grad_f, sgf);
    p.grad_x = mview(grad_x, sgx);
    p.grad_h0 = {mptr(grad_h0), sgh0[0], sgh0[1]};
    return p;
}

qrnn::cuda::Schedule to_schedule(int code) {
    if (code < 0 || code > 2) throw std::invalid_argument("schedule must be 0..2, got " + std::to_string(code));
    return static_cast<qrnn::cuda::Schedule>(code);
}

void bind_cuda(py::module_& m) {
    m.def("cuda_forget_mult_forward",
          [](int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f, const Strides3& sf, uintptr_t x,
             const Strides3& sx, uintptr_t h0, const Strides2& sh0, int h0_dtype, uintptr_t h, const Strides3& sh,
             uintptr_t stream, int schedule) {
              const auto p = forward_params(dtype, T, B, H, f, sf, x, sx, h0, sh0, h0_dtype, h, sh);
              py::gil_scoped_release release;
              qrnn::cuda::forget_mult_forward(p, mptr(stream), to_schedule(schedule));
          });
    m.def("cuda_forget_mult_backward",
          [](int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f, const Strides3& sf, uintptr_t x,
             const Strides3& sx, uintptr_t h, const Strides3& sh, uintptr_t h0, const Strides2& sh0, int h0_dtype,
             uintptr_t grad_h, const Strides3& sgh, uintptr_t grad_f, const Strides3& sgf, uintptr_t grad_x,
             const Strides3& sgx, uintptr_t grad_h0, const Strides2& sgh0, uintptr_t stream, int schedule) {
              const auto p = backward_params(dtype, T, B, H, f, sf, x, sx, h, sh, h0, sh0, h0_dtype, grad_h, sgh,
                                             grad_f, sgf, grad_x, sgx, grad_h0, sgh0);
              py::gil_scoped_release release;
              qrnn::cuda::forget_mult_backward(p, mptr(stream), to_schedule(schedule));
          });
    // (vector_width, chunks) the calls above would launch: host-only, for tests and benchmarks.
    m.def("cuda_forget_mult_forward_plan",
          [](int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f, const Strides3& sf, uintptr_t x,
             const Strides3& sx, uintptr_t h0, const Strides2& sh0, int h0_dtype, uintptr_t h, const Strides3& sh,
             int schedule) {
              const auto plan = qrnn::cuda::forget_mult_forward_plan(
                  forward_params(dtype, T, B, H, f, sf, x, sx, h0, sh0, h0_dtype, h, sh), to_schedule(schedule));
              return py::make_tuple(plan.vector_width, plan.chunks);
          });
    m.def("cuda_forget_mult_backward_plan",
          [](int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f, const Strides3& sf, uintptr_t x,
             const Strides3& sx, uintptr_t h, const Strides3& sh, uintptr_t h0, const Strides2& sh0, int h0_dtype,
             uintptr_t grad_h, const Strides3& sgh, uintptr_t grad_f, const Strides3& sgf, uintptr_t grad_x,
             const Strides3& sgx, uintptr_t grad_h0, const Strides2& sgh0, int schedule) {
              const auto plan = qrnn::cuda::forget_mult_backward_plan(
                  backward_params(dtype, T, B, H, f, sf, x, sx, h, sh, h0, sh0, h0_dtype, grad_h, sgh, grad_f, sgf,
                                  grad_x, sgx, grad_h0, sgh0),
                  to_schedule(schedule));
              return py::make_tuple(plan.vector_width, plan.chunks);
          });
    // The original one-thread-per-column float32 design, for the GPU benchmark only.
    m.def("cuda_baseline_forget_mult_forward",
          [](uintptr_t f, uintptr_t x, uintptr_t h_with_h0, int64_t T, int64_t B, int64_t H, uintptr_t stream) {
              py::gil_scoped_release release;
              qrnn::cuda::bench::baseline_forget_mult_forward(
                  static_cast<const float*>(cptr(f)), static_cast<const float*>(cptr(x)),
                  static_cast<float*>(mptr(h_with_h0)), T, B, H, mptr(stream));
          });
    m.def("cuda_baseline_forget_mult_backward",
          [](uintptr_t f, uintptr_t x, uintptr_t h_with_h0, uintptr_t grad_h, uintptr_t grad_f, uintptr_t grad_x,
             uintptr_t grad_h0, int64_t T, int64_t B, int64_t H, uintptr_t stream) {
              py::gil_scoped_release release;
              qrnn::cuda::bench::baseline_forget_mult_backward(
                  static_cast<const float*>(cptr(f)), static_cast<const float*>(cptr(x)),
                  static_cast<const float*>(cptr(h_with_h0)), static_cast<const float*>(cptr(grad_h)),
                  static_cast<float*>(mptr(grad_f)), static_cast<float*>(mptr(grad_x)),
                  static_cast<float*>(mptr(grad_h0)), T, B, H, mptr(stream));
          });
}
#endif  // QRNN_WITH_CUDA

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "torch-free kernels of torch-qrnn (pointers and strides in, nothing allocated)";

    m.def("forget_mult_forward",
          [](int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f, const Strides3& sf, uintptr_t x,
             const Strides3& sx, uintptr_t h0, const Strides2& sh0, int h0_dtype, uintptr_t h,
             const Strides3& sh, int num_threads) {
              const auto p = forward_params(dtype, T, B, H, f, sf, x, sx, h0, sh0, h0_dtype, h, sh);
              py::gil_scoped_release release;
              qrnn::cpu::forget_mult_forward(p, num_threads);
          });

    m.def("forget_mult_backward",
          [](int dtype, int64_t T, int64_t B, int64_t H, uintptr_t f, const Strides3& sf, uintptr_t x,
             const Strides3& sx, uintptr_t h, const Strides3& sh, uintptr_t h0, const Strides2& sh0,
             int h0_dtype, uintptr_t grad_h, const Strides3& sgh, uintptr_t grad_f, const Strides3& sgf,
             uintptr_t grad_x, const Strides3& sgx, uintptr_t grad_h0, const Strides2& sgh0, int num_threads) {
              qrnn::ForgetMultBackwardParams p;
              p.seq_len = T;
              p.batch = B;
              p.hidden = H;
              p.dtype = to_dtype(dtype);
              p.f = cview(f, sf);
              p.x = cview(x, sx);
              p.h = cview(h, sh);
              p.h0 = {cptr(h0), sh0[0], sh0[1]};
              p.h0_dtype = to_dtype(h0_dtype);
              p.grad_h = cview(grad_h, sgh);
              p.grad_f = mview(grad_f, sgf);
              p.grad_x = mview(grad_x, sgx);
              p.grad_h0 = {mptr(grad_h0), sgh0[0], sgh0[1]};
              py::gil_scoped_release release;
              qrnn::cpu::forget_mult_backward(p, num_threads);
          });

    m.def("build_info", [] {
        const qrnn::BuildInfo info = qrnn::build_info();
        py::dict d;
        d["version"] = info.version;
        d["compiler"] = info.compiler;
        d["build_type"] = info.build_type;
        d["simd"] = info.simd;
        d["cuda"] = info.cuda;
        d["cuda_architectures"] = info.cuda_architectures;
        return d;
    });

#if defined(QRNN_WITH_CUDA)
    bind_cuda(m);
#endif
}
