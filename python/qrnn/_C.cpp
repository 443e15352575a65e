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
#include "qrnn/qrnn_gates.hpp"

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

// ---- Fused QRNN gates (layers) ---------------------------------------------------
qrnn::ConstView2 cview2(uintptr_t p, const Strides2& s) { return {cptr(p), s[0], s[1]}; }
qrnn::View2 mview2(uintptr_t p, const Strides2& s) { return {mptr(p), s[0], s[1]}; }
const int64_t* lengths_ptr(uintptr_t p) { return reinterpret_cast<const int64_t*>(p); }

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

    // ---- Fused QRNN gates (layers): see cpp/include/qrnn/qrnn_gates.hpp --------------
    m.def("qrnn_gates_forward",
          [](int dtype, int64_t T, int64_t B, int64_t H, bool output_gate, uintptr_t gates, const Strides3& sg,
             int64_t gate_stride, uintptr_t mask, const Strides3& sm, double forget_scale, uintptr_t c0,
             const Strides2& sc0, int c0_dtype, uintptr_t lengths, int64_t lengths_stride, bool reverse,
             uintptr_t output, const Strides3& so, uintptr_t states, const Strides3& ss, uintptr_t c_n,
             const Strides2& scn, int c_n_dtype, int num_threads) {
              qrnn::QrnnGatesForwardParams p;
              p.seq_len = T;
              p.batch = B;
              p.hidden = H;
              p.dtype = to_dtype(dtype);
              p.output_gate = output_gate;
              p.gates = cview(gates, sg);
              p.gate_stride = gate_stride;
              p.forget_mask = cview(mask, sm);
              p.forget_scale = forget_scale;
              p.c0 = cview2(c0, sc0);
              p.c0_dtype = to_dtype(c0_dtype);
              p.lengths = lengths_ptr(lengths);
              p.lengths_stride = lengths_stride;
              p.reverse = reverse;
              p.output = mview(output, so);
              p.states = mview(states, ss);
              p.c_n = mview2(c_n, scn);
              p.c_n_dtype = to_dtype(c_n_dtype);
              py::gil_scoped_release release;
              qrnn::cpu::qrnn_gates_forward(p, num_threads);
          });

    m.def("qrnn_gates_backward",
          [](int dtype, int64_t T, int64_t B, int64_t H, bool output_gate, uintptr_t gates, const Strides3& sg,
             int64_t gate_stride, uintptr_t mask, const Strides3& sm, double forget_scale, uintptr_t c0,
             const Strides2& sc0, int c0_dtype, uintptr_t lengths, int64_t lengths_stride, bool reverse,
             uintptr_t states, const Strides3& ss, uintptr_t grad_output, const Strides3& sgo, uintptr_t grad_c_n,
             const Strides2& sgcn, int c_n_dtype, uintptr_t grad_gates, const Strides3& sgg,
             int64_t grad_gate_stride, uintptr_t grad_c0, const Strides2& sgc0, int num_threads) {
              qrnn::QrnnGatesBackwardParams p;
              p.seq_len = T;
              p.batch = B;
              p.hidden = H;
              p.dtype = to_dtype(dtype);
              p.output_gate = output_gate;
              p.gates = cview(gates, sg);
              p.gate_stride = gate_stride;
              p.forget_mask = cview(mask, sm);
              p.forget_scale = forget_scale;
              p.c0 = cview2(c0, sc0);
              p.c0_dtype = to_dtype(c0_dtype);
              p.lengths = lengths_ptr(lengths);
              p.lengths_stride = lengths_stride;
              p.reverse = reverse;
              p.states = cview(states, ss);
              p.grad_output = cview(grad_output, sgo);
              p.grad_c_n = cview2(grad_c_n, sgcn);
              p.c_n_dtype = to_dtype(c_n_dtype);
              p.grad_gates = mview(grad_gates, sgg);
              p.grad_gate_stride = grad_gate_stride;
              p.grad_c0 = mview2(grad_c0, sgc0);
              py::gil_scoped_release release;
              qrnn::cpu::qrnn_gates_backward(p, num_threads);
          });
}
